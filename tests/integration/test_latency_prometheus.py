"""The `prometheus` and `promql` latency sources on real parts, beyond their shared contract.

A real process exports a histogram and a summary (tests/latency_target.py);
a real Prometheus server scrapes it for the agreement check. What a
container's metrics page can do wrong (garbage, nothing yet, a restart that
resets its counters) gives a clear state and never an exception.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from pathlib import Path

import pytest
from latency_parts import METRIC, SUMMARY, PrometheusServer, Target, bucket_width_at

from shared.core.quantiles import WindowReading, exact_quantile
from shared.latency.sources import LatencySource, PromQLSource, ScrapeSource

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

Q = 0.95


def read(source: LatencySource) -> WindowReading:
    return asyncio.run(source.read(time.monotonic()))


def sleeps(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(2.0, 400.0) for _ in range(n)]


def test_promql_gives_the_number_the_scrape_computes(tmp_path: Path) -> None:
    """histogram_quantile(q, rate(m_bucket[w])) in Prometheus and the worker's own bucket increases agree."""
    with Target() as target, PrometheusServer(tmp_path, [f"127.0.0.1:{target.port}"]) as prom:
        prom.wait_scraped()
        scrape = ScrapeSource(target.url, METRIC, Q)
        promql = PromQLSource(prom.url, f'histogram_quantile({Q}, rate({METRIC}_bucket{{job="t"}}[30s]))')
        read(scrape)
        raw = target.drive(sleeps(150, 7))
        prom.wait_scraped()
        mine, theirs = read(scrape), read(promql)
        assert mine.state == theirs.state == "ok", (mine, theirs)
        assert mine.latency_s is not None and theirs.latency_s is not None
        assert math.isclose(mine.latency_s, theirs.latency_s, rel_tol=1e-9), (mine, theirs)
        exact = exact_quantile(Q, raw)
        assert abs(mine.latency_s - exact) <= bucket_width_at(exact)


def test_garbage_and_an_empty_page_give_a_clear_state_and_recover() -> None:
    with Target() as target:
        source = ScrapeSource(target.url, METRIC, Q)
        read(source)
        target.mode("garbage")
        r = read(source)
        assert r.state == "bad" and r.latency_s is None and "Prometheus text format" in r.detail, r
        target.mode("empty")
        r = read(source)
        assert r.state == "empty" and r.latency_s is None and METRIC in r.detail, r
        target.mode("normal")
        raw = target.drive(sleeps(60, 3))
        r = read(source)
        exact = exact_quantile(Q, raw)
        assert r.state == "ok" and r.latency_s is not None, r
        assert abs(r.latency_s - exact) <= bucket_width_at(exact)


def test_a_counter_reset_counts_the_new_process_from_zero() -> None:
    """The server restarts between two scrapes with fewer requests than before: PromQL's rate counts
    the new counts from zero, and so does the source (state "reset")."""
    target = Target().start()
    try:
        source = ScrapeSource(target.url, METRIC, Q)
        read(source)
        target.drive(sleeps(80, 4))
        assert read(source).state == "ok"
        target.stop()
        target.start()  # same port, counters from zero
        raw = target.drive([250.0 + 10 * i for i in range(20)])  # all in the (0.25, 0.5] bucket
        r = read(source)
        assert r.state == "reset" and r.latency_s is not None and "reset" in r.detail, r
        assert r.requests == 20
        exact = exact_quantile(Q, raw)
        assert abs(r.latency_s - exact) <= bucket_width_at(exact), (r, exact)
    finally:
        target.stop()


def test_a_summary_gives_its_own_quantile_and_the_rate_from_its_count() -> None:
    with Target() as target:
        source = ScrapeSource(target.url, SUMMARY, Q)
        read(source)
        raw = target.drive(sleeps(40, 5))
        r = read(source)
        assert r.state == "ok" and r.requests == 40 and r.rate_per_s and r.rate_per_s > 0, r
        assert r.latency_s == pytest.approx(exact_quantile(Q, raw), rel=1e-9)
        other = ScrapeSource(target.url, SUMMARY, 0.75)
        assert read(other).state == "baseline"
        missing = read(other)
        assert missing.state == "bad" and "no quantile 0.75" in missing.detail, missing
        r = read(source)
        assert r.state == "idle", r


def test_a_missing_endpoint_is_unreachable_not_an_error() -> None:
    target = Target()  # a free port nothing listens on
    r = read(ScrapeSource(target.url, METRIC, Q))
    assert r.state == "unreachable" and str(target.port) in r.detail, r
    r = read(PromQLSource(f"http://127.0.0.1:{target.port}", "up"))
    assert r.state == "unreachable", r


def test_promql_refusals_are_clear(tmp_path: Path) -> None:
    with Target() as target, PrometheusServer(tmp_path, [f"127.0.0.1:{target.port}"]) as prom:
        prom.wait_scraped()
        r = read(PromQLSource(prom.url, "histogram_quantile(0.95, rate("))
        assert r.state == "bad" and "parse error" in r.detail, r
        r = read(PromQLSource(prom.url, 'up{job="nothing-here"}'))
        assert r.state == "empty", r
        r = read(PromQLSource(prom.url, f'{METRIC}_bucket{{job="t"}}'))  # one series per bucket
        assert r.state == "bad" and "series" in r.detail, r
