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
from collections.abc import AsyncIterator, Callable
from typing import Any

from shared.runtime.base import RuntimeContainer, RuntimeEvent, RuntimeFailure
from shared.sim.physics import BatchDone, SimNode
from shared.sim.placement import place
from shared.sim.scenario import ContainerSpec, Scenario

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
            raise RuntimeFailure(f"node {node!r} is not in scenario {scenario.name} (nodes: {names})") from None
        self.node = node
        self.cores = spec.cores
        self.scenario = scenario
        self.seed = seed
        self.time_scale = time_scale
        self.on_batch = on_batch
        self._clock = clock
        self._t0: float | None = start_at
        self._sim = SimNode(node, spec.cores)
        placement = place(scenario)
        self._specs = {c.name: c for c in scenario.containers if placement[c.name] == node}
        self._timeline: list[tuple[float, int, str]] = []
        for c in self._specs.values():
            self._timeline.append((c.submit_at_s, 1, c.name))
            if c.duration_s is not None:
                self._timeline.append((c.submit_at_s + c.duration_s, 0, c.name))
        heapq.heapify(self._timeline)
        self._finished: set[str] = set()
        self._events: asyncio.Queue[RuntimeEvent] = asyncio.Queue()
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
        return sorted(n for n in self._specs if n not in self._sim.containers and n not in self._finished)

    # -- Runtime interface ------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            return
        if self._t0 is None:
            self._t0 = self._clock()
        self._task = asyncio.create_task(self._run(), name=f"sim-runtime-{self.node}")

    async def containers(self) -> list[RuntimeContainer]:
        self._advance(self.now_s())
        return [self._describe(self._specs[n]) for n in self._sim.containers]

    async def cpu_totals_s(self) -> dict[str, float]:
        self._advance(self.now_s())
        return self._sim.cpu_totals()

    async def set_limit(self, name: str, limit: float | None) -> float | None:
        if name not in self._sim.containers:
            raise RuntimeFailure(f"no running simulated container {name!r} on {self.node}")
        if limit is not None and not (math.isfinite(limit) and 0 < limit <= 1):
            raise RuntimeFailure(f"limit must be a fraction of the node in (0, 1], got {limit!r}")
        now = self.now_s()
        self._dispatch(self._sim.set_limit(name, limit, now))
        self._wake.set()
        return limit

    async def events(self) -> AsyncIterator[RuntimeEvent]:
        while True:
            yield await self._events.get()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

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
                    name, self.scenario.profile_of(spec), at, random.Random(f"noise:{self.seed}:{name}"),
                    self.scenario.noise_sigma, limit,
                )
                self._events.put_nowait(RuntimeEvent("started", self._describe(spec)))
            elif name in self._sim.containers:
                self._dispatch(self._sim.remove(name, at))
                self._finished.add(name)
                self._events.put_nowait(RuntimeEvent("stopped", self._describe(spec)))
        self._dispatch(self._sim.advance(now))

    async def _run(self) -> None:
        while True:
            now = self.now_s()
            self._advance(now)
            nxt = min(self._sim.next_event_s(), self._timeline[0][0] if self._timeline else math.inf)
            wait_s = 1.0 if math.isinf(nxt) else max(0.0, (nxt - self.now_s()) / self.time_scale)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=min(wait_s, 1.0))
            except TimeoutError:
                pass
