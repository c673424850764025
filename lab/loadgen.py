"""`python -m lab loadgen`: open-loop HTTP load at Poisson arrivals, in rate steps, with honest latencies.

Why this exists: to drive a real model server (the inference workload's
--serve mode, or a third-party server) the way users do, and to say what they
would see. Open loop: request i is due at a time drawn in advance (Poisson
arrivals at each step's rate), whatever happened to request i-1, and its
latency runs from that due time to the answer. A closed-loop client, or one
that times from when it actually sent, waits politely while the server
stalls and so never records the stall (coordinated omission); here a request
that could not even be sent on time counts its wait.

Sending: one thread wakes at each due time and hands the request to a pool
of `concurrency` threads, each keeping one HTTP/1.1 connection (stdlib
http.client). Requests beyond the pool wait for a thread, and that wait is
in their latency too.

A window is a rate step. Per window: requests due, answered (2xx), errors
(other status, refused, timed out), and p50/p95/p99 of the answered ones'
latency (nearest rank). A research tool: the product never imports it.
"""

from __future__ import annotations

import argparse
import http.client
import math
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from services.cli.common import CliError, emit_json


@dataclass(frozen=True, slots=True)
class Step:
    rate_rps: float
    duration_s: float


@dataclass(slots=True)
class Outcome:
    window: int
    due_s: float  # since the start of the run
    latency_s: float | None = None  # from due time to the whole answer; None: not answered
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True, slots=True)
class Window:
    window: int
    rate_rps: float
    duration_s: float
    due: int
    answered: int
    errors: int
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    max_s: float | None
    error_kinds: dict[str, int] = field(default_factory=dict)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of an ascending list; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--rates: expected comma-separated requests per second, got {text!r}") from None
    if not rates or any(not (0 < r <= 10_000) for r in rates):
        raise CliError(f"--rates: every rate must be in (0, 10000] requests/s, got {text!r}")
    return rates


def schedule(steps: list[Step], seed: int) -> list[tuple[float, int]]:
    """(due time since start, window) of every request: Poisson arrivals, each step at its rate."""
    rng = random.Random(seed)
    due: list[tuple[float, int]] = []
    start = 0.0
    for w, step in enumerate(steps):
        t = start + rng.expovariate(step.rate_rps)
        while t < start + step.duration_s:
            due.append((t, w))
            t += rng.expovariate(step.rate_rps)
        start += step.duration_s
    return due


class _Client:
    """POSTs one body to one URL over a keep-alive connection per thread."""

    def __init__(self, url: str, body: bytes, content_type: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CliError(f"--url: expected http://HOST:PORT/PATH, got {url!r}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.body = body
        self.headers = {"Content-Type": content_type}
        self.timeout_s = timeout_s
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=self.timeout_s)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def post(self) -> int:
        """The answer's status; OSError/HTTPException when none came."""
        for attempt in (0, 1):  # a keep-alive connection the server closed is retried once, on a fresh one
            conn = self._connection()
            try:
                conn.request("POST", self.path, body=self.body, headers=self.headers)
                resp = conn.getresponse()
                resp.read()
                if resp.will_close:
                    self._drop()
                return resp.status
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop()
                if attempt:
                    raise
            except (OSError, http.client.HTTPException):
                self._drop()
                raise
        raise AssertionError("unreachable")


def run(url: str, body: bytes, steps: list[Step], *, seed: int = 0, concurrency: int = 64,
        timeout_s: float = 30.0, content_type: str = "application/json", progress_s: float = 10.0,
        progress: Callable[[str], None] = lambda m: None) -> list[Window]:
    """Send the whole schedule and return one `Window` per step."""
    client = _Client(url, body, content_type, timeout_s)
    plan = schedule(steps, seed)
    outcomes = [Outcome(w, due) for due, w in plan]
    t0 = time.perf_counter()

    def send(o: Outcome) -> None:
        try:
            o.status = client.post()
            if not o.ok:
                o.error = f"HTTP {o.status}"
        except TimeoutError:
            o.error = "timeout"
        except (OSError, http.client.HTTPException) as e:
            o.error = type(e).__name__
        o.latency_s = time.perf_counter() - (t0 + o.due_s)

    total_s = sum(s.duration_s for s in steps)
    next_progress = progress_s
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="loadgen") as pool:
        for o in outcomes:
            while True:
                now = time.perf_counter() - t0
                if now >= next_progress:
                    done = sum(1 for x in outcomes if x.latency_s is not None)
                    progress(f"loadgen: {now:.0f}/{total_s:.0f} s, {done} answered or failed "
                             f"of {sum(1 for x in outcomes if x.due_s <= now)} due")
                    next_progress += progress_s
                wait = min(o.due_s - now, next_progress - now)
                if wait <= 0:
                    break
                time.sleep(wait)
            pool.submit(send, o)
    return summarize(steps, outcomes)


def summarize(steps: list[Step], outcomes: list[Outcome]) -> list[Window]:
    windows = []
    for w, step in enumerate(steps):
        mine = [o for o in outcomes if o.window == w]
        lat = sorted(o.latency_s for o in mine if o.ok and o.latency_s is not None)
        kinds: dict[str, int] = {}
        for o in mine:
            if not o.ok:
                kinds[o.error or "unknown"] = kinds.get(o.error or "unknown", 0) + 1
        windows.append(Window(w, step.rate_rps, step.duration_s, len(mine), len(lat), len(mine) - len(lat),
                              percentile(lat, 50), percentile(lat, 95), percentile(lat, 99),
                              lat[-1] if lat else None, kinds))
    return windows


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def table(windows: list[Window]) -> str:
    lines = ["window  rate/s  dur_s   due   ok  err   p50_ms   p95_ms   p99_ms   max_ms"]
    for w in windows:
        lines.append(f"{w.window:>6}  {w.rate_rps:>6g}  {w.duration_s:>5g}  {w.due:>4}  {w.answered:>3}  "
                     f"{w.errors:>3}  {_ms(w.p50_s):>7}  {_ms(w.p95_s):>7}  {_ms(w.p99_s):>7}  {_ms(w.max_s):>7}")
    for w in windows:
        if w.error_kinds:
            kinds = ", ".join(f"{k} x{n}" for k, n in sorted(w.error_kinds.items()))
            lines.append(f"window {w.window} errors: {kinds}")
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "loadgen", help="open-loop HTTP load at Poisson arrivals in rate steps; p50/p95/p99 per step",
        description="POST one body to a URL at Poisson arrivals, the rate changing step by step, and report each "
        "step's latency percentiles, timed from each request's due time (no coordinated omission). Progress goes "
        "to stderr.",
        epilog="example: python -m lab loadgen --url http://127.0.0.1:8080/predict --rates 2,5,2 --step-s 30")
    p.add_argument("--url", required=True, help="where to POST, e.g. http://127.0.0.1:8080/predict")
    p.add_argument("--body", default='{"images": 1}',
                   help="the request body, or @FILE (default {\"images\": 1}, the inference --serve mode's)")
    p.add_argument("--content-type", default="application/json", help="default application/json")
    p.add_argument("--rates", default="2", help="requests per second, one per step, comma-separated (default 2)")
    p.add_argument("--step-s", type=float, default=30.0, help="seconds each rate lasts (default 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the arrival times (default 0)")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at most (default 64)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a request counts as failed "
                   "(default 30)")
    p.add_argument("--progress-s", type=float, default=10.0, help="a progress line on stderr this often (default 10)")
    p.add_argument("--json", action="store_true", help="last line of stdout: one JSON object (windows)")
    p.set_defaults(func=cmd_loadgen)


def cmd_loadgen(args: argparse.Namespace) -> int:
    rates = parse_rates(args.rates)
    if not 0 < args.step_s <= 86_400:
        raise CliError(f"--step-s must be in (0, 86400] seconds, got {args.step_s}")
    if not 1 <= args.concurrency <= 4096:
        raise CliError(f"--concurrency must be 1-4096, got {args.concurrency}")
    if not 0 < args.timeout <= 3600 or not 0 < args.progress_s:
        raise CliError("--timeout must be in (0, 3600] s and --progress-s above 0")
    if args.body.startswith("@"):
        try:
            body = Path(args.body[1:]).read_bytes()
        except OSError as e:
            raise CliError(f"--body {args.body}: {e.strerror}") from None
    else:
        body = args.body.encode()
    steps = [Step(r, args.step_s) for r in rates]
    windows = run(args.url, body, steps, seed=args.seed, concurrency=args.concurrency, timeout_s=args.timeout,
                  content_type=args.content_type, progress_s=args.progress_s,
                  progress=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        emit_json({"url": args.url, "seed": args.seed, "windows": [asdict(w) for w in windows]})
    else:
        print(table(windows))
    return 0

