"""lab loadgen against real HTTP servers whose delays are known: its percentiles must show them."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from lab import loadgen

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)

FAST_S, SLOW_S = 0.05, 0.3


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    serial = False
    seen = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.seen += 1
            n = self.server.seen
            if self.server.serial:  # one request at a time: a server that falls behind
                time.sleep(FAST_S * 2)
        if not self.server.serial:
            time.sleep(SLOW_S if n % 10 == 0 else FAST_S)  # every tenth request is slow
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def delay_server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.lock = threading.Lock()  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: _Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/predict"


def test_percentiles_match_known_delays(delay_server):
    (w,) = loadgen.run(_url(delay_server), b"{}", [loadgen.Step(20.0, 4.0)], seed=3)
    assert w.errors == 0 and w.answered == w.due == delay_server.seen
    assert w.due >= 40
    # 10% of requests take SLOW_S: the median is a fast one, p95 and p99 are slow ones. Latency can only
    # exceed the server's delay (client and network overhead, a few ms here; generous bound).
    assert FAST_S <= w.p50_s < FAST_S + 0.1
    assert SLOW_S <= w.p95_s < SLOW_S + 0.2
    assert SLOW_S <= w.p99_s <= w.max_s < SLOW_S + 0.2


def test_a_server_that_falls_behind_shows_its_queue(delay_server):
    # Serial at 0.1 s a request, asked for 20 a second: requests due later wait behind earlier ones. Timed
    # from when each was due, the tail is seconds; a client that timed from its own send (or waited for each
    # answer before the next) would see 0.1 s.
    delay_server.serial = True
    (w,) = loadgen.run(_url(delay_server), b"{}", [loadgen.Step(20.0, 2.0)], seed=1)
    assert w.errors == 0
    assert w.p50_s > 0.3
    assert w.p95_s > 1.0


def test_rate_steps_make_windows():
    plan = loadgen.schedule([loadgen.Step(10.0, 5.0), loadgen.Step(40.0, 5.0)], seed=7)
    assert plan == loadgen.schedule([loadgen.Step(10.0, 5.0), loadgen.Step(40.0, 5.0)], seed=7)
    first = [t for t, w in plan if w == 0]
    second = [t for t, w in plan if w == 1]
    assert all(0 <= t < 5 for t in first) and all(5 <= t < 10 for t in second)
    assert 20 <= len(first) <= 85 and 120 <= len(second) <= 290  # Poisson(50), Poisson(200): beyond 4 sigma
    assert [t for t, _ in plan] == sorted(t for t, _ in plan)


def test_percentile_is_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert loadgen.percentile(xs, 50) == 50.0
    assert loadgen.percentile(xs, 95) == 95.0
    assert loadgen.percentile(xs, 99) == 99.0
    assert loadgen.percentile([7.0], 99) == 7.0
    assert loadgen.percentile([], 50) is None


def test_cli_json_and_bad_input(delay_server):
    r = subprocess.run([sys.executable, "-m", "lab", "loadgen", "--url", _url(delay_server), "--rates", "10,20",
                        "--step-s", "1", "--json"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [w["rate_rps"] for w in out["windows"]] == [10.0, 20.0]
    assert sum(w["answered"] for w in out["windows"]) == delay_server.seen
    bad = subprocess.run([sys.executable, "-m", "lab", "loadgen", "--url", _url(delay_server), "--rates", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "--rates" in bad.stderr


def test_a_server_that_is_not_there_gives_errors_not_latencies():
    from shared.ports import free_port

    (w,) = loadgen.run(f"http://127.0.0.1:{free_port()}/predict", b"{}", [loadgen.Step(20.0, 0.5)], seed=2)
    assert w.due > 0 and w.answered == 0 and w.errors == w.due
    assert w.p50_s is None and w.error_kinds == {"ConnectionRefusedError": w.due}
    assert "ConnectionRefusedError" in loadgen.table([w])
