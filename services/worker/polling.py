"""The worker's latency poller: containers whose labels name a `prometheus` or `promql` source.

Why: such a container publishes no LatencyEvents; its latency sits in its
own metrics page or in the operator's Prometheus. For each one the poller
runs a task in the worker's loop that reads one window at a time
(`shared.latency.sources`) and hands the percentile to the worker as that
window's latency (`Worker.on_polled`): the controller and the policies see
the same kind of number as from NATS, a latency per container per window
against its objective.

A window without a value (the source does not answer, the page is garbage,
no request finished) makes the container stale: never met, its limit kept
(`Worker.unmeasured`). One log line per source problem and period says why;
the next window that has a value ends it, with one line saying so. The
request rate of each window is kept beside it (`status`, and the metric
dqoes_request_rate_per_second) and in the container's state. A percentile
objective's percentile and window drive the reading; the labels are the
defaults (`objective_spec`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from services.worker.logic import Worker
from shared.core.quantiles import WindowReading
from shared.latency.sources import LatencySource, PromQLSource, ScrapeSource
from shared.latency.spec import SourceSpec, parse_source, substitute
from shared.ratelog import RateLimitedLog
from shared.runtime.base import RuntimeContainer

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 30.0
"""At most one line per container and problem this often (a source that stays down)."""
STARTUP_GRACE_S = 5.0
"""A new container's endpoint that does not answer yet is not a problem for this long (or three
windows, whichever is longer): a server takes a moment to listen."""


@dataclass(frozen=True, slots=True)
class SourceStatus:
    """What a container's latency source gave last."""

    kind: str
    """prometheus or promql."""
    state: str
    """A reading's state (shared.core.quantiles.State), "unreachable", or "misconfigured"."""
    detail: str = ""
    latency_s: float | None = None
    rate_per_s: float | None = None
    url: str = ""


def endpoint(c: RuntimeContainer, spec: SourceSpec) -> str:
    """The URL of a container's metrics page: the runtime's address for it, else the host label."""
    port = spec.port or 0
    if c.address is None:
        host = spec.host or "127.0.0.1"
    else:
        host = c.address
        port = c.published_ports.get(port, port)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}{spec.path}"


def objective_spec(worker: Worker, name: str, spec: SourceSpec) -> SourceSpec:
    """The source as the container's objective asks: its percentile and window win over the labels'."""
    r = worker.resolved.get(name)
    o = None if r is None else r.objective
    if o is None or o.percentile is None:
        return spec
    return replace(spec, percentile=o.percentile, window_s=o.window_s or spec.window_s)


class LatencyPoller:
    """One polling task per container with a polled source, on the worker's loop."""

    def __init__(self, worker: Worker, prometheus_url: str | None = None, *, timeout_s: float = 2.0,
                 log_interval_s: float = LOG_INTERVAL_S, threads: int = 8) -> None:
        self.worker = worker
        self.prometheus_url = prometheus_url
        self.timeout_s = timeout_s
        self.status: dict[str, SourceStatus] = {}
        self.sources: dict[str, LatencySource] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._containers: dict[str, RuntimeContainer] = {}
        self._quiet_until: dict[str, float] = {}
        """Until when (monotonic) a new container's source may still be starting; gone once it answers."""
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="latency-source")
        self.problems = RateLimitedLog(log, logging.WARNING, interval_s=log_interval_s)
        worker.joined.append(self.add)
        worker.left.append(self.remove)
        worker.retuned.append(self.retune)

    def retune(self, name: str) -> None:
        """A polled container's objective changed percentile or window: read it the new way."""
        c = self._containers.get(name)
        if c is not None and name in self.sources:
            self.add(c)

    def add(self, c: RuntimeContainer) -> None:
        """A container joined: poll it if its labels say so (a malformed label: stale, one line)."""
        self.remove(c.name)  # a container of that name before: its source is gone with it
        try:
            spec = parse_source(c.labels)
            if not spec.polled:
                return
            spec = objective_spec(self.worker, c.name, spec)
            source = self.make(c, spec)
        except ValueError as e:
            self.worker.polled.add(c.name)
            self.worker.unmeasured.add(c.name)
            self.status[c.name] = SourceStatus("?", "misconfigured", str(e))
            log.warning("latency of %s cannot be read: %s; stale (limit kept)", c.name, e)
            return
        self.worker.polled.add(c.name)
        self._containers[c.name] = c
        self.sources[c.name] = source
        self.status[c.name] = SourceStatus(spec.kind, "baseline", url=source.url)
        self._quiet_until[c.name] = time.monotonic() + max(STARTUP_GRACE_S, 3 * spec.window_s)
        self._tasks[c.name] = asyncio.get_running_loop().create_task(
            self._poll(c.name, spec, source), name=f"latency-{c.name}")
        log.info("latency of %s: %s source %s, p%g every %g s", c.name, spec.kind, source.url,
                 spec.percentile, spec.window_s)

    def make(self, c: RuntimeContainer, spec: SourceSpec) -> LatencySource:
        if spec.kind == "prometheus":
            return ScrapeSource(endpoint(c, spec), spec.metric or "", spec.quantile, spec.unit_s,
                                self.timeout_s, self._executor, match=spec.match)
        if not self.prometheus_url:
            raise ValueError("dqoes.latency.source=promql needs the worker's --prometheus-url")
        node = self.worker.node
        q, w = spec.quantile, spec.window_s
        return PromQLSource(self.prometheus_url, substitute(spec.query or "", c.name, node, c.model, q, w),
                            substitute(spec.rate_query, c.name, node, c.model, q, w) if spec.rate_query else None,
                            spec.unit_s, self.timeout_s, self._executor)

    def remove(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        self.sources.pop(name, None)
        self.status.pop(name, None)
        self._quiet_until.pop(name, None)
        self._containers.pop(name, None)
        self.worker.polled.discard(name)
        self.worker.unmeasured.discard(name)

    def rates(self) -> dict[str, float]:
        """The request rate of each polled container's last window, where known."""
        return {n: s.rate_per_s for n, s in list(self.status.items()) if s.rate_per_s is not None}

    async def _poll(self, name: str, spec: SourceSpec, source: LatencySource) -> None:
        while True:
            started = time.monotonic()
            try:
                reading = await source.read(started)
            except Exception as e:  # a source must not raise; if one does, the next window tries again
                reading = WindowReading("bad", detail=f"{type(e).__name__}: {e}")
            self.take(name, spec.kind, source.url, reading, spec.window_s)
            await asyncio.sleep(max(0.0, spec.window_s - (time.monotonic() - started)))

    def take(self, name: str, kind: str, url: str, reading: WindowReading, window_s: float | None = None) -> None:
        """One window's reading: a value goes to the worker, none makes the container stale."""
        w = self.worker
        self.status[name] = SourceStatus(kind, reading.state, reading.detail, reading.latency_s,
                                         reading.rate_per_s, url)
        if reading.rate_per_s is not None:
            w.request_rates[name] = reading.rate_per_s
        if reading.latency_s is not None:
            self._quiet_until.pop(name, None)
            w.on_polled(name, reading.latency_s, window_s, reading.rate_per_s)
            if name in w.unmeasured:
                w.unmeasured.discard(name)
                log.info("latency of %s read again from %s (p = %.4g s)", name, url, reading.latency_s)
            if reading.state == "reset":
                self.problems.log((name, "reset"), "latency of %s: %s (%s)", name, reading.detail, url)
            return
        if reading.state == "baseline":
            self._quiet_until.pop(name, None)  # it answered
            return
        if reading.state == "unreachable" and time.monotonic() < self._quiet_until.get(name, 0.0):
            log.debug("latency of %s: %s not answering yet (%s)", name, url, reading.detail)
            return
        self._quiet_until.pop(name, None)
        w.unmeasured.add(name)
        self.problems.log((name, reading.state), "latency of %s not read (%s: %s, from %s); stale, limit kept",
                          name, reading.state, reading.detail, url)
        if w.ctrl.due(w.clock()):
            w.wake.set()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
