"""The worker's logic: events in (latencies, objectives, container start/stop), rounds out.

The control itself is `shared.core.controller.NodeController`; this module only
turns bus messages and runtime events into controller calls, applies the
limits a round decides through the runtime, and says what happened (a
decision per round, the node's state periodically). It never imports NATS or
Docker: publishing is a function it is given, the runtime an interface.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from services.worker.training import TrainingSide, is_training
from shared import subjects
from shared.aio import wait_event
from shared.core.controller import NodeController, finished_on_clock
from shared.core.guard import throttled_share
from shared.core.objectives import BatchWindow, Objective, Resolved, resolve
from shared.core.policy import Policy, numeric_params, unknown_params
from shared.core.types import Cls, Decision, classify, workload_of
from shared.latency.spec import DEFAULT_WINDOW_S
from shared.ratelog import RateLimitedLog
from shared.runtime.base import Runtime, RuntimeContainer, RuntimeEvent, RuntimeFailure, Throttling
from shared.schema import (
    ContainerState,
    ControlMsg,
    ControlReply,
    DecisionMsg,
    LatencyEvent,
    Message,
    NodeState,
    ObjectiveAssign,
    ServiceObjective,
)

log = logging.getLogger(__name__)

Publish = Callable[[str, Message], Awaitable[None]]

STALE_MIN_S = 30.0
"""A managed container with no batch for this many wall seconds (or STALE_OBJECTIVES objectives) is stale."""
STALE_OBJECTIVES = 5.0


class Worker:
    """One node's controller, wired to a runtime and a publish function."""

    def __init__(
        self,
        node: str,
        runtime: Runtime,
        controller: NodeController,
        publish: Publish,
        *,
        state_interval_s: float = 2.0,
        wall: Callable[[], float] = time.time,
        training: TrainingSide | None = None,
        originals_file: str | None = None,
        params_file: str | None = None,
        params_key: Mapping[str, Any] | None = None,
        policy_factory: Callable[[str], Policy] | None = None,
    ) -> None:
        self.node = node
        self.policy_factory = policy_factory
        """Builds a registered policy by name for `dqoes control policy=NAME` (ValueError: refused;
        None: this worker cannot switch)."""
        self.switched_to: str | None = None
        """The policy `dqoes control` switched this node to (restored ones included); None: its own."""
        self.params_file = params_file
        """Where what `dqoes control` changed is kept, so that a restarted worker keeps it (None: not)."""
        self.params_key = json.loads(json.dumps(dict(params_key or {}), default=str))  # as the file has it
        """The configuration the changes were made on (policy and flags): see `restored_params`."""
        self.controlled: dict[str, float] = {}
        """Every parameter `dqoes control` changed on this node (restored ones included), by name."""
        self.originals_file = originals_file
        """Where the limits containers had before this node's worker first saw them are kept, so a
        worker restarted after a crash still knows them (`restore_limits`, --on-stop restore)."""
        self.originals: dict[str, float | None] = _load_originals(originals_file)
        self.restarted = bool(self.originals)
        """The last worker of this node left limits in force (it crashed, or stopped with `keep`): its
        originals file is still there, and the first round waits for the stored objectives."""
        self.training = training
        """Training containers (label dqoes.kind=training) and their policy; None: this worker has none."""
        self.runtime = runtime
        self.ctrl = controller
        self.publish = publish
        self.state_interval_s = state_interval_s
        self.wall = wall
        self.clock: Callable[[], float] = runtime.now_s
        self.time_scale: float = runtime.time_scale
        self.models: dict[str, str | None] = {}
        self.by_id: dict[str, str] = {}
        self.assigned: dict[str, ObjectiveAssign] = {}
        self.label_objectives: dict[str, tuple[float | None, float | None]] = {}
        self.service_objectives: dict[str, ServiceObjective] = {}
        """Objectives for services (selector -> the manager's hand-over): every matching container."""
        self.labels: dict[str, Mapping[str, str]] = {}
        self.resolved: dict[str, Resolved] = {}
        """The objective governing each container and where it comes from (own > service > label)."""
        self.windows: dict[str, BatchWindow] = {}
        """Recent batches of containers with a percentile objective and NATS latency events."""
        self.request_rates: dict[str, float] = {}
        """Requests per second over each polled container's last window."""
        self.retuned: list[Callable[[str], None]] = []
        """Called with a container whose objective's percentile or window changed (the poller)."""
        self.rounds = 0
        self.latencies = 0
        self.ignored_latencies = 0
        self.forged_latencies = 0
        """Latency events dropped because the body named another container than the subject."""
        self._latency_prefix = subjects.latency_of_node(node)[:-1]
        self.limit_changes = 0
        self.round_observers: list[Callable[[float], None]] = []
        self.joined: list[Callable[[RuntimeContainer], None]] = []
        """Called with each inference container that joins (the latency poller reads its labels)."""
        self.left: list[Callable[[str], None]] = []
        """Called with the name of each inference container that leaves."""
        self.polled: set[str] = set()
        """Containers whose latency the worker reads itself (a `prometheus` or `promql` source): their
        NATS latency events are ignored, and only `unmeasured` makes them stale."""
        self.unmeasured: set[str] = set()
        """Polled containers whose source gave no value for its last window (unreachable, nothing in it)."""
        """Called with the wall seconds each round took (the metrics histogram)."""
        self.last_state: NodeState | None = None
        """The node state last published (immutable; what /metrics reads from its own thread)."""
        self.last_batch_at: dict[str, float] = {}
        self.throttled_ratio: dict[str, float] = {}
        self._throttle_prev: dict[str, Throttling] = {}
        self._release: set[str] = set()
        self.wake = asyncio.Event()
        self._stale_seen: dict[tuple[str, int], ObjectiveAssign] = {}
        self._objective_arrived = asyncio.Event()
        self.refusals = RateLimitedLog(log, logging.WARNING)
        """Refused control messages and objectives: one line per 5 s per kind, with a count."""
        self._next_state_wall = 0.0
        self._stopping = False
        restored_policy = restored_switch(params_file, self.params_key)
        if restored_policy:
            error = self._switch_policy(restored_policy)
            if error:
                log.warning("policy set by control in %s not restored: %s", params_file, error)
            else:
                log.info("restored the policy set by control before this worker started: %s", restored_policy)
        restored = restored_params(params_file, self.params_key)
        if restored:
            error = self._set_params(restored)
            if error:
                log.warning("parameters set by control in %s not restored: %s", params_file, error)
                Path(str(params_file)).unlink(missing_ok=True)
            else:
                self.controlled = restored
                log.info("restored the parameters set by control before this worker started: %s",
                         ", ".join(f"{k}={v:g}" for k, v in sorted(restored.items())))

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

    def on_objective(self, msg: ObjectiveAssign) -> None:
        """A hand-over from the manager; revisions only move forward, except when the manager insists.

        A lower revision than the one held is an old message arriving late and
        is ignored, once. The manager re-sends what its store holds while the
        worker reports something else, so the same lower revision arriving a
        second time means the store says so: the worker takes it (a revision
        from nowhere, such as a forged 2^62, cannot freeze an objective).
        """
        prev = self.assigned.get(msg.container)
        if prev is not None and msg.revision < prev.revision:
            key = (msg.container, msg.revision)
            if key not in self._stale_seen:
                self._stale_seen[key] = msg
                if len(self._stale_seen) > 4096:  # bounded: the oldest go first
                    del self._stale_seen[next(iter(self._stale_seen))]
                log.debug("ignoring stale objective for %s (revision %d < %d)",
                          msg.container, msg.revision, prev.revision)
                return
            self.refusals.log("objective-back", "objective for %s taken back to revision %d (held %d): "
                              "the manager's store says so", msg.container, msg.revision, prev.revision)
        self._stale_seen.pop((msg.container, msg.revision), None)
        self._objective_arrived.set()
        self.assigned[msg.container] = msg
        if msg.container in self.ctrl.containers:
            self._govern(msg.container)

    def on_service_objective(self, msg: ServiceObjective) -> None:
        """A service objective from the manager (None: taken back): every matching container, present
        and future, is governed by it unless it has its own. An older revision than the one held is
        ignored (the manager sends the current one again while this node reports another)."""
        prev = self.service_objectives.get(msg.selector)
        if prev is not None and msg.revision < prev.revision:
            return
        self._objective_arrived.set()
        if msg.objective_s is None:
            self.service_objectives.pop(msg.selector, None)
        else:
            self.service_objectives[msg.selector] = msg
        for name in list(self.ctrl.containers):
            self._govern(name)

    def on_control(self, msg: ControlMsg) -> ControlReply:
        """An operator's parameter read or change, checked against the policy in force.

        Names must be fields of the policy's parameters dataclass and values
        must pass its checks; otherwise nothing changes and the reply says
        why. A message that asks for nothing is a read.
        """
        asked = msg.asked()
        before = self.ctrl.policy
        switch = msg.policy is not None and msg.policy != before.name
        error = self._switch_policy(str(msg.policy)) if switch else ""
        if not error and asked:
            error = self._set_params(asked)
            if error and switch:  # nothing changes: the policy in force stays
                self.ctrl.policy = before
        if error:
            self.refusals.log("control", "control message refused: %s", error)
        elif asked or switch:
            if switch:
                self.switched_to = self.ctrl.policy.name
                self.controlled = {}  # parameters set on the policy before do not carry over
                log.info("policy now %s (was %s), set by control", self.ctrl.policy.name, before.name)
            self.controlled.update({k: float(v) for k, v in asked.items()})
            if self.params_file:
                _write_json(self.params_file, {"key": self.params_key, "changed": self.controlled,
                                               "policy": self.switched_to}, "the parameters set by control")
            self.ctrl.next_round_at_s = self.clock()
            self.wake.set()
        changed = () if error else tuple(sorted(asked)) + (("policy",) if switch else ())
        return ControlReply(node=self.node, policy=self.ctrl.policy.name, ok=not error, error=error,
                            params=self.params_in_force(), changed=changed)

    def _switch_policy(self, name: str) -> str:
        """Put the registered policy `name` in force from the next round; the error ("" if none)."""
        if self.policy_factory is None:
            return "this worker cannot switch policies"
        try:
            policy = self.policy_factory(name)
        except ValueError as e:
            return str(e)
        self.ctrl.policy = policy
        self.ctrl.next_round_at_s = self.clock()
        return ""

    def _set_params(self, asked: Mapping[str, float]) -> str:
        """Set the policy's parameters by name; the error ("" if none), and then nothing changes."""
        policy = self.ctrl.policy
        problem = unknown_params(policy.name, policy.params, asked)
        if problem:
            return problem
        try:
            current = dataclasses.asdict(policy.params)
            typed = {k: int(v) if isinstance(current[k], int) and not isinstance(current[k], bool)
                     and float(v).is_integer() else v for k, v in asked.items()}
            bad = [k for k in typed if isinstance(current[k], bool)]
            if bad:
                raise ValueError(f"{bad[0]} is a switch, not a number")
            params = dataclasses.replace(policy.params, **typed)
        except (ValueError, TypeError) as e:
            return str(e)
        policy.set_params(params)
        self.ctrl.next_round_at_s = self.clock()
        log.info("parameters now %s", params)
        return ""

    def params_in_force(self) -> dict[str, float]:
        return numeric_params(self.ctrl.policy.params)

    def on_runtime_event(self, ev: RuntimeEvent) -> None:
        if ev.kind == "started":
            self._add(ev.container)
        elif self.training is not None and self.training.remove(ev.container.name):
            pass
        else:
            name = ev.container.name
            # Nothing per container outlives it (1,000 starts and stops leave nothing behind).
            for table in (self.last_batch_at, self.throttled_ratio, self.models, self.label_objectives,
                          self.assigned, self.labels, self.resolved, self.windows, self.request_rates):
                table.pop(name, None)
            self.by_id.pop(ev.container.id[:12], None)
            for gone in self.left:
                gone(name)
            if self.originals.pop(name, None) is not None or self.originals_file:
                _save_originals(self.originals_file, self.originals)
            for key in [k for k in self._stale_seen if k[0] == name]:
                del self._stale_seen[key]
            if self.ctrl.remove(name, self.clock()):
                log.info("container %s left; its CPU is released", name)
        self.wake.set()

    def _add(self, c: RuntimeContainer) -> None:
        if self.training is not None and is_training(c):
            self.training.add(c)
            return
        if c.name in self.ctrl.containers:
            return
        if c.label_error:
            log.warning("container %s: %s (objective label ignored)", c.name, c.label_error)
        self.models[c.name] = c.model
        self.by_id[c.id[:12]] = c.name
        self.label_objectives[c.name] = (c.objective_s, c.alpha)
        self.labels[c.name] = dict(c.labels)
        if c.name not in self.originals:  # after a crash the file still has the true original
            self.originals[c.name] = c.limit
            _save_originals(self.originals_file, self.originals)
        self.ctrl.add(c.name, self.clock(), limit=_fraction(c.limit), workload=workload_of(c.model))
        self._govern(c.name, quiet=True)
        for joined in self.joined:
            joined(c)
        r = self.resolved.get(c.name)
        o = None if r is None else r.objective
        log.info("container %s joined (objective %s)", c.name,
                 "none" if o is None or r is None else f"{o.objective_s:g} s from its {r.source}"
                 + (f" {r.selector}" if r.selector else ""))

    def _objective_source(self, name: str) -> Literal["target", "label"]:
        """Where the objective in force comes from: "target" (the objective store, which wins: the
        container's own or its service's) or "label" (the container's dqoes.objective_s label)."""
        r = self.resolved.get(name)
        return "label" if r is None or r.source == "label" else "target"

    def _govern(self, name: str, *, quiet: bool = False) -> None:
        """Resolve which objective governs a container (own > service > label) and apply it."""
        a = self.assigned.get(name)
        own = None if a is None or a.objective_s is None else Objective(a.objective_s, a.alpha, a.percentile,
                                                                        a.window_s)
        services = {sel: Objective(m.objective_s, m.alpha, m.percentile, m.window_s)
                    for sel, m in self.service_objectives.items() if m.objective_s is not None}
        label_s, label_alpha = self.label_objectives.get(name, (None, None))
        label = None if label_s is None else Objective(label_s, label_alpha)
        r = resolve(own, services, self.labels.get(name, {}), label)
        prev = self.resolved.get(name)
        self.resolved[name] = r
        o = r.objective
        if o is not None and o.percentile is not None and name not in self.polled:
            self.windows.setdefault(name, BatchWindow())
        else:
            self.windows.pop(name, None)
        shape = None if o is None else (o.percentile, o.window_s)
        before = None if prev is None or prev.objective is None else (prev.objective.percentile,
                                                                       prev.objective.window_s)
        if prev is not None and shape != before:
            for retune in self.retuned:
                retune(name)
        self._set_objective(name, None if o is None else o.objective_s, None if o is None else o.alpha)

    def _set_objective(self, name: str, objective_s: float | None, alpha: float | None) -> None:
        was_managed = name in self.ctrl.containers and self.ctrl.containers[name].managed
        try:
            self.ctrl.set_objective(name, objective_s, self.clock(), alpha)
        except (KeyError, ValueError) as e:
            self.refusals.log("objective", "objective for %s refused: %s", name, e)
            return
        if was_managed and objective_s is None:
            # Unmanaged now: nothing will move its limit again, so release it.
            self._release.add(name)
            log.info("objective for %s cleared: unmanaged, its CPU limit is released", name)
        self.wake.set()

    # -- rounds -----------------------------------------------------------------

    async def step(self) -> Decision | None:
        """Run a round if one is due; publish the state if it is time. Returns the decision."""
        decision = None
        counters: dict[str, Throttling] | None = None
        if self._release:
            await self._release_limits()
        now = self.clock()
        if self.ctrl.managed and self.ctrl.due(now):
            started = time.perf_counter()
            totals = await self._cpu_totals()
            counters = await self._throttling()
            now, ran_at = self.clock(), self.wall()
            # Throttling lets the guard tell a container its limit holds back from one that only says so.
            decision = self.ctrl.run_round(now, totals, {n: (t.periods, t.throttled_periods)
                                                         for n, t in (counters or {}).items()})
            self.rounds += 1
            await self._apply(decision)
            took_s = time.perf_counter() - started
            for observe in self.round_observers:
                observe(took_s)
            await self.publish(subjects.decisions(self.node),
                               DecisionMsg.from_decision(decision, self.rounds, ran_at))
        state_due = decision is not None or self.wall() >= self._next_state_wall
        if self.training is not None:
            if await self.training.step(self.inference_reserved()) is None and state_due and self.training.jobs:
                await self.publish(subjects.training(self.node), self.training.state())
        if state_due:
            self._read_throttling(counters if decision is not None else await self._throttling())
            self.last_state = self.node_state()
            await self.publish(subjects.state(self.node), self.last_state)
            self._next_state_wall = self.wall() + self.state_interval_s
        return decision

    def inference_reserved(self) -> float:
        """The fraction of the node the inference containers hold: their limits, else their measured use."""
        total = 0.0
        for t in self.ctrl.containers.values():
            total += t.limit if t.limit is not None else (t.cpu_share or 0.0)
        return total

    async def _cpu_totals(self) -> dict[str, float]:
        try:
            return await self.runtime.cpu_totals_s()
        except RuntimeFailure as e:
            log.warning("could not read CPU counters: %s", e)
            return {}

    async def _release_limits(self) -> None:
        """Lift the limit of containers whose objective was cleared (still unmanaged)."""
        names, self._release = self._release, set()
        for name in names:
            t = self.ctrl.containers.get(name)
            if t is None or t.managed or t.limit is None:
                continue
            try:
                actual = await self.runtime.set_limit(name, None)
            except RuntimeFailure as e:
                log.warning("limit for %s not released: %s", name, e)
                continue
            old = t.limit
            self.ctrl.set_limit(name, _fraction(actual))
            self.limit_changes += 1
            log.info("limit of %s: %s -> %s cores (objective cleared)", name, self._cores(old), self._cores(actual))

    def _cores(self, limit: float | None) -> str:
        """A limit (fraction of the node) as cores, for a log line."""
        return "none" if limit is None else f"{limit * self.ctrl.cores:.2f}"

    async def _throttling(self) -> dict[str, Throttling] | None:
        """The runtime's cumulative throttling counters (None: it could not read them)."""
        try:
            return await self.runtime.throttling()
        except RuntimeFailure as e:
            log.debug("could not read throttling counters: %s", e)
            return None

    def _read_throttling(self, now: dict[str, Throttling] | None) -> None:
        """Throttled share of CFS periods since the previous reading, per container."""
        if now is None:
            return
        ratios: dict[str, float] = {}
        for name, t in now.items():
            prev = self._throttle_prev.get(name)
            share = throttled_share(None if prev is None else (prev.periods, prev.throttled_periods),
                                    (t.periods, t.throttled_periods))
            if share is not None:
                ratios[name] = share
        self._throttle_prev = now
        self.throttled_ratio = ratios

    def stale_containers(self) -> set[str]:
        """Managed containers with no batch for `stale_after(objective)` wall seconds.

        Threshold: STALE_MIN_S, or STALE_OBJECTIVES times its objective or its
        latest batch latency (in wall time), whichever is longest. Their limits are kept until they report again.
        A container whose latency the worker reads itself is stale while its source gives no value
        (`unmeasured`, services/worker/polling.py).
        """
        now = self.wall()
        out = {n for n in self.unmeasured if n in self.ctrl.containers and self.ctrl.containers[n].managed}
        for name, at in self.last_batch_at.items():
            t = self.ctrl.containers.get(name)
            if t is None or not t.managed or name in self.polled:  # a polled source says so itself
                continue
            # A slow container (class B) is not silent: its own batches count too.
            batch_wall_s = max(t.objective_s or 0.0, t.last_latency_s or 0.0, t.new_latency_s or 0.0) / self.time_scale
            if now - at > max(STALE_MIN_S, STALE_OBJECTIVES * batch_wall_s):
                out.add(name)
        return out

    async def _apply(self, d: Decision) -> None:
        changes = list(d.changes)
        stale = self.stale_containers() if changes else set()
        if stale:  # no news, no change: a stale container keeps the limit it has
            for c in changes:
                if c.name in stale:
                    self.ctrl.set_limit(c.name, c.old_limit)
            changes = [c for c in changes if c.name not in stale]
        if not changes:
            return
        self.limit_changes += len(changes)

        async def one(name: str, new: float | None, old: float | None) -> None:
            try:
                actual = await self.runtime.set_limit(name, new)
            except RuntimeFailure as e:
                log.warning("limit for %s not applied: %s", name, e)
                actual = old
            if actual != new:
                self.ctrl.set_limit(name, _fraction(actual))
            if actual != old:
                log.info("limit of %s: %s -> %s cores", name, self._cores(old), self._cores(actual))

        await asyncio.gather(*(one(c.name, c.new_limit, c.old_limit) for c in changes))

    def node_state(self) -> NodeState:
        d = self.ctrl.last_decision
        policy = self.ctrl.policy
        params = self.params_in_force()
        cores = self.ctrl.cores
        members: dict[str, list[str]] = {"G": [], "S": [], "B": [], "pending": []}
        used_total = 0.0
        states = []
        sums = {Cls.G: 0.0, Cls.S: 0.0, Cls.B: 0.0}
        stale = self.stale_containers()
        for t in self.ctrl.containers.values():
            # Class and slack from the latest batch, not the last round: a policy that runs a round
            # every minute or two would otherwise report old news between rounds.
            latest = t.new_latency_s or t.last_latency_s
            cls, slack = t.cls, t.slack_s
            if t.managed and latest is not None and t.objective_s is not None:
                alpha = policy.alpha if t.alpha is None else t.alpha
                cls, slack = classify(t.objective_s, latest, alpha), t.objective_s - latest
            if t.managed:
                # A stale container is reported pending: not met, not in band (its class is from old news).
                members["pending" if t.name in stale or not cls else cls.value].append(t.name)
                if cls is not None and slack is not None and t.name not in stale:
                    sums[cls] += slack
            used = None if t.cpu_share is None else t.cpu_share * cores
            used_total += used or 0.0
            met = None
            if t.managed and cls is not None:
                met = cls in (Cls.G, Cls.S) and t.name not in stale
            states.append(
                ContainerState(
                    container=t.name,
                    model=self.models.get(t.name),
                    objective_s=t.objective_s,
                    alpha=t.alpha,
                    latency_s=latest,
                    cls=cls if t.managed else None,
                    slack_s=slack if t.managed else None,
                    limit=t.limit,
                    cpu_share=t.cpu_share,
                    managed=t.managed,
                    met=met,
                    cpu_cores_used=used,
                    throttled_ratio=self.throttled_ratio.get(t.name),
                    last_batch_at=self.last_batch_at.get(t.name),
                    stale=t.name in stale,
                    objective_source=self._objective_source(t.name) if t.managed else None,
                    **self._objective_fields(t.name, t.managed),
                )
            )
        return NodeState(
            node=self.node,
            policy=policy.name,
            cores=self.ctrl.cores,
            round=self.rounds,
            at=self.wall(),
            interval_s=d.interval_s if d else policy.initial_interval_s,
            slack_sum_g_s=sums[Cls.G],
            slack_sum_b_s=sums[Cls.B],
            slack_sum_s_s=sums[Cls.S],
            satisfied=len(members["S"]),
            members={k: tuple(v) for k, v in members.items()},
            containers=tuple(states),
            expected=tuple(self.runtime.expected()),
            params=params,
            met=len(members["S"]) + len(members["G"]),
            # Each container's share is a mean since its own last reading: summed, readings taken at
            # different instants can pass the node by a hair, which no node can use.
            cpu_cores_used=min(cores, used_total),
            cpu_cores_idle=max(0.0, cores - used_total),
            service_objectives={sel: m.revision for sel, m in self.service_objectives.items()},
        )

    def _objective_fields(self, name: str, managed: bool) -> dict[str, Any]:
        """What a container's state says of its objective's kind (service, percentile) and its rate."""
        r = self.resolved.get(name)
        o = None if r is None or not managed else r.objective
        return {"objective_selector": None if o is None or r is None else r.selector,
                "percentile": None if o is None else o.percentile,
                "window_s": None if o is None else o.window_s,
                "request_rate_per_s": self.request_rates.get(name)}

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


def _load_originals(path: str | None) -> dict[str, float | None]:
    if not path:
        return {}
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(obj, dict):
        return {}
    return {str(k): (float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None)
            for k, v in obj.items()}


def _save_originals(path: str | None, originals: dict[str, float | None]) -> None:
    if path:
        _write_json(path, originals, "the original limits")


def _write_json(path: str, obj: Any, what: str) -> None:
    """Replace `path` with `obj` as JSON in one step (a crash leaves the old file or the new)."""
    tmp = Path(path + ".tmp")
    try:
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not keep %s in %s: %s", what, path, e)


def restored_switch(path: str | None, key: Mapping[str, Any]) -> str | None:
    """The policy `dqoes control` switched this node's last worker to, if it ran with the same
    configuration (as `restored_params`, which drops a file of another configuration); else None."""
    if not path or not Path(path).exists():
        return None
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # restored_params says why and drops it
    policy = obj.get("policy") if isinstance(obj, dict) and obj.get("key") == dict(key) else None
    return policy if isinstance(policy, str) and policy else None


def restored_params(path: str | None, key: Mapping[str, Any]) -> dict[str, float]:
    """What `dqoes control` changed on this node's last worker, if it ran with the same configuration.

    A restarted worker (a crash, a supervisor, a host reboot) keeps an operator's change. A worker
    started with another policy or other flags drops them: the new configuration is what its operator
    asked for last. Unreadable or malformed files are dropped with a warning."""
    if not path or not Path(path).exists():
        return {}
    try:
        obj = json.loads(Path(path).read_text())
        changed = obj["changed"]
        if not isinstance(changed, dict) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in changed.values()):
            raise ValueError("changed: expected numbers by name")
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("parameters set by control in %s not restored: %s", path, e)
        Path(path).unlink(missing_ok=True)
        return {}
    if obj.get("key") != dict(key):
        log.info("parameters set by control in %s dropped: the worker now runs with other flags", path)
        Path(path).unlink(missing_ok=True)
        return {}
    return {str(k): float(v) for k, v in changed.items()}


def _fraction(limit: float | None) -> float | None:
    """A runtime limit as the controller holds it (fractions in (0, 1])."""
    if limit is None or not math.isfinite(limit) or limit <= 0:
        return None
    return min(1.0, limit)
