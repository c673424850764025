"""The training job's process: train epoch after epoch and publish each epoch's loss on NATS.

Like the inference workload, torch runs in its own thread and the event
loop publishes: a `Progress` after every epoch (the mean loss over the
epoch's steps) on `dqoes.progress.<node>.<job>`, and a `JobDone` when the
job has run its epochs or met its convergence rule. A loss that is not a
finite number >= 0 (a diverging job) is not published: the job logs it once
and goes on, so its worker sees it stop reporting rather than a bad value.
Threads follow the CPU limit, as for inference: max(1, floor(quota)),
re-read every epoch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass

from shared import subjects
from shared.aio import next_or_stop
from shared.bus import Bus, BusError
from shared.schema import JobDone, Progress

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TrainingConfig:
    name: str
    node: str
    nats_url: str
    model: str = "cnn"
    epochs: int = 30
    batch: int = 128
    steps_per_epoch: int | None = None
    threads: int | None = None
    seed: int = 0
    converge_delta: float | None = None
    """Stop early when the relative improvement stays below this for `converge_patience` epochs."""
    converge_patience: int = 5
    connect_timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class EpochResult:
    epoch: int
    steps: int
    loss: float
    cpu_s: float
    at: float


def _quota_threads() -> int:
    """max(1, floor(CPU quota in cores)) from this process's cgroup, or 1 if it has none."""
    try:
        for line in open("/proc/self/cgroup").read().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[1] == "" or "cpu" in parts[1].split(","):
                rel = parts[2].lstrip("/")
                for path, parse in ((f"/sys/fs/cgroup/{rel}/cpu.max", _v2), (f"/sys/fs/cgroup/cpu/{rel}/cpu.cfs_quota_us", _v1),
                                    (f"/sys/fs/cgroup/cpu,cpuacct/{rel}/cpu.cfs_quota_us", _v1)):
                    if os.path.exists(path):
                        q = parse(path)
                        if q is not None:
                            return max(1, math.floor(q))
    except OSError:
        pass
    return 1


def _v2(path: str) -> float | None:
    quota, period = open(path).read().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _v1(path: str) -> float | None:
    quota = int(open(path).read())
    if quota <= 0:
        return None
    period = int(open(path.replace("cfs_quota_us", "cfs_period_us")).read())
    return quota / period


def train(cfg: TrainingConfig, stop: threading.Event):  # noqa: ANN201 (a generator of EpochResult)
    """Run the task and yield each epoch's mean loss (torch imported here, not at module import)."""
    import torch

    from services.training.tasks import build

    task = build(cfg.model, seed=cfg.seed, batch=cfg.batch, steps_per_epoch=cfg.steps_per_epoch)
    best, calm = math.inf, 0
    for epoch in range(cfg.epochs):
        torch.set_num_threads(cfg.threads or _quota_threads())
        losses = [task.step() for _ in range(task.steps_per_epoch) if not stop.is_set()]
        if stop.is_set():
            return
        loss = sum(losses) / len(losses)
        yield EpochResult(epoch, (epoch + 1) * task.steps_per_epoch, loss, time.process_time(), time.time())
        if cfg.converge_delta is not None and math.isfinite(loss):
            calm = calm + 1 if best - loss < cfg.converge_delta * abs(best) else 0
            best = min(best, loss)
            if calm >= cfg.converge_patience:
                return


async def connect_with_retry(url: str, name: str, timeout_s: float) -> Bus:
    t_end = time.monotonic() + timeout_s
    while True:
        try:
            return await Bus.connect(url, name, connect_timeout_s=3.0)
        except BusError:
            if time.monotonic() >= t_end:
                raise
            await asyncio.sleep(1.0)


async def serve(cfg: TrainingConfig, stop: asyncio.Event) -> int:
    from services.training.tasks import EVAL_FN

    bus = await connect_with_retry(cfg.nats_url, f"training-{cfg.name}", cfg.connect_timeout_s)
    subject = subjects.progress(cfg.node, cfg.name)
    loop = asyncio.get_running_loop()
    results: asyncio.Queue = asyncio.Queue()
    halt = threading.Event()
    t0 = time.time()

    def work() -> None:
        try:
            for r in train(cfg, halt):
                loop.call_soon_threadsafe(results.put_nowait, r)
        except Exception as e:
            loop.call_soon_threadsafe(results.put_nowait, e)
        finally:
            loop.call_soon_threadsafe(results.put_nowait, None)

    threading.Thread(target=work, name="training", daemon=True).start()
    log.info("%s on %s: %s for %d epochs, publishing to %s", cfg.name, cfg.node, cfg.model, cfg.epochs, subject)
    status, last, epochs, warned = 0, None, 0, False
    while not stop.is_set():
        r = await next_or_stop(results, stop)
        if r is None:  # stopped, or the workload thread ended
            break
        if isinstance(r, Exception):
            log.error("training failed: %r", r)
            status = 1
            continue
        epochs = r.epoch + 1
        if not (math.isfinite(r.loss) and r.loss >= 0):
            if not warned:
                log.warning("epoch %d: loss %r is not a finite number >= 0; not published", r.epoch, r.loss)
                warned = True
            continue
        last = r.loss
        await bus.publish(subject, Progress(job=cfg.name, node=cfg.node, value=r.loss, epoch=r.epoch, step=r.steps,
                                            eval_fn=EVAL_FN.get(cfg.model), model=cfg.model, cpu_s=r.cpu_s, at=r.at))
    halt.set()
    done = JobDone(job=cfg.name, node=cfg.node, epochs=epochs, duration_s=time.time() - t0, value=last,
                   ok=status == 0 and not stop.is_set(), reason="" if status == 0 else "training failed")
    try:
        await bus.publish(subject, done)
        await asyncio.wait_for(bus.drain(), 2.0)
    except (TimeoutError, BusError):
        pass
    log.info("%s done after %d epochs in %.1f s (last loss %s)", cfg.name, epochs, done.duration_s, last)
    return status


def run(cfg: TrainingConfig) -> int:
    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            return await serve(cfg, stop)
        except BusError as e:
            log.error("%s", e)
            return 1

    status = asyncio.run(main())
    os._exit(status)
