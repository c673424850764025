"""The simulated runtime: a scenario's containers of one node, on a scaled wall clock.

It lets the whole live system run without Docker or torch: the worker hosts
simulated containers whose finished batches go out on NATS exactly as a real
inference container's would (the worker wires `on_batch` to the publisher),
and it applies limits and reads CPU counters through the same `Runtime`
interface as Docker. Physics, placement and noise streams are the
simulator's (`SimNode`, `place`, one random stream per (seed, container)), so a
live run and a virtual-time run of the same scenario and seed meet the same
batches.

Time: the runtime's clock is scenario seconds, `(wall - start) * time_scale`;
the worker runs its controller on this clock (`now_s`).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Any

from shared.aio import wait_event
from shared.core.profiles import ModelProfile
from shared.runtime.base import RuntimeContainer, RuntimeEvent, RuntimeFailure, Throttling
from shared.scenarios.placement import place
from shared.scenarios.spec import ContainerSpec, Scenario
from shared.sim.physics import BatchDone, SimNode

log = logging.getLogger(__name__)


class SimRuntime:
    """Simulated containers of one scenario node, advancing in (scaled) real time."""

    def __init__(
        self,
        node: str,
        scenario: Scenario,
        seed: int = 1,
        *,
        time_scale: float = 1.0,
        on_batch: Callable[[BatchDone], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_at: float | None = None,
    ) -> None:
        """`start_at`: the wall time (on `clock`) at which scenario time 0 falls, so
        several workers share one scenario clock; default: when `start()` runs."""
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        try:
            spec = scenario.node(node)
        except KeyError:
            names = ", ".join(n.name for n in scenario.nodes)
            raise RuntimeFailure(
                f"node {node!r} is not in scenario {scenario.name} (nodes: {names})"
            ) from None
        self.node = node
        self.cores = spec.cores
        self.scenario = scenario
        self.seed = seed
        self.time_scale = time_scale
        self.on_batch = on_batch
        self._clock = clock
        self._t0: float | None = start_at
        self._sim = SimNode(node, spec.cores, spells=scenario.spells_of(node, seed))
        placement = place(scenario)
        self._specs = {c.name: c for c in scenario.containers if placement[c.name] == node}
        self._timeline: list[tuple[float, int, str]] = []
        for c in self._specs.values():
            self._timeline.append((c.submit_at_s, 1, c.name))
            if c.duration_s is not None:
                self._timeline.append((c.submit_at_s + c.duration_s, 0, c.name))
        heapq.heapify(self._timeline)
        self._finished: set[str] = set()
        self._unmanaged: set[str] = set()
        self._subs: set[asyncio.Queue[RuntimeEvent | None]] = set()
        self._closed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- clock ----------------------------------------------------------------

    def now_s(self) -> float:
        """Scenario seconds; negative before the shared start."""
        if self._t0 is None:
            return 0.0
        return (self._clock() - self._t0) * self.time_scale

    def expected(self) -> list[str]:
        """Containers of this node not submitted yet (objectives may be set ahead)."""
        return sorted(
            n for n in self._specs if n not in self._sim.containers and n not in self._finished
        )

    def latency_curve(self, name: str) -> ModelProfile | None:
        """Every simulated container's true curve (what makes the oracle possible here)."""
        c = self._specs.get(name)
        return None if c is None else self.scenario.profile_of(c)

    # -- Runtime interface ------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        if self._t0 is None:
            self._t0 = self._clock()
        self._task = asyncio.create_task(self._run(), name=f"sim-runtime-{self.node}")

    async def containers(self) -> list[RuntimeContainer]:
        self._advance(self.now_s())
        return [
            self._describe(self._specs[n]) for n in self._sim.containers if n not in self._unmanaged
        ]

    async def cpu_totals_s(self) -> dict[str, float]:
        self._advance(self.now_s())
        return {n: v for n, v in self._sim.cpu_totals().items() if n not in self._unmanaged}

    async def throttling(self) -> dict[str, Throttling]:
        """Not modelled: the simulated physics has no CFS periods (nothing measured)."""
        return {}

    async def set_limit(self, name: str, limit: float | None) -> float | None:
        if name not in self._sim.containers or name in self._unmanaged:
            raise RuntimeFailure(f"no running managed simulated container {name!r} on {self.node}")
        if limit is not None and not (math.isfinite(limit) and 0 < limit <= 1):
            raise RuntimeFailure(f"limit must be a fraction of the node in (0, 1], got {limit!r}")
        now = self.now_s()
        self._dispatch(self._sim.set_limit(name, limit, now))
        self._wake.set()
        return limit

    def events(self) -> _Events:
        """Events from now on (each call is its own subscription; close() ends them all)."""
        return _Events(self)

    async def close(self) -> None:
        """Stop the physics; the simulated containers end with it (the runtime owns them)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._closed = True
        for name in list(self._sim.containers):
            self._sim.remove(name, self.now_s())
        for q in self._subs:
            q.put_nowait(None)

    # -- containers started and stopped from outside the scenario ----------------

    async def add(
        self,
        spec: ContainerSpec,
        *,
        profile: ModelProfile | None = None,
        managed: bool = True,
    ) -> None:
        """Start a container now (not from the scenario's timeline).

        An unmanaged one (no `dqoes.managed` label) competes for the CPU but is
        never listed, measured or limited, like any other container on a node.
        """
        if spec.name in self._sim.containers:
            raise RuntimeFailure(f"simulated container {spec.name!r} already runs on {self.node}")
        now = self.now_s()
        self._advance(now)
        self._specs[spec.name] = spec
        prof = profile or self.scenario.profile_of(spec)
        if not managed:
            self._unmanaged.add(spec.name)
        limit = None if spec.cpus is None else spec.cpus / self.cores
        self._sim.add(
            spec.name,
            prof,
            now,
            random.Random(f"noise:{self.seed}:{spec.name}"),
            self.scenario.noise_sigma,
            limit,
            self.scenario.noise_rho,
        )
        if managed:
            self._emit(RuntimeEvent("started", self._describe(spec)))
        self._wake.set()

    async def stop(self, name: str) -> None:
        """Stop a running container now."""
        if name not in self._sim.containers:
            raise RuntimeFailure(f"no running simulated container {name!r} on {self.node}")
        now = self.now_s()
        self._advance(now)
        self._dispatch(self._sim.remove(name, now))
        self._finished.add(name)
        if name in self._unmanaged:
            self._unmanaged.discard(name)
        else:
            self._emit(RuntimeEvent("stopped", self._describe(self._specs[name])))
        self._wake.set()

    def running(self, name: str) -> bool:
        return name in self._sim.containers

    def limit_cores(self, name: str) -> float | None:
        """The quota the simulated kernel enforces, in cores (None: none)."""
        limit = self._sim.containers[name].limit
        return None if limit is None else limit * self.cores

    def _emit(self, ev: RuntimeEvent) -> None:
        for q in self._subs:
            q.put_nowait(ev)

    # -- internals --------------------------------------------------------------

    def _describe(self, c: ContainerSpec) -> RuntimeContainer:
        sc = self._sim.containers.get(c.name)
        return RuntimeContainer(
            name=c.name,
            id=c.name,
            node=self.node,
            limit=sc.limit if sc else None,
            objective_s=c.objective_s,
            alpha=c.alpha,
            model=c.model,
            labels={"dqoes.managed": "true", "dqoes.model": c.model},
        )

    def _dispatch(self, done: list[BatchDone]) -> None:
        if self.on_batch is None:
            return
        for b in done:
            try:
                self.on_batch(b)
            except Exception as e:  # a publisher failure must not stop the physics
                log.warning("on_batch failed for %s: %r", b.container, e)

    def _advance(self, now: float) -> None:
        """Run submissions/finishes and the physics up to `now`, in time order."""
        while self._timeline and self._timeline[0][0] <= now:
            at, kind, name = heapq.heappop(self._timeline)
            self._dispatch(self._sim.advance(at))
            spec = self._specs[name]
            if kind == 1:
                limit = None if spec.cpus is None else spec.cpus / self.cores
                self._sim.add(
                    name,
                    self.scenario.profile_of(spec),
                    at,
                    random.Random(f"noise:{self.seed}:{name}"),
                    self.scenario.noise_sigma,
                    limit,
                    self.scenario.noise_rho,
                )
                self._emit(RuntimeEvent("started", self._describe(spec)))
            elif name in self._sim.containers:
                self._dispatch(self._sim.remove(name, at))
                self._finished.add(name)
                self._emit(RuntimeEvent("stopped", self._describe(spec)))
        self._dispatch(self._sim.advance(now))

    async def _run(self) -> None:
        while True:
            now = self.now_s()
            self._advance(now)
            nxt = min(
                self._sim.next_event_s(), self._timeline[0][0] if self._timeline else math.inf
            )
            wait_s = 1.0 if math.isinf(nxt) else max(0.0, (nxt - self.now_s()) / self.time_scale)
            self._wake.clear()
            await wait_event(self._wake, min(wait_s, 1.0))


class _Events:
    """One subscription to a SimRuntime's events; ends when the runtime closes."""

    def __init__(self, rt: SimRuntime) -> None:
        self._rt = rt
        self._queue: asyncio.Queue[RuntimeEvent | None] = asyncio.Queue()
        if rt._closed:
            self._queue.put_nowait(None)
        rt._subs.add(self._queue)

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> RuntimeEvent:
        ev = await self._queue.get()
        if ev is None:
            self._rt._subs.discard(self._queue)
            raise StopAsyncIteration
        return ev

    async def aclose(self) -> None:
        self._rt._subs.discard(self._queue)
