"""A small model-server stand-in for the latency-source tests: a real process exporting a histogram.

`python tests/latency_target.py [--port N] [--cpu-ms X]` serves, on one port:
- GET /metrics: the Prometheus text page (prometheus_client), with the
  histogram `request_latency_seconds` and the summary `request_latency_summary_seconds`
  (quantile labels, written by hand: the Python client's summary has none);
- GET /work?ms=N: a request that sleeps N ms; it observes its measured
  duration and answers it (seconds, as text), so a test knows the raw latencies;
- GET /mode?page=garbage|normal|empty: what /metrics serves from now on.
With --cpu-ms X it also serves itself, one request after another, each burning
X ms of CPU time (its latency then follows the CPU limit it runs under).
It prints "port N" once listening.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Histogram, generate_latest

BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SUMMARY_QUANTILES = (0.5, 0.9, 0.95, 0.99)

registry = CollectorRegistry()
latency = Histogram("request_latency_seconds", "Request latency.", buckets=BUCKETS_S, registry=registry)
mode = {"page": "normal"}
observed: list[float] = []
lock = threading.Lock()


def observe(seconds: float) -> None:
    latency.observe(seconds)
    with lock:
        observed.append(seconds)


def summary_page() -> str:
    with lock:
        values = sorted(observed)
    lines = ["# TYPE request_latency_summary_seconds summary"]
    for q in SUMMARY_QUANTILES:
        v = values[max(0, math.ceil(q * len(values)) - 1)] if values else math.nan
        lines.append(f'request_latency_summary_seconds{{quantile="{q}"}} {v}')
    lines.append(f"request_latency_summary_seconds_count {len(values)}")
    lines.append(f"request_latency_summary_seconds_sum {sum(values)}")
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, body: str, code: int = 200) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/metrics":
            page = mode["page"]
            if page == "garbage":
                self._answer("request_latency_seconds_bucket{le=0.1 not a metric page {{{\n\x00")
            elif page == "empty":
                self._answer("# nothing here yet\n")
            else:
                self._answer(generate_latest(registry).decode() + summary_page())
        elif url.path == "/work":
            started = time.perf_counter()
            time.sleep(float(query.get("ms", ["0"])[0]) / 1000.0)
            took = time.perf_counter() - started
            observe(took)
            self._answer(repr(took))
        elif url.path == "/mode":
            mode["page"] = query.get("page", ["normal"])[0]
            self._answer("ok")
        else:
            self._answer("not found", 404)


def serve_itself(cpu_ms: float) -> None:
    while True:
        started = time.perf_counter()
        cpu0 = time.thread_time()
        x = 0
        while time.thread_time() - cpu0 < cpu_ms / 1000.0:
            x += 1
        observe(time.perf_counter() - started)
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--cpu-ms", type=float, default=0.0)
    a = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    if a.cpu_ms > 0:
        threading.Thread(target=serve_itself, args=(a.cpu_ms,), daemon=True).start()
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
