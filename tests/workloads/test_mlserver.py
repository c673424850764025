"""A stock MLServer serves the project's torch model, and its own /metrics counts what loadgen sent.

Needs the `serving` extra (pip install -e '.[serving]'); skipped without it, unless
DQOES_REQUIRE_SERVING=1 (CI), where a missing server is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
if os.environ.get("DQOES_REQUIRE_SERVING") == "1":
    import mlserver  # noqa: F401  (CI installs the serving extra: a missing server fails here)
else:
    pytest.importorskip("mlserver", reason="needs the serving extra; set DQOES_REQUIRE_SERVING=1 to make this a failure")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from lab import loadgen  # noqa: E402
from shared.ports import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)
INFER_PATH = "/v2/models/{model_name}/infer"
BODY = {"inputs": [{"name": "images", "shape": [1], "datatype": "INT32", "data": [1]}]}


@pytest.fixture
def mlserver(tmp_path):
    # The repository compose/mlserver ships, with a small model so the test takes seconds.
    repo = tmp_path / "models"
    shutil.copytree(REPO / "compose" / "mlserver", repo)
    settings_file = repo / "resnet50" / "model-settings.json"
    settings = json.loads(settings_file.read_text())
    settings["name"] = "small"
    settings["parameters"]["extra"] = {"model": "mobilenetv2", "resolution_px": 32, "threads": 1}
    settings_file.write_text(json.dumps(settings))
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLSERVER_HTTP_PORT": str(http),
           "MLSERVER_GRPC_PORT": str(grpc), "MLSERVER_METRICS_PORT": str(metrics),
           "MLSERVER_METRICS_DIR": str(tmp_path), "MLSERVER_HOST": "127.0.0.1"}
    exe = shutil.which("mlserver", path=str(Path(sys.executable).parent)) or "mlserver"
    log = (tmp_path / "mlserver.log").open("w")
    proc = subprocess.Popen([exe, "start", str(repo)], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        t_end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "mlserver.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/small/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < t_end, "MLServer not ready after 60 s:\n" + (tmp_path / "mlserver.log").read_text()
            time.sleep(0.3)
        yield f"http://127.0.0.1:{http}", f"http://127.0.0.1:{metrics}/metrics"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _histogram(url: str, name: str) -> dict[str, dict[str, float]]:
    """{status_code or model: {"count": c, "+Inf": bucket}} of one histogram (or summary) family."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for s in fam.samples:
            if s.labels.get("path", INFER_PATH) != INFER_PATH:
                continue
            key = s.labels.get("status_code") or s.labels.get("model", "")
            if s.name.endswith("_count"):
                out.setdefault(key, {})["count"] = s.value
            elif s.name.endswith("_bucket") and s.labels["le"] == "+Inf":
                out.setdefault(key, {})["+Inf"] = s.value
    return out


def test_mlserver_serves_the_torch_model_and_its_histogram_counts_loadgen_requests(mlserver):
    base, metrics_url = mlserver
    req = urllib.request.Request(f"{base}/v2/models/small/infer", json.dumps(
        {"inputs": [{"name": "images", "shape": [1], "datatype": "INT32", "data": [3]}]}).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        answer = json.loads(r.read())
    (out,) = answer["outputs"]
    assert out["name"] == "predictions" and out["shape"] == [3] and all(0 <= c < 1000 for c in out["data"])

    windows = loadgen.run(f"{base}/v2/models/small/infer", json.dumps(BODY).encode(),
                          [loadgen.Step(8.0, 2.0), loadgen.Step(16.0, 2.0)], seed=5)
    sent = sum(w.due for w in windows)
    answered = sum(w.answered for w in windows)
    assert answered == sent > 20, windows

    # MLServer's own metrics, as released: the REST histogram (starlette_exporter) and the model's summary.
    rest = _histogram(metrics_url, "rest_server_request_duration_seconds")
    assert rest["200"]["count"] == rest["200"]["+Inf"] == answered + 1
    model = _histogram(metrics_url, "model_infer_request_duration")  # a summary: count and sum only
    assert model["small"]["count"] == answered + 1


REST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""The buckets of MLServer's rest_server_request_duration_seconds (starlette_exporter's defaults)."""


def test_the_prometheus_latency_source_reads_mlservers_own_histogram(mlserver):
    """The worker's `prometheus` source (dqoes.latency.port=the metrics port,
    dqoes.latency.metric=rest_server_request_duration_seconds) on MLServer's page, untouched: the window
    holds loadgen's requests, and its p95 is the clients' within the histogram's bucket width.
    (MLServer's model_infer_request_duration is a summary without quantiles: no percentile there.)"""
    import asyncio

    sources = pytest.importorskip("shared.latency.sources", reason="needs the prometheus latency source")
    base, metrics_url = mlserver
    url = f"{base}/v2/models/small/infer"
    source = sources.ScrapeSource(metrics_url, "rest_server_request_duration_seconds", 0.95)
    assert asyncio.run(source.read(time.monotonic())).latency_s is None  # the baseline
    (w,) = loadgen.run(url, json.dumps(BODY).encode(), [loadgen.Step(10.0, 3.0)], seed=4)
    r = asyncio.run(source.read(time.monotonic()))
    assert r.state == "ok" and r.requests == w.answered == w.due > 10, (r, w)
    assert r.latency_s is not None and w.p95_s is not None
    above = next((b for b in REST_BUCKETS_S if b >= w.p95_s), float("inf"))
    lower = [b for b in REST_BUCKETS_S if b < w.p95_s]
    below = lower[-2] if len(lower) >= 2 else 0.0  # server-side time is a little below the clients'
    assert below <= r.latency_s <= above
