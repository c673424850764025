"""The latency-source contract: every source (prometheus scrape, promql) behaves the same on real parts.

Each harness wraps a real process exporting a histogram (tests/latency_target.py,
driven with requests of known latency) and the source under test: the
`prometheus` source scrapes the process itself, the `promql` source asks a
real Prometheus server (Debian's /usr/bin/prometheus) that scrapes it. Every
behaviour is written once:

- after requests of known latency, the reading is the percentile of the raw
  latencies within the width of the bucket that holds it, with a request rate;
- a window without requests gives no value ("idle"), never a crash;
- a source that does not answer gives no value ("unreachable") and recovers
  by itself when it answers again.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from latency_parts import METRIC, PrometheusServer, Target, bucket_width_at

from shared.core.quantiles import WindowReading, exact_quantile
from shared.latency.sources import LatencySource, PromQLSource, ScrapeSource

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

Q = 0.95
WINDOW = "30s"  # longer than any test: every window starts before the test's requests


def sleeps_ms(n: int = 120, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(2.0, 300.0) for _ in range(n)]


class Harness:
    kind: str
    target: Target

    def source(self) -> LatencySource:
        raise NotImplementedError

    def settle(self) -> None:
        """Until the source can see what the target did (Prometheus scraped it)."""

    def break_source(self) -> None:
        raise NotImplementedError

    def restore_source(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.target.stop()


class ScrapeHarness(Harness):
    kind = "prometheus"

    def __init__(self, tmp: Path) -> None:
        self.target = Target().start()

    def source(self) -> LatencySource:
        return ScrapeSource(self.target.url, METRIC, Q)

    def break_source(self) -> None:
        self.target.stop()

    def restore_source(self) -> None:
        self.target.start()


class PromQLHarness(Harness):
    kind = "promql"

    def __init__(self, tmp: Path) -> None:
        self.target = Target().start()
        self.prom = PrometheusServer(tmp / "prometheus", [f"127.0.0.1:{self.target.port}"])
        try:
            self.prom.start()
            self.prom.wait_scraped()
        except BaseException:
            self.close()
            raise

    def source(self) -> LatencySource:
        return PromQLSource(
            self.prom.url,
            f'histogram_quantile({Q}, sum by (le) (rate({METRIC}_bucket{{job="t"}}[{WINDOW}])))',
            rate_query=f'sum(rate({METRIC}_count{{job="t"}}[{WINDOW}]))')

    def settle(self) -> None:
        self.prom.wait_scraped()

    def break_source(self) -> None:
        self.prom.stop()

    def restore_source(self) -> None:
        self.prom.start()
        self.prom.wait_scraped()

    def close(self) -> None:
        self.prom.stop()
        super().close()


@pytest.fixture(params=["prometheus", "promql"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    h: Harness = ScrapeHarness(tmp_path) if request.param == "prometheus" else PromQLHarness(tmp_path)
    try:
        yield h
    finally:
        h.close()


def read(source: LatencySource) -> WindowReading:
    return asyncio.run(source.read(time.monotonic()))


def test_reading_is_the_raw_percentile_within_a_bucket(harness: Harness) -> None:
    source = harness.source()
    read(source)  # the first window starts here
    raw = harness.target.drive(sleeps_ms())
    harness.settle()
    r = read(source)
    exact = exact_quantile(Q, raw)
    assert r.state == "ok" and r.latency_s is not None, r
    assert abs(r.latency_s - exact) <= bucket_width_at(exact), (r, exact)
    assert r.rate_per_s is not None and r.rate_per_s > 0, r


def test_a_window_without_requests_gives_no_value(harness: Harness) -> None:
    source = harness.source()
    read(source)
    harness.settle()
    r = read(source)
    assert r.state == "idle" and r.latency_s is None, r
    assert "no requests" in r.detail


def test_a_source_that_does_not_answer_gives_no_value_then_recovers(harness: Harness) -> None:
    source = harness.source()
    read(source)
    harness.break_source()
    r = read(source)
    assert r.state == "unreachable" and r.latency_s is None, r
    assert r.detail  # says what did not answer
    harness.restore_source()
    read(source)  # the process may have restarted: a new window starts
    raw = harness.target.drive(sleeps_ms(seed=2))
    harness.settle()
    r = read(source)
    exact = exact_quantile(Q, raw)
    assert r.latency_s is not None and r.state in ("ok", "reset"), r
    assert abs(r.latency_s - exact) <= bucket_width_at(exact), (r, exact)
