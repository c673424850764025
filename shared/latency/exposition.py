"""The Prometheus text format to one histogram or summary snapshot (`shared.core.quantiles`).

Why prometheus_client's parser (`text_string_to_metric_families`): the
format has escapes, comments, TYPE lines and timestamps that a home-grown
parser gets wrong at the edges; the project already depends on the client.

Every series of the metric is added up by bucket bound, as
`sum by (le) (...)` would (a server that labels its histogram by route or
method is governed on all its requests). A page without TYPE lines still
works: the series are recognised by their names (`<metric>_bucket` with an
`le` label, `<metric>` with a `quantile` label). With `match`, only the series
carrying those label values are added up (as `sum by (le)
(m_bucket{path="/infer"})` would): a server that times its health and metadata
requests in the same histogram is governed on its inference requests alone. Anything else is an
`ExpositionError` with one line saying what was wrong, never another
exception: the text comes from a container.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from shared.core.quantiles import Histogram, Snapshot, Summary

MAX_BYTES = 8 * 1024 * 1024
"""A metrics page larger than this is refused (a model server's is kilobytes)."""


class ExpositionError(ValueError):
    """The page cannot give the metric: unparsable, missing, or malformed (one line)."""


class MetricMissing(ExpositionError):
    """The page parsed, but has no histogram or summary of that name (the server exports nothing yet)."""


def parse_metric(text: str, metric: str, match: Sequence[tuple[str, str]] = ()) -> Snapshot:
    """The histogram (or summary) named `metric` in a Prometheus text page, its series added up
    (those whose labels carry every (name, value) of `match`)."""
    if len(text) > MAX_BYTES:
        raise ExpositionError(f"metrics page over {MAX_BYTES} bytes")
    buckets: dict[float, float] = defaultdict(float)
    quantiles: dict[float, list[float]] = defaultdict(list)
    count = total = 0.0
    seen_count = seen_sum = False
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if match and not all(s.labels.get(k) == v for k, v in match):
                    continue
                if s.name == metric + "_bucket" and "le" in s.labels:
                    buckets[_number(s.labels["le"], "le")] += _count(s.value, s.name)
                elif s.name == metric and "quantile" in s.labels:
                    q = _number(s.labels["quantile"], "quantile")
                    if not 0.0 <= q <= 1.0:
                        raise ExpositionError(f"{metric}: quantile {q} is not in [0, 1]")
                    quantiles[q].append(float(s.value))
                elif s.name == metric + "_count":
                    count += _count(s.value, s.name)
                    seen_count = True
                elif s.name == metric + "_sum":
                    total += float(s.value)
                    seen_sum = True
    except ExpositionError:
        raise
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, UnicodeError) as e:
        raise ExpositionError(f"not the Prometheus text format: {_one_line(e)}") from None
    if buckets and quantiles:
        raise ExpositionError(f"{metric} has both buckets and quantiles")
    if buckets:
        bounds = sorted(buckets)
        if not math.isinf(bounds[-1]):
            raise ExpositionError(f"{metric} has no +Inf bucket")
        return Histogram(tuple((le, buckets[le]) for le in bounds), total if seen_sum else None)
    if quantiles:
        several = [q for q, vs in quantiles.items() if len(vs) > 1]
        if several:
            raise ExpositionError(f"{metric} is a summary with several series: its quantiles cannot be added "
                                  "up (export one series, or use a histogram)")
        if not seen_count:
            raise ExpositionError(f"{metric} is a summary without {metric}_count")
        return Summary(tuple(sorted((q, vs[0]) for q, vs in quantiles.items())), count,
                       total if seen_sum else None)
    if match:
        wanted = ",".join(f"{k}={v}" for k, v in match)
        raise MetricMissing(f"no series of {metric} with {wanted[:120]} on the page")
    raise MetricMissing(f"no histogram or summary named {metric} on the page")


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ExpositionError(f"{what}={text[:40]!r} is not a number") from None
    if math.isnan(value):
        raise ExpositionError(f"{what} is NaN")
    return value


def _count(value: float, name: str) -> float:
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ExpositionError(f"{name} is {v}: a count is a finite number >= 0")
    return v


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] or type(e).__name__
