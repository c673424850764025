"""End to end: a worker governs a stock MLServer through MLServer's own metrics, untouched.

The worker (cgroup runtime, real nats-server, dqoes) starts MLServer as one of its processes, labelled
so the `prometheus` latency source scrapes MLServer's metrics port and reads
`rest_server_request_duration_seconds`, inference requests only (`dqoes.latency.match`: the same
histogram times readiness and metadata requests). The load generator drives it. Fast against a loose
objective, its limit comes down; given an objective tighter than its p95, the scraped p95 makes it
class B and the limit comes down no further; the p95 the worker read agrees with the one the clients measured within a bucket of
MLServer's histogram.

Needs the `serving` extra, torch, root and a cgroup cpu controller; skipped without them, unless
DQOES_REQUIRE_SERVING=1 (CI) or DQOES_REQUIRE_CGROUP=1 make a missing part a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
if os.environ.get("DQOES_REQUIRE_SERVING") == "1":
    import mlserver  # noqa: F401  (CI installs the serving extra: a missing server fails here)
else:
    pytest.importorskip("mlserver", reason="needs the serving extra; set DQOES_REQUIRE_SERVING=1 to make this a failure")

from lab import loadgen  # noqa: E402
from services.worker.app import WorkerConfig, build, serve  # noqa: E402
from shared.ports import free_port  # noqa: E402
from shared.runtime import cgroupfs  # noqa: E402
from shared.schema import ObjectiveAssign  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
BODY = json.dumps({"inputs": [{"name": "images", "shape": [1], "datatype": "INT32", "data": [1]}]}).encode()
REST_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""The buckets of MLServer's rest_server_request_duration_seconds (starlette_exporter's defaults)."""


@pytest.fixture
def cgroups() -> None:
    if os.geteuid() == 0:
        try:
            cgroupfs.detect_layout(cgroupfs.DEFAULT_ROOT)
            return
        except OSError as e:
            reason = f"no cgroup cpu controller: {e}"
    else:
        reason = "not root: cannot create cgroups"
    if os.environ.get("DQOES_REQUIRE_CGROUP") == "1":
        pytest.fail(f"{reason} (and DQOES_REQUIRE_CGROUP=1)")
    pytest.skip(f"{reason}; set DQOES_REQUIRE_CGROUP=1 to make this a failure")


def model_repository(tmp_path: Path) -> Path:
    """compose/mlserver as shipped, with a small model so a request costs milliseconds."""
    repo = tmp_path / "models"
    shutil.copytree(REPO / "compose" / "mlserver", repo)
    settings_file = repo / "resnet50" / "model-settings.json"
    settings = json.loads(settings_file.read_text())
    settings["name"] = "small"
    settings["parameters"]["extra"] = {"model": "mobilenetv2", "resolution_px": 64, "threads": 1}
    settings_file.write_text(json.dumps(settings))
    return repo


def test_a_worker_governs_mlserver_by_its_own_histogram(nats_url, cgroups, tmp_path) -> None:
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {"PYTHONPATH": str(REPO), "MLSERVER_HTTP_PORT": str(http), "MLSERVER_GRPC_PORT": str(grpc),
           "MLSERVER_METRICS_PORT": str(metrics), "MLSERVER_METRICS_DIR": str(tmp_path), "MLSERVER_HOST": "127.0.0.1"}
    exe = shutil.which("mlserver", path=str(Path(sys.executable).parent)) or "mlserver"
    labels = {"dqoes.latency.source": "prometheus", "dqoes.latency.port": str(metrics),
              "dqoes.latency.metric": "rest_server_request_duration_seconds",
              "dqoes.latency.match": "path=/v2/models/{model_name}/infer", "dqoes.latency.window_s": "1"}
    url = f"http://127.0.0.1:{http}/v2/models/small/infer"

    async def go() -> None:
        app = await build(WorkerConfig(node="n1", nats_url=nats_url, runtime="cgroup", cores=1.0, policy="dqoes",
                                       initial_interval_s=1.0, state_interval_s=0.5, training_policy="none"))
        serving = asyncio.create_task(serve(app, handle_signals=False))
        worker, poller = app.worker, app.poller
        assert poller is not None
        try:
            await app.runtime.spawn("mls", [exe, "start", str(model_repository(tmp_path))], env=env,  # type: ignore[attr-defined]
                                    objective_s=5.0, labels=labels)
            for _ in range(600):  # the model loaded: it answers, and its readiness probes do not count
                await asyncio.sleep(0.1)
                try:
                    await asyncio.to_thread(lambda: urllib.request.urlopen(
                        urllib.request.Request(url, BODY, {"Content-Type": "application/json"}), timeout=5).read())
                    break
                except OSError:
                    pass
            else:
                pytest.fail("MLServer did not answer within 60 s")

            async def load(seconds: int, seed: int) -> list[loadgen.Window]:  # one window a second, as the worker's
                return await asyncio.to_thread(loadgen.run, url, BODY, [loadgen.Step(8.0, 1.0)] * seconds, seed=seed)

            # a loose objective: fast against it, its limit comes down (to DQoES's floor, 1/2|C|)
            loading = asyncio.create_task(load(14, 1))
            c = None
            while not loading.done():
                await asyncio.sleep(0.2)
                c = worker.ctrl.containers.get("mls")
            ws = await loading
            assert c is not None and c.limit is not None and c.limit <= 0.5, (c, poller.status.get("mls"))
            status = poller.status["mls"]
            assert status.kind == "prometheus" and status.rate_per_s and status.latency_s is not None, status
            assert sum(w.answered for w in ws) == sum(w.due for w in ws) > 50, ws
            assert worker.latencies == 0  # nothing came over NATS: MLServer publishes nothing

            # an objective tighter than its p95 at that limit: the scraped p95 makes it class B (not met),
            # and the limit is lowered no further
            low = c.limit
            readings: list[float] = []
            worker.on_objective(ObjectiveAssign(container="mls", objective_s=0.001, revision=1))
            loading = asyncio.create_task(load(10, 2))
            seen = poller.status["mls"]
            while not loading.done():
                await asyncio.sleep(0.2)
                st = poller.status["mls"]
                if st is not seen and st.latency_s is not None:
                    readings.append(st.latency_s)
                seen = st
            ws = await loading
            assert c.limit is not None and c.limit >= low, (low, c.limit, readings)
            (mine,) = [s for s in worker.node_state().containers if s.container == "mls"]
            assert mine.cls is not None and mine.cls.value == "B" and mine.met is False, mine
            assert mine.latency_s == pytest.approx(poller.status["mls"].latency_s)

            # the worker's reading is the clients' p95, within a bucket of MLServer's histogram: the median
            # of the 1 s windows' p95 on both sides (the windows are not aligned, one by one they differ)
            client = statistics.median(w.p95_s for w in ws if w.p95_s is not None)
            assert len(readings) >= 5, readings
            # (the reading is interpolated inside its bucket: it is off by at most that bucket's width)
            read = statistics.median(readings)
            hi = next((b for b in REST_BUCKETS_S if b >= read), float("inf"))
            lo = max((b for b in REST_BUCKETS_S if b < read), default=0.0)
            assert abs(read - client) <= hi - lo, (read, client, readings, [w.p95_s for w in ws])
        finally:
            worker.stop()
            await asyncio.wait_for(serving, 30)

    asyncio.run(go())
