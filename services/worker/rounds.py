"""A round of a node's worker: read the counters, run the controller, apply the limits it decides.

The control itself is `shared.core.controller.NodeController.run_round`; this
layer feeds it the runtime's CPU and throttling counters, applies each limit
change through the runtime (a stale container keeps the limit it has, a
container whose objective was cleared has its limit lifted), lets the training
side use what inference leaves, and publishes the decision and the node state.
"""

from __future__ import annotations

import asyncio
import time

from services.worker.base import as_fraction, log
from services.worker.reporting import Reporting
from shared import subjects
from shared.core.guard import throttled_share
from shared.core.types import Decision
from shared.runtime.base import RuntimeFailure, Throttling
from shared.schema import DecisionMsg


class Rounds(Reporting):
    """The worker's rounds: when one is due, run it and apply its limits."""

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
            self.ctrl.set_limit(name, as_fraction(actual))
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
                self.ctrl.set_limit(name, as_fraction(actual))
            if actual != old:
                log.info("limit of %s: %s -> %s cores", name, self._cores(old), self._cores(actual))

        await asyncio.gather(*(one(c.name, c.new_limit, c.old_limit) for c in changes))

