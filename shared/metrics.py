"""Prometheus metrics of the manager and the workers, served on /metrics.

Why: operators graph and alert on what a controller exports (every
autoscaler in this field does), and the first questions about a system
that sets CPU limits on latency-sensitive services — is each service
meeting its objective, what limit does it have, how often is it throttled —
should be answerable from a Prometheus server without reading NATS.

How: each service builds its own `CollectorRegistry` and a collector that
reads an immutable snapshot at scrape time (the worker's latest published
`NodeState`, the manager's latest `ClusterState` and counters). Containers
that leave disappear from the next scrape instead of lingering as stale
label sets, and the HTTP thread never walks the asyncio side's mutable
dicts. Names follow Prometheus conventions: base units (`_seconds`,
`_cores`, ratios in 0..1), `_total` for counters; docs/reference/metrics.md lists them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.public import ClusterState
from shared.schema import NodeState
from shared.settings import DEFAULT_METRICS_ADDR

ROUND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""A round reads counters, decides and applies limits: milliseconds, up to seconds on a slow engine."""

REQUEST_BUCKETS_S = tuple(float(f"{0.001 * 2 ** (i / 6):.4g}") for i in range(97))
"""A CNN request on CPU: a millisecond to a minute (a batch under a small quota), six buckets an octave.
A percentile read from a histogram is interpolated inside its bucket: with bounds 12 % apart it is
within a few percent of the requests' own, where the old decades-and-halves buckets (0.05, 0.1, ...)
put a 61 ms client p95 at 77 ms."""

BATCH_REQUEST_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, slots=True)
class WorkerCounters:
    """The worker's cumulative counts at scrape time."""

    rounds: int
    limit_changes: int
    latencies: int
    ignored_latencies: int
    bus_dropped: int
    bus_refused_replies: int = 0
    forged_latencies: int = 0


@dataclass(frozen=True, slots=True)
class ManagerCounters:
    accepted: int
    rejected: int
    cleared: int
    objectives_stored: int
    bus_dropped: int
    bus_refused_replies: int = 0
    service_objectives_stored: int = 0


def _bool(x: bool | None) -> float | None:
    return None if x is None else float(x)


class WorkerCollector(Collector):
    """Per-container and per-node gauges from the worker's latest node state, and its counters."""

    def __init__(self, node: str, state: Callable[[], NodeState | None],
                 counters: Callable[[], WorkerCounters],
                 request_rates: Callable[[], Mapping[str, float]] | None = None) -> None:
        self.node = node
        self.state = state
        self.counters = counters
        self.request_rates = request_rates
        """Requests a second of each container whose latency the worker reads (a polled source)."""

    def collect(self) -> Iterator[Metric]:
        node = self.node
        c = self.counters()
        for name, doc, value in (
            ("dqoes_rounds", "Control rounds run on this node.", c.rounds),
            ("dqoes_limit_changes", "CPU limit changes applied to containers on this node.", c.limit_changes),
            ("dqoes_latency_events", "Batch latency events received from this node's containers.", c.latencies),
            ("dqoes_latency_events_ignored", "Latency events for unknown containers or another node.",
             c.ignored_latencies),
            ("dqoes_latency_events_forged", "Latency events dropped because their body named another container "
             "than their subject.", c.forged_latencies),
            ("dqoes_bus_dropped_messages", "Bus messages dropped because they did not decode.", c.bus_dropped),
            ("dqoes_bus_refused_replies", "Requests not answered: their reply subject was not an inbox.",
             c.bus_refused_replies),
        ):
            m = CounterMetricFamily(name, doc, labels=["node"])
            m.add_metric([node], value)
            yield m
        if self.request_rates is not None:
            rates = GaugeMetricFamily("dqoes_request_rate_per_second", "Requests a second over the last "
                                      "window of each container whose latency is read from Prometheus metrics "
                                      "(docs/guide/latency-sources.md).", labels=["node", "container"])
            for container, rate in sorted(self.request_rates().items()):
                rates.add_metric([node, container], rate)
            yield rates
        ns = self.state()
        if ns is None:
            return
        labels = ["node", "container", "model"]
        per: dict[str, tuple[str, GaugeMetricFamily]] = {
            "latency": ("latency_s", GaugeMetricFamily(
                "dqoes_container_latency_seconds", "Latest batch latency, seconds per batch.", labels=labels)),
            "objective": ("objective_s", GaugeMetricFamily(
                "dqoes_container_objective_seconds", "Latency objective, seconds per batch.", labels=labels)),
            "limit": ("", GaugeMetricFamily(
                "dqoes_container_cpu_limit_cores", "CPU limit in force, cores (absent: no limit).",
                labels=labels)),
            "used": ("cpu_cores_used", GaugeMetricFamily(
                "dqoes_container_cpu_used_cores", "CPU used over the last round, cores.", labels=labels)),
            "throttled": ("throttled_ratio", GaugeMetricFamily(
                "dqoes_container_throttled_ratio",
                "Share of CFS periods since the previous report in which the container was throttled.",
                labels=labels)),
            "met": ("met", GaugeMetricFamily(
                "dqoes_container_met", "1 if the latest latency meets the objective (class G or S).",
                labels=labels)),
            "in_band": ("", GaugeMetricFamily(
                "dqoes_container_in_band", "1 if the latest latency is within the band (class S).",
                labels=labels)),
            "managed": ("", GaugeMetricFamily(
                "dqoes_container_managed", "1 if the container has an objective and is controlled.",
                labels=labels)),
        }
        kinds = GaugeMetricFamily(
            "dqoes_container_objective_info", "1 for each governed container: its objective's kind (batch: "
            "seconds per batch; p95: a percentile over window_s) and where it comes from (container, service, "
            "label), with the service's selector.", labels=["node", "container", "kind", "window_s", "from", "service"])
        for cs in ns.containers:
            if cs.managed and cs.objective_s is not None:
                source = ("label" if cs.objective_source == "label" else
                          "service" if cs.objective_selector else
                          "container" if cs.objective_source == "target" else "")
                kinds.add_metric([node, cs.container, "batch" if cs.percentile is None else f"p{cs.percentile:g}",
                                  "" if cs.window_s is None else f"{cs.window_s:g}", source,
                                  cs.objective_selector or ""], 1.0)
            lv = [node, cs.container, cs.model or ""]
            values: dict[str, Any] = {
                "latency": cs.latency_s, "objective": cs.objective_s,
                "limit": None if cs.limit is None else cs.limit * ns.cores,
                "used": cs.cpu_cores_used, "throttled": cs.throttled_ratio, "met": _bool(cs.met),
                "in_band": None if not cs.managed or cs.cls is None else float(cs.cls.value == "S"),
                "managed": float(cs.managed and cs.objective_s is not None),
            }
            for key, (_, fam) in per.items():
                if values[key] is not None:
                    fam.add_metric(lv, float(values[key]))
        yield from (fam for _, fam in per.values())
        yield kinds
        classes = GaugeMetricFamily("dqoes_node_containers", "Containers on this node per class "
                                    "(G, S, B, pending: no batch yet, unmanaged: no objective).",
                                    labels=["node", "class"])
        for cls in ("G", "S", "B", "pending"):
            classes.add_metric([node, cls], len(ns.members[cls]))
        classes.add_metric([node, "unmanaged"], sum(1 for cs in ns.containers if not cs.managed))
        yield classes
        gauges: tuple[tuple[str, str, float | int | None], ...] = (
            ("dqoes_node_cores", "The node's CPU capacity, cores.", ns.cores),
            ("dqoes_node_in_band", "Containers within their band (class S).", ns.satisfied),
            ("dqoes_node_met", "Containers meeting their objective (G and S).", ns.met),
            ("dqoes_node_cpu_used_cores", "CPU the containers used over the last round, cores.", ns.cpu_cores_used),
            ("dqoes_node_interval_seconds", "Delay to the next control round.", ns.interval_s),
        )
        for name, doc, reading in gauges:
            if reading is not None:
                gauge = GaugeMetricFamily(name, doc, labels=["node"])
                gauge.add_metric([node], float(reading))
                yield gauge
        params = GaugeMetricFamily("dqoes_policy_param", "The policy's parameters in force (dqoes control).",
                                   labels=["node", "policy", "param"])
        for k, v in sorted(ns.params.items()):
            params.add_metric([node, ns.policy, k], v)
        yield params


class ManagerCollector(Collector):
    """Cluster-wide gauges from the manager's summary, and its target counters."""

    def __init__(self, cluster: Callable[[], ClusterState], counters: Callable[[], ManagerCounters]) -> None:
        self.cluster = cluster
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self.counters()
        targets = CounterMetricFamily("dqoes_target_requests", "Target requests by result "
                                      "(accepted, rejected; cleared: objectives removed).", labels=["result"])
        for result, value in (("accepted", c.accepted), ("rejected", c.rejected), ("cleared", c.cleared)):
            targets.add_metric([result], value)
        yield targets
        dropped = CounterMetricFamily("dqoes_bus_dropped_messages", "Bus messages dropped because they did "
                                      "not decode.", labels=["node"])
        dropped.add_metric(["manager"], c.bus_dropped)
        yield dropped
        refused = CounterMetricFamily("dqoes_bus_refused_replies", "Requests not answered: their reply subject "
                                      "was not an inbox.", labels=["node"])
        refused.add_metric(["manager"], c.bus_refused_replies)
        yield refused
        stored = GaugeMetricFamily("dqoes_objectives_stored", "Objectives in the key-value store.")
        stored.add_metric([], c.objectives_stored)
        yield stored
        services = GaugeMetricFamily("dqoes_service_objectives_stored",
                                     "Of those, objectives for services (every matching container).")
        services.add_metric([], c.service_objectives_stored)
        yield services
        cs = self.cluster()
        nodes = GaugeMetricFamily("dqoes_cluster_nodes", "Nodes whose worker reported recently.")
        nodes.add_metric([], len(cs.nodes))
        yield nodes
        per = GaugeMetricFamily("dqoes_cluster_node_containers", "Containers per node and class, as the "
                                "manager last heard.", labels=["node", "class"])
        sat = GaugeMetricFamily("dqoes_cluster_node_in_band", "Containers within their band per node.",
                                labels=["node"])
        for name, n in cs.nodes.items():
            for cls, value in (("G", n.G), ("S", n.S), ("B", n.B), ("pending", n.pending)):
                per.add_metric([name, cls], value)
            sat.add_metric([name], n.satisfied)
        yield per
        yield sat
        total = GaugeMetricFamily("dqoes_cluster_in_band", "Containers within their band, every node.")
        total.add_metric([], cs.satisfied_total)
        yield total


class MetricsServer:
    """One process's /metrics endpoint over its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.round_seconds = Histogram("dqoes_round_duration_seconds", "Wall time of one control round "
                                       "(read counters, decide, apply limits).", ["node"],
                                       buckets=ROUND_BUCKETS_S, registry=self.registry)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)

    def start(self, port: int, addr: str = DEFAULT_METRICS_ADDR) -> str:
        """Serve on addr:port (0: a free port; default address loopback only); the URL of /metrics.
        OSError if the port is taken."""
        self._server, self._thread = start_http_server(port, addr, registry=self.registry)
        self.port = int(self._server.server_port)
        host = "127.0.0.1" if addr in ("0.0.0.0", "") else addr
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class ServingMetrics:
    """The inference HTTP serving mode's request-latency histogram and micro-batch sizes, in their own registry.

    The serving process renders them itself (`exposition`) on the same HTTP server that answers requests,
    so one port carries both; a latency source that scrapes /metrics reads
    `dqoes_inference_request_duration_seconds` (labels: model).
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.registry = CollectorRegistry(auto_describe=False)
        self.request_seconds = Histogram(
            "dqoes_inference_request_duration_seconds", "Time from a request's arrival to its answer, seconds "
            "(queueing for a micro-batch included).", ["model"], buckets=REQUEST_BUCKETS_S, registry=self.registry)
        self.batch_requests = Histogram(
            "dqoes_inference_batch_requests", "Requests answered by one forward pass (micro-batch size).",
            ["model"], buckets=BATCH_REQUEST_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram(
            "dqoes_inference_batch_duration_seconds", "Wall time of one forward pass, seconds.", ["model"],
            buckets=REQUEST_BUCKETS_S, registry=self.registry)

    def observe_request(self, seconds: float) -> None:
        self.request_seconds.labels(self.model).observe(seconds)

    def observe_batch(self, requests: int, seconds: float) -> None:
        self.batch_requests.labels(self.model).observe(requests)
        self.batch_seconds.labels(self.model).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of a /metrics answer."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
