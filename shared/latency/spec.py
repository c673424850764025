"""The container labels that choose where its latency is read, checked into a `SourceSpec`.

Why labels: a container says how it wants to be governed where it is
started (`docker run --label`, compose `labels:`), like its objective
(`dqoes.objective_s`); the worker needs no configuration per container. The
names share the `dqoes.latency.` prefix; docs/reference/api.md lists them.

A malformed label is an error with one line naming it (`ValueError`); the
worker then treats the container as stale (never met, limit kept) rather
than guessing. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

SOURCE_LABEL = "dqoes.latency.source"
"""nats (default: the container publishes LatencyEvents), prometheus (the worker scrapes the
container's metrics endpoint) or promql (the worker asks the operator's Prometheus server)."""
PORT_LABEL = "dqoes.latency.port"
"""prometheus: the port of the container's metrics endpoint (required)."""
PATH_LABEL = "dqoes.latency.path"
"""prometheus: the endpoint's path (default /metrics)."""
METRIC_LABEL = "dqoes.latency.metric"
"""prometheus: the histogram's (or summary's) name, without _bucket (required)."""
HOST_LABEL = "dqoes.latency.host"
"""prometheus, sim and cgroup runtimes: the host the endpoint answers on (default 127.0.0.1);
Docker always uses the container's own address."""
PERCENTILE_LABEL = "dqoes.latency.percentile"
"""The percentile governed, in (0, 100) (default 95)."""
WINDOW_LABEL = "dqoes.latency.window_s"
"""Seconds between readings: each reading covers the requests of one window (default 10)."""
UNIT_LABEL = "dqoes.latency.unit"
"""The metric's unit: s (default) or ms."""
QUERY_LABEL = "dqoes.latency.query"
"""promql: the query giving the latency, {name}, {node} and {model} substituted (required)."""
RATE_QUERY_LABEL = "dqoes.latency.rate_query"
"""promql: a query giving the request rate a second (optional)."""
MATCH_LABEL = "dqoes.latency.match"
"""prometheus: only the series whose labels have these values count, `name=value[,name=value...]`
(e.g. path=/v2/models/resnet50/infer: a server that times other requests in the same histogram)."""

LABELS = (SOURCE_LABEL, PORT_LABEL, PATH_LABEL, METRIC_LABEL, HOST_LABEL, PERCENTILE_LABEL, WINDOW_LABEL,
          UNIT_LABEL, QUERY_LABEL, RATE_QUERY_LABEL, MATCH_LABEL)
KINDS = ("nats", "prometheus", "promql")
UNITS_S = {"s": 1.0, "ms": 0.001}
DEFAULT_PERCENTILE = 95.0
DEFAULT_WINDOW_S = 10.0
MIN_WINDOW_S = 0.5
MAX_WINDOW_S = 3600.0
MAX_QUERY_CHARS = 2000
MAX_MATCHERS = 8
MAX_MATCH_VALUE_CHARS = 200

_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,99}$")
_PATH = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/?-]{0,255}$")


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """How one container's latency is read (from its labels)."""

    kind: str = "nats"
    percentile: float = DEFAULT_PERCENTILE
    window_s: float = DEFAULT_WINDOW_S
    unit_s: float = 1.0
    """Seconds per unit of the metric."""
    port: int | None = None
    path: str = "/metrics"
    metric: str | None = None
    host: str | None = None
    query: str | None = None
    rate_query: str | None = None
    match: tuple[tuple[str, str], ...] = ()
    """prometheus: (label, value) pairs a series must carry to count; empty: every series."""

    @property
    def quantile(self) -> float:
        return self.percentile / 100.0

    @property
    def polled(self) -> bool:
        """The worker reads it (not the container's own NATS events)."""
        return self.kind != "nats"


def parse_source(labels: Mapping[str, str]) -> SourceSpec:
    """The container's latency source from its labels; ValueError (one line) when one is malformed."""
    kind = (labels.get(SOURCE_LABEL) or "nats").strip().lower()
    if kind not in KINDS:
        raise ValueError(f"{SOURCE_LABEL}={labels[SOURCE_LABEL]!r}: choose {', '.join(KINDS)}")
    if kind == "nats":
        return SourceSpec()
    percentile = _number(labels, PERCENTILE_LABEL, DEFAULT_PERCENTILE, 0.0, 100.0, open_ends=True)
    window_s = _number(labels, WINDOW_LABEL, DEFAULT_WINDOW_S, MIN_WINDOW_S, MAX_WINDOW_S)
    unit = (labels.get(UNIT_LABEL) or "s").strip()
    if unit not in UNITS_S:
        raise ValueError(f"{UNIT_LABEL}={unit!r}: choose {' or '.join(UNITS_S)}")
    common = {"kind": kind, "percentile": percentile, "window_s": window_s, "unit_s": UNITS_S[unit]}
    if kind == "prometheus":
        raw_port = labels.get(PORT_LABEL)
        if not raw_port:
            raise ValueError(f"{SOURCE_LABEL}=prometheus needs {PORT_LABEL}")
        if not re.fullmatch(r"[0-9]{1,5}", raw_port.strip()) or not 0 < int(raw_port) < 65536:
            raise ValueError(f"{PORT_LABEL}={raw_port!r} is not a port (1-65535)")
        metric = (labels.get(METRIC_LABEL) or "").strip()
        if not metric:
            raise ValueError(f"{SOURCE_LABEL}=prometheus needs {METRIC_LABEL}")
        if not _METRIC.match(metric):
            raise ValueError(f"{METRIC_LABEL}={metric[:80]!r} is not a Prometheus metric name")
        metric = metric.removesuffix("_bucket")
        path = labels.get(PATH_LABEL) or "/metrics"
        if not _PATH.match(path):
            raise ValueError(f"{PATH_LABEL}={path[:80]!r} is not a URL path (it starts with /)")
        host = labels.get(HOST_LABEL) or None
        if host is not None and not _HOST.match(host):
            raise ValueError(f"{HOST_LABEL}={host[:80]!r} is not a host name or address")
        match = parse_match(labels.get(MATCH_LABEL) or "")
        return SourceSpec(port=int(raw_port), path=path, metric=metric, host=host, match=match,
                          **common)  # type: ignore[arg-type]
    query = (labels.get(QUERY_LABEL) or "").strip()
    if not query:
        raise ValueError(f"{SOURCE_LABEL}=promql needs {QUERY_LABEL}")
    rate_query = (labels.get(RATE_QUERY_LABEL) or "").strip() or None
    for key, text in ((QUERY_LABEL, query), (RATE_QUERY_LABEL, rate_query or "")):
        if len(text) > MAX_QUERY_CHARS or not text.isprintable():
            raise ValueError(f"{key}: at most {MAX_QUERY_CHARS} printable characters")
    return SourceSpec(query=query, rate_query=rate_query, **common)  # type: ignore[arg-type]


def parse_match(text: str) -> tuple[tuple[str, str], ...]:
    """`name=value,name=value` to (name, value) pairs, sorted; "" gives none. A value may hold `=` but
    not `,`; each name once. ValueError (one line) naming the label otherwise."""
    text = text.strip()
    if not text:
        return ()
    pairs: dict[str, str] = {}
    parts = text.split(",")
    if len(parts) > MAX_MATCHERS:
        raise ValueError(f"{MATCH_LABEL}: at most {MAX_MATCHERS} name=value pairs")
    for part in parts:
        name, eq, value = part.strip().partition("=")
        name = name.strip()
        if not eq or not _LABEL_NAME.match(name):
            raise ValueError(f"{MATCH_LABEL}={text[:80]!r}: expected name=value[,name=value...] "
                             "with Prometheus label names")
        if name in pairs:
            raise ValueError(f"{MATCH_LABEL}: label {name!r} given twice")
        if len(value) > MAX_MATCH_VALUE_CHARS or not value.isprintable():
            raise ValueError(f"{MATCH_LABEL}: the value of {name} must be at most {MAX_MATCH_VALUE_CHARS} "
                             "printable characters")
        pairs[name] = value
    return tuple(sorted(pairs.items()))


def substitute(template: str, name: str, node: str, model: str | None, quantile: float | None = None,
               window_s: float | None = None) -> str:
    """A query template with {name}, {node} and {model} replaced (PromQL's own braces left alone),
    each value escaped for a PromQL string; {quantile} (0.95) and {window} (a PromQL duration, 30s)
    by the objective's percentile and window when given."""
    if quantile is not None:
        template = template.replace("{quantile}", f"{quantile:g}")
    if window_s is not None:
        ms = round(window_s * 1000)
        template = template.replace("{window}", f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms")

    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    return (template.replace("{name}", esc(name)).replace("{node}", esc(node))
            .replace("{model}", esc(model or "")))


def _number(labels: Mapping[str, str], key: str, default: float, low: float, high: float,
            *, open_ends: bool = False) -> float:
    raw = labels.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    inside = low < value < high if open_ends else low <= value <= high
    if not math.isfinite(value) or not inside:
        ends = f"({low:g}, {high:g})" if open_ends else f"[{low:g}, {high:g}]"
        raise ValueError(f"{key}={raw[:40]!r} is not a number in {ends}")
    return value
