"""The inference workload as an HTTP model server: requests in, micro-batches through the model, answers out.

Why this exists: DQoES governs services by their latency, and a real model
server is judged by its request latency, queueing included, not by the
seconds of a batch loop. This mode serves the same torch models (models.py)
with the same thread rule (workload.py: intra-op threads follow the cgroup
quota) behind HTTP, and exports a Prometheus histogram of request latency,
`dqoes_inference_request_duration_seconds`, on /metrics of the same port, so
a latency source that scrapes metrics endpoints can govern it like any other
server.

A request is light: `POST /predict` with `{"images": N, "seed": S}` (both
optional: one image, seed 0) stands for N images; the server makes them
(seeded, synthetic, the workload's resolution), so a load generator sends a
few bytes and the cost lands on the server, where it belongs. The answer
holds one class index per image and the micro-batch that served it.

Micro-batching: requests wait in arrival order; a forward pass starts when the
queued images reach the batch size (`--batch`) or when the oldest request has
waited `max_wait_s`, and takes whole requests up to the batch size. One
thread runs the model, so the next batch gathers while the current one runs.
A request of more images than the batch size is refused (400).

Endpoints: POST /predict, GET /metrics, GET /healthz ("ok" once the model is
loaded; the port opens only then).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from shared.metrics import ServingMetrics

log = logging.getLogger(__name__)

MAX_SEED = 2**63 - 1


class RequestError(ValueError):
    """A request the server cannot take (answered 400 with this one-line message)."""


@dataclass(slots=True)
class _Pending:
    images: int
    seed: int
    future: asyncio.Future = field(repr=False)


def parse_request(body: bytes, max_images: int) -> tuple[int, int]:
    """(images, seed) from a /predict body; RequestError with a one-line reason otherwise."""
    if not body.strip():
        return 1, 0
    try:
        obj = json.loads(body)
    except ValueError:
        raise RequestError("body is not JSON; send {\"images\": N, \"seed\": S}") from None
    if not isinstance(obj, dict):
        raise RequestError("body must be a JSON object: {\"images\": N, \"seed\": S}")
    unknown = set(obj) - {"images", "seed"}
    if unknown:
        raise RequestError(f"unknown field(s): {', '.join(sorted(unknown))} (accepted: images, seed)")
    images, seed = obj.get("images", 1), obj.get("seed", 0)
    if not isinstance(images, int) or isinstance(images, bool) or not 1 <= images <= max_images:
        raise RequestError(f"images must be an integer from 1 to {max_images} (the batch size), got {images!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise RequestError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    return images, seed


class MicroBatcher:
    """Gathers requests into forward passes of at most `max_images` images, waiting at most `max_wait_s`."""

    def __init__(self, workload: Any, max_images: int, max_wait_s: float, metrics: ServingMetrics) -> None:
        self.workload = workload
        self.max_images = max_images
        self.max_wait_s = max_wait_s
        self.metrics = metrics
        self._queue: deque[_Pending] = deque()
        self._queued_images = 0
        self._arrived = asyncio.Event()
        self._oldest_at = 0.0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inference")

    async def submit(self, images: int, seed: int) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        p = _Pending(images, seed, loop.create_future())
        if not self._queue:
            self._oldest_at = loop.time()
        self._queue.append(p)
        self._queued_images += images
        self._arrived.set()
        return await p.future

    def _take(self) -> list[_Pending]:
        batch = [self._queue.popleft()]
        n = batch[0].images
        while self._queue and n + self._queue[0].images <= self.max_images:
            batch.append(self._queue.popleft())
            n += batch[-1].images
        self._queued_images -= n
        return batch

    def _forward(self, batch: list[_Pending]) -> tuple[list[int], Any]:
        import torch

        from services.inference.workload import synthetic_images

        res = self.workload.resolution_px
        images = torch.cat([synthetic_images(p.images, res, p.seed) for p in batch])
        logits, result = self.workload.infer(images)
        return logits.argmax(dim=1).tolist(), result

    async def run(self) -> None:
        """Serve batches until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            deadline = self._oldest_at + self.max_wait_s
            while self._queued_images < self.max_images and loop.time() < deadline:
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            batch = self._take()
            if self._queue:  # the rest waits from now, not from its own arrival: it already waited
                self._oldest_at = loop.time() - self.max_wait_s
            try:
                predictions, result = await loop.run_in_executor(self._executor, self._forward, batch)
            except Exception as e:  # a failing model answers 500 to the batch, and the server goes on
                log.error("inference failed: %r", e)
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(RuntimeError(f"inference failed: {type(e).__name__}"))
                continue
            self.metrics.observe_batch(len(batch), result.latency_s)
            info = {"requests": len(batch), "images": result.images, "inference_s": result.latency_s,
                    "threads": result.threads}
            start = 0
            for p in batch:
                if not p.future.done():  # a client that went away leaves a cancelled future
                    p.future.set_result({"predictions": predictions[start:start + p.images], "batch": info})
                start += p.images

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def build_app(workload: Any, max_images: int, max_wait_s: float) -> Starlette:
    """The ASGI app of the serving mode around a loaded `Workload`."""
    metrics = ServingMetrics(workload.spec.name)
    batcher = MicroBatcher(workload, max_images, max_wait_s, metrics)

    async def predict(request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            images, seed = parse_request(await request.body(), max_images)
        except RequestError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        try:
            answer = await batcher.submit(images, seed)
        except RuntimeError as e:
            return JSONResponse({"error": str(e)}, status_code=500)
        elapsed_s = time.perf_counter() - t0
        metrics.observe_request(elapsed_s)
        return JSONResponse({"model": workload.spec.name, **answer, "latency_s": elapsed_s})

    async def metrics_endpoint(request: Request) -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(batcher.run(), name="micro-batcher")
        try:
            yield
        finally:
            task.cancel()
            batcher.close()

    return Starlette(routes=[Route("/predict", predict, methods=["POST"]),
                             Route("/metrics", metrics_endpoint, methods=["GET"]),
                             Route("/healthz", healthz, methods=["GET"])], lifespan=lifespan)


def parse_addr(text: str) -> tuple[str, int]:
    """HOST:PORT or PORT (host 0.0.0.0) -> (host, port); ValueError with a one-line reason."""
    host, _, port_text = text.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"--serve: expected PORT or HOST:PORT, got {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"--serve: port must be 1-65535, got {port}")
    return (host or "0.0.0.0"), port


def serve_http(workload: Any, host: str, port: int, max_images: int, max_wait_s: float) -> int:
    """Answer requests on host:port until SIGTERM or Ctrl-C; the exit status."""
    import uvicorn

    app = build_app(workload, max_images, max_wait_s)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    log.info("serving %s on http://%s:%d (POST /predict, GET /metrics), micro-batches of up to %d images, "
             "waiting at most %g s", workload.spec.name, host, port, max_images, max_wait_s)
    server.run()
    return 0 if server.started else 1
