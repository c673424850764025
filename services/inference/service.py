"""The inference container's process: run the real workload and publish every batch on NATS.

The torch loop runs in its own thread (a forward pass holds no asyncio lock
and cannot be interrupted); each finished batch is handed to the event loop,
which publishes it as a `LatencyEvent` on `dqoes.latency.<node>.<container>`
through the same publisher the simulated runtime uses. NATS may come up after
the container: connecting is retried, with one log line now and then. SIGTERM
exits at once (the batch in flight is simply dropped), so a container is never
slow to stop, even at a small CPU quota.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

from shared import auth
from shared.aio import next_or_stop
from shared.bus import Bus, BusError
from shared.publisher import LatencyPublisher

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InferenceConfig:
    name: str
    node: str
    nats_url: str
    model: str = "resnet50"
    batch: int = 100
    resolution_px: int | None = None
    threads: int | None = None
    default_threads: int = 1
    seed: int = 0
    weights: str | None = None
    images_dir: str | None = None
    batches: int | None = None
    connect_timeout_s: float = 600.0


async def connect_with_retry(url: str, name: str, timeout_s: float) -> Bus:
    t_end = time.monotonic() + timeout_s
    next_log = 0.0
    while True:
        try:
            return await Bus.connect(url, name, connect_timeout_s=3.0)
        except BusError as e:
            if time.monotonic() >= t_end:
                raise
            if time.monotonic() >= next_log:
                log.warning("%s; retrying", e)
                next_log = time.monotonic() + 30.0
            await asyncio.sleep(1.0)


async def serve(cfg: InferenceConfig, workload, stop: asyncio.Event) -> int:  # noqa: ANN001 (torch-free import)
    bus = await connect_with_retry(cfg.nats_url, f"inference-{cfg.name}", cfg.connect_timeout_s)
    pub = LatencyPublisher(bus, cfg.node)
    loop = asyncio.get_running_loop()
    results: asyncio.Queue = asyncio.Queue()
    finished = threading.Event()

    def work() -> None:
        try:
            for r in workload.run(cfg.batches):
                loop.call_soon_threadsafe(results.put_nowait, r)
        except Exception as e:  # a broken model is reported once, and the process ends
            loop.call_soon_threadsafe(results.put_nowait, e)
        finally:
            finished.set()
            loop.call_soon_threadsafe(results.put_nowait, None)

    threading.Thread(target=work, name="inference", daemon=True).start()
    log.info("%s on %s: %s, %d images x %d px a batch, publishing to %s", cfg.name, cfg.node, workload.spec.name,
             cfg.batch, workload.resolution_px, auth.redact(cfg.nats_url))
    status = 0
    while not stop.is_set():
        r = await next_or_stop(results, stop)
        if r is None:  # stopped, or the workload thread ended
            break
        if isinstance(r, Exception):
            log.error("inference failed: %r", r)
            status = 1
            continue
        await pub.publish(pub.event(cfg.name, r.latency_s, r.images, r.batch, cpu_s=r.cpu_s, model=r.model,
                                    finished_at=r.finished_at, follows_limit=cfg.threads is None))
        log.debug("batch %d: %.3f s (%d threads)", r.batch, r.latency_s, r.threads)
    workload.stop()
    try:
        await asyncio.wait_for(bus.drain(), 2.0)
    except (TimeoutError, BusError):
        pass
    return status


def run(cfg: InferenceConfig) -> int:
    from services.inference.models import WeightsError
    from services.inference.workload import Workload, WorkloadError

    try:
        workload = Workload(cfg.model, cfg.batch, cfg.resolution_px, seed=cfg.seed, weights=cfg.weights,
                            images_dir=cfg.images_dir, threads=cfg.threads, default_threads=cfg.default_threads)
    except (WorkloadError, WeightsError) as e:
        log.error("%s", e)
        return 2

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            return await serve(cfg, workload, stop)
        except BusError as e:
            log.error("%s", e)
            return 1

    status = asyncio.run(main())
    # The torch thread may be mid-batch; there is nothing to save, so do not wait for it.
    os._exit(status)


def run_http(cfg: InferenceConfig, host: str, port: int, max_wait_s: float) -> int:  # exits the process
    """The --serve mode: the model behind HTTP (serving.py), micro-batches of up to cfg.batch images."""
    from services.inference.models import WeightsError
    from services.inference.serving import serve_http
    from services.inference.workload import Workload, WorkloadError

    try:
        workload = Workload(cfg.model, 1, cfg.resolution_px, seed=cfg.seed, weights=cfg.weights,
                            threads=cfg.threads, default_threads=cfg.default_threads)
    except (WorkloadError, WeightsError) as e:
        log.error("%s", e)
        return 2
    status = serve_http(workload, host, port, cfg.batch, max_wait_s)
    # As in run(): a forward pass may still be running on the inference thread; do not wait for it.
    os._exit(status)
