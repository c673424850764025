"""The inference workload's HTTP serving mode as a real process: micro-batches, and /metrics that counts them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from shared.ports import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not ready after {timeout_s} s")


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _samples(metrics_text: str) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(metrics_text):
        for s in fam.samples:
            out[(s.name, s.labels.get("le", ""))] = s.value
    return out


@pytest.fixture
def server():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_NO_JEMALLOC": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.inference", "--serve", f"127.0.0.1:{port}", "--model", "mobilenetv2",
         "--resolution", "32", "--batch", "8", "--max-wait", "1.0", "--threads", "1"],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_requests_share_micro_batches_and_metrics_count_them(server):
    # Six clients at once, a batch of up to 8 images, a second's wait: they share forward passes.
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: _post(f"{server}/predict", {"images": 1 + i % 2, "seed": i}), range(6)))
    assert all(status == 200 for status, _ in answers), answers
    assert [len(a["predictions"]) for _, a in answers] == [1 + i % 2 for i in range(6)]
    assert all(a["batch"]["images"] <= 8 for _, a in answers)
    assert max(a["batch"]["requests"] for _, a in answers) >= 2, answers

    status, err = _post(f"{server}/predict", {"images": 9})  # more than a batch holds
    assert status == 400 and "images must be an integer from 1 to 8" in err["error"]

    with urllib.request.urlopen(f"{server}/metrics", timeout=5) as r:
        samples = _samples(r.read().decode())
    # Every answered request once in the latency histogram (the refused one not at all), every request in
    # exactly one forward pass, and fewer passes than requests.
    assert samples[("dqoes_inference_request_duration_seconds_count", "")] == 6
    assert samples[("dqoes_inference_request_duration_seconds_bucket", "+Inf")] == 6
    assert samples[("dqoes_inference_batch_requests_sum", "")] == 6
    passes = samples[("dqoes_inference_batch_requests_count", "")]
    assert 1 <= passes < 6
    slowest = max(a["latency_s"] for _, a in answers)
    assert samples[("dqoes_inference_request_duration_seconds_sum", "")] <= 6 * slowest + 1e-6


def test_serve_flag_rejects_a_bad_address():
    r = subprocess.run([sys.executable, "-m", "services.inference", "--serve", "127.0.0.1:notaport"],
                       cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2
    assert "--serve: expected PORT or HOST:PORT" in r.stderr


def test_the_prometheus_latency_source_reads_what_clients_saw(server):
    """The worker's `prometheus` source (dqoes.latency.metric=dqoes_inference_request_duration_seconds)
    on the serving mode's page: the requests of its window are loadgen's, its p95 is the clients' p95 within
    the histogram's bucket width."""
    sources = pytest.importorskip("shared.latency.sources", reason="needs the prometheus latency source")
    from lab import loadgen
    from shared.metrics import REQUEST_BUCKETS_S

    assert _post(f"{server}/predict", {})[0] == 200  # the histogram's series exist from here on
    source = sources.ScrapeSource(f"{server}/metrics", "dqoes_inference_request_duration_seconds", 0.95)
    assert asyncio.run(source.read(time.monotonic())).latency_s is None  # the baseline
    (w,) = loadgen.run(f"{server}/predict", b'{"images": 1}', [loadgen.Step(8.0, 3.0)], seed=2)
    r = asyncio.run(source.read(time.monotonic()))
    assert r.state == "ok" and r.requests == w.answered == w.due > 10, (r, w)
    assert r.latency_s is not None and w.p95_s is not None
    assert _bucket_below(REQUEST_BUCKETS_S, w.p95_s) <= r.latency_s <= _bucket_above(REQUEST_BUCKETS_S, w.p95_s)


def _bucket_above(bounds: tuple[float, ...], x: float) -> float:
    return next((b for b in bounds if b >= x), float("inf"))


def _bucket_below(bounds: tuple[float, ...], x: float) -> float:
    """The lower edge of the bucket under x's (server-side time is a little below the clients')."""
    lower = [b for b in bounds if b < x]
    return lower[-2] if len(lower) >= 2 else 0.0
