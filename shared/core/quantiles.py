"""Latency percentiles from Prometheus histograms and summaries, computed as PromQL computes them.

Why: a model server already exports its request latency as a Prometheus
histogram; DQoES reads it there (the `prometheus` latency source,
docs/guide/latency-sources.md) instead of asking the server to publish
batches on NATS. The number the controller gets must be the one an operator
sees in Prometheus for `histogram_quantile(q, rate(m_bucket[w]))`, so the
rules here are PromQL's (promql/quantile.go, Prometheus 2.42):

- buckets are cumulative counts by upper bound `le`; the highest must be
  +Inf (else no value); buckets with the same bound are added together;
  a bound whose count is below an earlier one's is raised to it;
- rank = q * observations, observations = the +Inf bucket's count; the
  first bucket whose count reaches the rank holds the quantile, linearly
  interpolated inside it (from 0 for the first bucket, unless its bound
  is <= 0, then that bound); a rank in the +Inf bucket gives the highest
  finite bound; q < 0 gives -Inf, q > 1 +Inf, no observations no value;
- `rate` over a window: per series the increase between the two samples,
  where a sample below the one before is a counter reset (the process
  restarted): the increase is then the new value itself. A rate's
  extrapolation multiplies every bucket by the same factor, which no
  quantile sees, so the quantile of the increases is PromQL's number.

Pure: no I/O, no clock; the adapters (shared/latency) hand snapshots in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Bucket = tuple[float, float]
"""(upper bound `le`, cumulative count)."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """One scrape of a histogram: cumulative counts by upper bound, over all its series added up."""

    buckets: tuple[Bucket, ...]
    """Sorted by bound; the last one +Inf in a well-formed histogram."""
    sum_s: float | None = None


@dataclass(frozen=True, slots=True)
class Summary:
    """One scrape of a summary: the quantiles its client computed (over the client's own window)."""

    quantiles: tuple[tuple[float, float], ...]
    """(quantile in [0, 1], value) pairs, sorted by quantile."""
    count: float
    sum_s: float | None = None


Snapshot = Histogram | Summary

State = Literal["ok", "reset", "idle", "baseline", "bad", "empty", "unreachable"]
"""What a window gave: a value ("ok"; "reset": a counter reset was counted from zero, as PromQL's
rate does), no value ("idle": no request finished in the window; "baseline": the first scrape, a
window needs two; "bad": the metric cannot give a quantile, `detail` says why; set by the adapters:
"empty": the source has no such metric or series, "unreachable": it did not answer)."""


@dataclass(frozen=True, slots=True)
class WindowReading:
    """The latency percentile and request rate over one window between two scrapes."""

    state: State
    latency_s: float | None = None
    """The percentile, in the metric's unit scaled to seconds; None without a value."""
    requests: float = 0.0
    """Requests that finished in the window."""
    rate_per_s: float | None = None
    """Requests a second over the window; None without a window."""
    detail: str = ""

    @property
    def has_value(self) -> bool:
        return self.latency_s is not None


def bucket_quantile(q: float, buckets: Iterable[Bucket]) -> float:
    """PromQL's `histogram_quantile(q, ...)` on one set of cumulative buckets; NaN when it has no value."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for le, count in buckets:
        merged[le] = merged.get(le, 0.0) + count
    bounds = sorted(merged)
    if not bounds or not (math.isinf(bounds[-1]) and bounds[-1] > 0):
        return math.nan
    counts = [merged[le] for le in bounds]
    highest = -math.inf
    for i, c in enumerate(counts):  # ensureMonotonic
        if c > highest:
            highest = c
        elif c < highest:
            counts[i] = highest
    if len(bounds) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(bounds) - 1) if counts[i] >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # rank 0 in an empty first bucket: Go's 0/0
        return math.nan
    return start + (end - start) * (rank / count)


def increase(before: float, after: float) -> tuple[float, bool]:
    """A counter's increase between two samples and whether it was reset in between (PromQL's rule)."""
    if after < before:
        return after, True
    return after - before, False


def histogram_window(q: float, before: Histogram, after: Histogram, elapsed_s: float,
                     unit_s: float = 1.0) -> WindowReading:
    """The q-quantile and the request rate between two scrapes of one histogram.

    `unit_s`: seconds per unit of the metric (1 for `_seconds`, 0.001 for milliseconds).
    A histogram whose bucket bounds changed between the scrapes (a restarted server with other
    buckets) counts as reset: its new counts are the window's.
    """
    if not after.buckets or not math.isinf(after.buckets[-1][0]):
        return WindowReading("bad", detail="the histogram has no +Inf bucket")
    reset = [le for le, _ in before.buckets] != [le for le, _ in after.buckets]
    if reset:
        deltas = list(after.buckets)
    else:
        deltas = []
        for (le, was), (_, now) in zip(before.buckets, after.buckets, strict=True):
            d, r = increase(was, now)
            reset = reset or r
            deltas.append((le, d))
    requests = max(0.0, deltas[-1][1])
    rate = requests / elapsed_s if elapsed_s > 0 else None
    if requests == 0:
        return WindowReading("idle", requests=0.0, rate_per_s=rate, detail="no requests in the window")
    value = bucket_quantile(q, deltas)
    if not math.isfinite(value):
        return WindowReading("bad", requests=requests, rate_per_s=rate,
                             detail=f"the quantile is {value} (the highest bucket holds it and no finite bound is below)")
    if value <= 0:
        return WindowReading("bad", requests=requests, rate_per_s=rate,
                             detail=f"the quantile is {value:g}: a latency is above 0 (buckets with bounds <= 0?)")
    return WindowReading("reset" if reset else "ok", value * unit_s, requests, rate,
                         "counter reset: counted from zero" if reset else "")


def summary_window(q: float, before: Summary, after: Summary, elapsed_s: float,
                   unit_s: float = 1.0) -> WindowReading:
    """The summary's own q-quantile, with the request rate from its count, between two scrapes.

    A summary's quantiles cannot be recomputed for a window: the value is what the client
    reports now (over the client's own window), taken when requests finished in this one.
    """
    found = [v for quantile, v in after.quantiles if math.isclose(quantile, q, abs_tol=1e-9)]
    if not found:
        have = ", ".join(f"{quantile:g}" for quantile, _ in after.quantiles) or "none"
        return WindowReading("bad", detail=f"the summary has no quantile {q:g} (it has {have})")
    requests, reset = increase(before.count, after.count)
    rate = requests / elapsed_s if elapsed_s > 0 else None
    if requests == 0:
        return WindowReading("idle", requests=0.0, rate_per_s=rate, detail="no requests in the window")
    value = found[0]
    if not math.isfinite(value) or value <= 0:
        return WindowReading("bad", requests=requests, rate_per_s=rate, detail=f"quantile {q:g} is {value}")
    return WindowReading("reset" if reset else "ok", value * unit_s, requests, rate,
                         "counter reset: counted from zero" if reset else "")


def window(q: float, before: Snapshot | None, after: Snapshot, elapsed_s: float,
           unit_s: float = 1.0) -> WindowReading:
    """The reading between two scrapes of one metric (`before` None: the first, a baseline)."""
    if before is None:
        return WindowReading("baseline", detail="first scrape: a window needs two")
    if isinstance(after, Histogram) and isinstance(before, Histogram):
        return histogram_window(q, before, after, elapsed_s, unit_s)
    if isinstance(after, Summary) and isinstance(before, Summary):
        return summary_window(q, before, after, elapsed_s, unit_s)
    return WindowReading("baseline", detail="the metric changed type: starting again")


def exact_quantile(q: float, values: Sequence[float]) -> float:
    """The q-quantile of raw values (the smallest value with at least q of them at or below it).

    The reference a histogram's estimate is checked against: the estimate is within the width
    of the bucket that holds this value."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[min(k, len(ordered) - 1)]
