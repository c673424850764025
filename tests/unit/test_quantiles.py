"""PromQL's histogram_quantile and rate rules (shared.core.quantiles) against brute-force references.

The reference for the quantile is written another way: the histogram's
piecewise-linear cumulative curve, searched by bisection for where it reaches
the rank. The reference for a window is the raw observations themselves.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.quantiles import (
    Histogram,
    Summary,
    bucket_quantile,
    exact_quantile,
    histogram_window,
    increase,
    summary_window,
    window,
)

BOUNDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf)


def cumulative(values: list[float], bounds: tuple[float, ...] = BOUNDS) -> tuple[tuple[float, float], ...]:
    return tuple((le, float(sum(1 for v in values if v <= le))) for le in bounds)


def reference_quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float:
    """Where the linear-within-buckets cumulative curve first reaches q * total (bisection)."""
    finite = [(le, c) for le, c in buckets if math.isfinite(le)]
    total = buckets[-1][1]
    rank = q * total
    if total == 0:
        return math.nan
    if not finite or finite[-1][1] < rank:
        return finite[-1][0] if finite else math.nan
    points = [(0.0, 0.0)] + finite  # the curve: from (0, 0) through every (bound, count)
    for (x0, c0), (x1, c1) in zip(points, points[1:], strict=False):
        if c1 >= rank and c1 > c0:
            lo, hi = x0, x1
            for _ in range(200):
                mid = (lo + hi) / 2
                if c0 + (c1 - c0) * (mid - x0) / (x1 - x0) >= rank:
                    hi = mid
                else:
                    lo = mid
            return hi
        if c1 >= rank:  # an empty bucket that already holds the rank: its upper bound
            return x1
    raise AssertionError("unreachable")


latencies = st.lists(st.floats(min_value=0.0001, max_value=8.0, allow_nan=False), min_size=1, max_size=300)
quantile = st.floats(min_value=0.01, max_value=0.99)


@settings(max_examples=300, deadline=None)
@given(latencies, quantile)
def test_bucket_quantile_matches_the_curve_reference(values: list[float], q: float) -> None:
    buckets = cumulative(values)
    got, want = bucket_quantile(q, buckets), reference_quantile(q, buckets)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(latencies, quantile)
def test_the_estimate_is_within_the_bucket_of_the_exact_percentile(values: list[float], q: float) -> None:
    got = bucket_quantile(q, cumulative(values))
    exact = exact_quantile(q, values)
    low = max([0.0] + [le for le in BOUNDS if le < exact])
    high = min(le for le in BOUNDS if le >= exact)
    if math.isinf(high):  # above every finite bound: PromQL answers the highest one
        assert got == BOUNDS[-2]
    else:
        assert low <= got <= high


@settings(max_examples=200, deadline=None)
@given(latencies, latencies, quantile)
def test_a_window_is_the_quantile_of_the_requests_in_it(first: list[float], second: list[float], q: float) -> None:
    before = Histogram(cumulative(first))
    after = Histogram(cumulative(first + second))
    r = histogram_window(q, before, after, elapsed_s=10.0)
    assert r.state == "ok" and r.requests == len(second)
    assert r.rate_per_s == pytest.approx(len(second) / 10.0)
    assert r.latency_s == pytest.approx(bucket_quantile(q, cumulative(second)), rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(latencies, latencies, quantile)
def test_a_counter_reset_counts_from_zero(old: list[float], new: list[float], q: float) -> None:
    """Every bucket's new count is below its old one (the process restarted with fewer requests)."""
    old = old + new + [0.001]  # more in every bucket than the new process has
    before, after = Histogram(cumulative(old)), Histogram(cumulative(new))
    r = histogram_window(q, before, after, elapsed_s=5.0)
    assert r.state == "reset" and "reset" in r.detail
    assert r.requests == len(new)
    assert r.latency_s == pytest.approx(bucket_quantile(q, cumulative(new)), rel=1e-9)


def test_promql_edge_rules() -> None:
    b = ((0.1, 2.0), (0.2, 4.0), (math.inf, 4.0))
    assert bucket_quantile(-0.1, b) == -math.inf
    assert bucket_quantile(1.1, b) == math.inf
    assert math.isnan(bucket_quantile(math.nan, b))
    assert math.isnan(bucket_quantile(0.5, ((0.1, 2.0), (0.2, 4.0))))  # no +Inf bucket
    assert math.isnan(bucket_quantile(0.5, ((0.1, 0.0), (math.inf, 0.0))))  # no observations
    assert math.isnan(bucket_quantile(0.5, ((math.inf, 3.0),)))  # one bucket
    assert bucket_quantile(0.5, b) == pytest.approx(0.1)  # rank 2 reached at the first bound
    assert bucket_quantile(0.99, ((0.1, 1.0), (0.2, 1.0), (math.inf, 5.0))) == 0.2  # in +Inf: highest finite
    assert bucket_quantile(0.25, ((-1.0, 2.0), (0.5, 4.0), (math.inf, 4.0))) == -1.0  # first bound <= 0
    # same bound twice (two series): added up; a count below an earlier one is raised to it
    assert bucket_quantile(0.5, ((0.1, 1.0), (0.1, 1.0), (0.2, 4.0), (math.inf, 4.0))) == pytest.approx(0.1)
    assert bucket_quantile(0.75, ((0.1, 2.0), (0.2, 1.0), (0.4, 4.0), (math.inf, 4.0))) == pytest.approx(0.3)
    assert math.isnan(bucket_quantile(0.0, ((0.1, 0.0), (math.inf, 3.0))))  # Go's 0/0


def test_increase_and_window_states() -> None:
    assert increase(5.0, 8.0) == (3.0, False)
    assert increase(8.0, 5.0) == (5.0, True)
    h = Histogram(((0.1, 3.0), (math.inf, 4.0)))
    assert window(0.5, None, h, 1.0).state == "baseline"
    idle = histogram_window(0.5, h, h, 10.0)
    assert idle.state == "idle" and idle.latency_s is None and idle.rate_per_s == 0.0
    other = Histogram(((0.2, 1.0), (math.inf, 1.0)))  # other bounds: a restarted server, counted from zero
    r = histogram_window(0.5, h, other, 10.0)
    assert r.state == "reset" and r.latency_s == pytest.approx(0.1)
    assert histogram_window(0.5, h, Histogram(((0.1, 3.0),)), 1.0).state == "bad"
    ms = histogram_window(0.5, Histogram(((100.0, 0.0), (math.inf, 0.0))),
                          Histogram(((100.0, 2.0), (math.inf, 2.0))), 1.0, unit_s=0.001)
    assert ms.latency_s == pytest.approx(0.05)
    assert window(0.5, h, Summary(((0.5, 1.0),), 3.0), 1.0).state == "baseline"  # changed type


def test_summary_window_states() -> None:
    before = Summary(((0.5, 0.1), (0.95, 0.3)), count=10.0)
    after = Summary(((0.5, 0.12), (0.95, 0.4)), count=30.0)
    r = summary_window(0.95, before, after, 10.0)
    assert r.state == "ok" and r.latency_s == 0.4 and r.requests == 20 and r.rate_per_s == 2.0
    assert summary_window(0.95, after, after, 10.0).state == "idle"
    bad = summary_window(0.9, before, after, 10.0)
    assert bad.state == "bad" and "0.5, 0.95" in bad.detail
    nan = summary_window(0.95, before, Summary(((0.95, math.nan),), 40.0), 10.0)
    assert nan.state == "bad"
    assert summary_window(0.95, after, before, 10.0).state == "reset"
