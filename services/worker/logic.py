"""The worker's logic: events in (latencies, objectives, container start/stop), rounds out.

The control itself is `shared.core.controller.NodeController`; the worker only
turns bus messages and runtime events into controller calls, applies the
limits a round decides through the runtime, and says what happened (a
decision per round, the node's state periodically). It never imports NATS or
Docker: publishing is a function it is given, the runtime an interface.

`Worker` is built in layers, a module each, so that each reads on its own:
base.py (its tables, its policy, `dqoes control`), governing.py (objectives
and containers), reporting.py (the node state), rounds.py (a round and its
limits), and this module on top: latency events in, and the loops that run
rounds and publish the state. Every layer logs under this module's name, so a
filter on it keeps every line of the worker's logic.
"""

from __future__ import annotations

import math
from pathlib import Path

from services.worker.base import log
from services.worker.rounds import Rounds
from shared import subjects
from shared.aio import wait_event
from shared.core.controller import finished_on_clock
from shared.core.objectives import BatchWindow
from shared.core.types import workload_of
from shared.latency.spec import DEFAULT_WINDOW_S
from shared.runtime.base import RuntimeFailure
from shared.schema import LatencyEvent


class Worker(Rounds):
    """One node's controller, wired to a runtime and a publish function."""

    # -- events ---------------------------------------------------------------

    async def start(self) -> None:
        """Take over a started runtime's containers (the app starts it, to learn its cores first)."""
        # Subscribe before listing, so a container starting in between is not missed.
        self._events = self.runtime.events()
        for c in await self.runtime.containers():
            self._add(c)
        self.wake.set()

    def on_latencies(self, msgs: list[tuple[str, LatencyEvent]]) -> None:
        """A batch of (subject, latency event) pairs, in arrival order (the bus's batch subscription).

        A container speaks only for itself: the subject (`dqoes.latency.<node>.<container>`) is what
        its identity may publish on, the body only repeats it. An event whose body names another
        container (a container making a sibling look slow, to take its CPU) is dropped, counted in
        `forged_latencies` and logged at a bounded rate.
        """
        skip = len(self._latency_prefix)
        on_latency = self.on_latency
        for subject, m in msgs:
            said = subject[skip:]
            name = m.container
            if said == name or said == subjects.token(name, "container"):
                on_latency(m)
                continue
            self.forged_latencies += 1
            self.refusals.log("forged", "latency event dropped: sent on %s but names container %r "
                              "(a container speaks only for itself)", subject, name)

    def on_latency(self, msg: LatencyEvent) -> None:
        self.latencies += 1
        ctrl = self.ctrl
        name = msg.container
        if name not in ctrl.containers:
            # A container that does not know its name reports under its hostname,
            # which Docker sets to the short id.
            name = self.by_id.get(name[:12], name) if len(name) >= 12 else name
        if name in self.polled:  # its labels say where its latency is read: not here
            self.ignored_latencies += 1
            return
        cpu_s = msg.cpu_s or None  # 0.0: the container did not measure it
        # Stamped when it finished (the workload's clock is this host's): read late, after a round, it
        # still ran under the limit before that round.
        wall_s, now_s, finished_at = self.wall(), self.clock(), msg.finished_at
        lag_s = None if finished_at is None else wall_s - finished_at
        finished_s = finished_on_clock(now_s, lag_s, self.time_scale)
        latency_s = msg.latency_s
        window = self.windows.get(name)
        if window is not None and msg.node == self.node:
            latency_s = self._window_percentile(name, window, finished_s, latency_s)
        if msg.node != self.node or not ctrl.record_latency(name, latency_s, finished_s, cpu_s,
                                                            workload_of(msg.model, msg.images),
                                                            follows_limit=msg.follows_limit):
            self.ignored_latencies += 1
            return
        self.last_batch_at[name] = wall_s if finished_at is None else finished_at
        if msg.model and not self.models.get(name):
            self.models[name] = msg.model
        if ctrl.due(now_s):
            self.wake.set()

    def _window_percentile(self, name: str, window: BatchWindow, at_s: float, latency_s: float) -> float:
        """A batch of a container with a percentile objective: the percentile of its batches over the
        window, this one included, is the latency the controller sees (the same shape: one number
        against the objective)."""
        o = self.resolved[name].objective
        if o is None or o.percentile is None:
            return latency_s
        window_s = o.window_s or DEFAULT_WINDOW_S  # on the controller clock, like the latencies
        window.add(at_s, latency_s, window_s)
        p = window.percentile(at_s, o.percentile, window_s)
        return latency_s if p is None else p

    def on_polled(self, name: str, latency_s: float, window_s: float | None = None,
                  rate_per_s: float | None = None) -> bool:
        """A percentile the worker read itself (a polled source), one per window of `window_s` ending
        now, with the requests a second served in it where the source counts them."""
        now_s = self.clock()
        if not self.ctrl.record_latency(name, latency_s, now_s, span_s=window_s, rate_per_s=rate_per_s):
            return False
        self.last_batch_at[name] = self.wall()
        if self.ctrl.due(now_s):
            self.wake.set()
        return True

    # -- loops ------------------------------------------------------------------

    def wait_s(self) -> float:
        """Wall seconds until something is due (a round or a state publication)."""
        now = self.clock()
        round_in = (self.ctrl.next_round_at_s - now) / self.time_scale if self.ctrl.managed else math.inf
        state_in = self._next_state_wall - self.wall()
        training_in = self.training.wait_s(self.time_scale) if self.training is not None else math.inf
        return max(0.0, min(round_in, state_in, training_in))

    async def announce(self, grace_s: float = 0.5) -> None:
        """Say who is here before the first round, so a restarted worker has its objectives at once.

        The node state goes out first; the manager answers with every stored
        objective this node's containers lack; they usually arrive within
        milliseconds. After a crash (`restarted`), the first round waits for
        the first of them at most `grace_s` wall seconds.
        """
        await self.publish(subjects.state(self.node), self.node_state())
        self._next_state_wall = self.wall() + self.state_interval_s
        if self.restarted and self.ctrl.containers and not self.assigned:
            await wait_event(self._objective_arrived, grace_s)

    async def run(self) -> None:
        await self.announce()
        while not self._stopping:
            await self.step()
            self.wake.clear()
            await wait_event(self.wake, self.wait_s())

    async def follow_runtime(self) -> None:
        async for ev in self._events:
            self.on_runtime_event(ev)

    def stop(self) -> None:
        self._stopping = True
        self.wake.set()

    async def on_stop(self, mode: str) -> None:
        """A clean stop: `keep` leaves the limits in force, `restore` gives each container
        back the limit it had before this node's worker first saw it (None: no limit)."""
        if mode == "restore":
            present = {c.name for c in await self.runtime.containers()}
            for name, limit in self.originals.items():
                if name not in present:
                    continue
                try:
                    await self.runtime.set_limit(name, limit)
                except RuntimeFailure as e:
                    log.warning("limit of %s not restored: %s", name, e)
                    continue
                log.info("limit of %s restored to %s", name, "none" if limit is None else f"{limit:g}")
            self.originals.clear()
            if self.originals_file:
                Path(self.originals_file).unlink(missing_ok=True)
        else:
            # The limits in force are this node's: the originals file stays, so that a worker started
            # next (a rolling restart) adopts them and a later `restore` still knows the true originals.
            log.info("limits left as they are (--on-stop keep)")

