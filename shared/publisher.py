"""Publishing batch latencies: what every inference container does after each batch.

One place builds the `LatencyEvent` and its subject, used by the real
inference workload (`services/inference`) and by the simulated runtime the
worker hosts, so a simulated container's events are byte-for-byte what a real
one sends.
"""

from __future__ import annotations

import asyncio
import logging
import time

from shared import subjects
from shared.bus import Bus
from shared.schema import LatencyEvent

log = logging.getLogger(__name__)


class LatencyPublisher:
    """Publishes one container node's batch latencies on `dqoes.latency.<node>.<container>`."""

    def __init__(self, bus: Bus, node: str) -> None:
        subjects.validate_id(node, "node")
        self.bus = bus
        self.node = node
        self.published = 0
        self._queue: asyncio.Queue[LatencyEvent] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def event(
        self,
        container: str,
        latency_s: float,
        images: int,
        batch: int,
        *,
        cpu_s: float = 0.0,
        model: str | None = None,
        finished_at: float | None = None,
        follows_limit: bool = False,
    ) -> LatencyEvent:
        return LatencyEvent(
            container=container,
            node=self.node,
            latency_s=latency_s,
            images=images,
            batch=batch,
            cpu_s=max(0.0, cpu_s),
            model=model,
            finished_at=time.time() if finished_at is None else finished_at,
            follows_limit=follows_limit,
        )

    async def publish(self, ev: LatencyEvent) -> None:
        await self.bus.publish(subjects.latency(ev.node, ev.container), ev)
        self.published += 1

    def publish_nowait(self, ev: LatencyEvent) -> None:
        """From synchronous code (a simulated node's callback): queued, sent in order."""
        self._queue.put_nowait(ev)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while not self._queue.empty():
            ev = self._queue.get_nowait()
            try:
                await self.publish(ev)
            except Exception as e:  # keep going: the next batch may get through
                log.warning("could not publish latency of %s: %r", ev.container, e)

    async def flush(self) -> None:
        if self._task is not None:
            await self._task
