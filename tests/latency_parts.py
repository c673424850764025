"""Real parts for the latency-source tests: a process exporting a histogram, and a Prometheus server.

`Target` runs tests/latency_target.py (a prometheus_client HTTP server the
test drives with requests of known latency); `PrometheusServer` runs
Debian's /usr/bin/prometheus on a free port with a configuration that
scrapes given targets every 0.2 s (never the systemd service). Both are
stopped terminate, wait, kill. Where prometheus is missing the tests that
need it skip, unless DQOES_REQUIRE_PROMETHEUS=1 (CI), then they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest

from shared.ports import free_port

TARGET = Path(__file__).resolve().parent / "latency_target.py"
METRIC = "request_latency_seconds"
SUMMARY = "request_latency_summary_seconds"
BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SCRAPE_S = 0.2
PROMETHEUS = os.environ.get("DQOES_PROMETHEUS_BIN", "/usr/bin/prometheus")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout_s: float = 10.0) -> bytes:
    with _NO_PROXY.open(url, timeout=timeout_s) as r:
        data: bytes = r.read()
        return data


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Target:
    """A histogram-exporting process on 127.0.0.1:`port` (a free port, or the one given)."""

    def __init__(self, port: int | None = None, cpu_ms: float = 0.0) -> None:
        self.port = port or free_port()
        self.cpu_ms = cpu_ms
        self.proc: subprocess.Popen | None = None

    @property
    def argv(self) -> list[str]:
        return [sys.executable, str(TARGET), "--port", str(self.port), "--cpu-ms", str(self.cpu_ms)]

    def start(self) -> Target:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("port "), f"latency target did not start: {line!r}"
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None

    def __enter__(self) -> Target:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def mode(self, page: str) -> None:
        get(f"http://127.0.0.1:{self.port}/mode?page={page}")

    def drive(self, sleeps_ms: list[float], parallel: int = 16) -> list[float]:
        """Requests that sleep the given times, `parallel` at once; their latencies as the server measured."""

        def one(ms: float) -> float:
            return float(get(f"http://127.0.0.1:{self.port}/work?ms={ms}"))

        with ThreadPoolExecutor(parallel) as pool:
            return list(pool.map(one, sleeps_ms))


def bucket_width_at(value_s: float) -> float:
    """Width of the histogram bucket that holds `value_s` (the bound on a histogram's error there)."""
    low = 0.0
    for high in BUCKETS_S:
        if value_s <= high:
            return high - low
        low = high
    return float("inf")


def need_prometheus() -> str:
    if Path(PROMETHEUS).exists() or shutil.which(PROMETHEUS):
        return PROMETHEUS
    reason = f"no Prometheus server at {PROMETHEUS} (Debian: apt-get install -y prometheus)"
    if os.environ.get("DQOES_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(f"{reason} (and DQOES_REQUIRE_PROMETHEUS=1)")
    pytest.skip(f"{reason}; set DQOES_REQUIRE_PROMETHEUS=1 to make this a failure")


class PrometheusServer:
    """A private Prometheus scraping `targets` (host:port) as job "t", every SCRAPE_S seconds."""

    def __init__(self, directory: Path, targets: list[str]) -> None:
        self.binary = need_prometheus()
        self.dir = directory
        self.port = free_port()
        self.targets = targets
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {int(SCRAPE_S * 1000)}ms\n"
            f"  scrape_timeout: {int(SCRAPE_S * 1000)}ms\n"
            "scrape_configs:\n"
            "  - job_name: t\n"
            "    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in self.targets)}]\n"
        )
        self.log = open(self.dir / "prometheus.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.dir / 'prometheus.log').read_text()[-2000:]}")
            try:
                get(f"{self.url}/-/ready", 1.0)
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("prometheus not ready after 30 s")

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None
            self.log.close()

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def query(self, promql: str) -> dict:
        return orjson.loads(get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))

    def wait_scraped(self, times: int = 3, timeout_s: float = 20.0) -> None:
        """Until every target has been scraped `times` more times (its samples are in the window)."""
        deadline = time.monotonic() + timeout_s
        want = None
        while time.monotonic() < deadline:
            r = self.query("sum(count_over_time(up[1h]))")["data"]["result"]
            have = int(float(r[0]["value"][1])) if r else 0
            want = have + times * len(self.targets) if want is None else want
            if have >= want and r:
                return
            time.sleep(SCRAPE_S / 2)
        raise AssertionError("prometheus did not scrape the targets")
