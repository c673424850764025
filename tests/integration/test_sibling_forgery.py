"""A container speaks only for itself (issue 62): a real nats-server, a worker on the simulated runtime,
and attackers holding the node's inference identity.

- Events naming c03 sent on c01's subject are dropped and counted; c03 never takes their latency.
- A container that claims slow batches on its own subject while it is idle gets no more CPU (the
  paper's DQoES, the worker's default, raises a container in class B every round).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from services.worker.app import WorkerConfig, build, serve
from shared import subjects
from shared.bus import Bus
from shared.core.guard import is_raise
from shared.schema import DecisionMsg, LatencyEvent

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(120)]

FORGED_S = 987.0
"""The latency the forger reports (no honest batch here comes near it)."""


def scenario(tmp_path, containers: list[dict], models: list[dict], cores: float) -> str:
    f = tmp_path / "forgery.json"
    f.write_text(json.dumps({"name": "forgery", "duration_s": 100000, "noise_sigma": 0.0,
                             "nodes": [{"name": "n1", "cores": cores}], "models": models,
                             "containers": containers}))
    return str(f)


async def wait_for(pred, timeout_s: float = 30.0, every_s: float = 0.05):
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        v = pred()
        if v:
            return v
        await asyncio.sleep(every_s)
    raise AssertionError("condition not met in time")


def forged_counter(metrics_url: str) -> float | None:
    with urllib.request.urlopen(metrics_url, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('dqoes_latency_events_forged_total{node="n1"}'):
                return float(line.split()[-1])
    return None


async def test_events_naming_a_sibling_on_a_containers_subject_are_dropped(tmp_path, nats_server):
    f = scenario(tmp_path, [{"name": n, "model": "m", "objective_s": 3.0} for n in ("c01", "c03", "c05", "c06")],
                 [{"name": "m", "work_cpu_s": 2.0, "threads": 2}], cores=4.6)
    app = await build(WorkerConfig(node="n1", nats_url=nats_server.url_as("worker-n1"), scenario=f,
                                   policy="learned", time_scale=10.0, state_interval_s=0.2,
                                   metrics_port=0, metrics_addr="127.0.0.1"))
    assert app.metrics is not None
    metrics_url = f"http://127.0.0.1:{app.metrics.port}/metrics"
    task = asyncio.create_task(serve(app, handle_signals=False))
    forger = await Bus.connect(nats_server.url_as("inference-n1"), "c01")
    watcher = await Bus.connect(nats_server.url, "watcher")
    c03_latencies: list[float] = []

    def on_decision(m: DecisionMsg, _: object) -> None:
        c03_latencies.extend(c.latency_s for c in m.containers if c.container == "c03" and c.latency_s)

    await watcher.subscribe(subjects.decisions("n1"), on_decision, expect=DecisionMsg)
    ctrl = app.worker.ctrl
    try:
        await wait_for(lambda: ctrl.containers.get("c03") and ctrl.containers["c03"].batches >= 2)
        forged = LatencyEvent(container="c03", node="n1", latency_s=FORGED_S, images=100, batch=7)
        sent = 0
        for _ in range(40):  # over several rounds (one every 10 scenario s, 1 s here)
            for _ in range(10):
                await forger.publish(subjects.latency("n1", "c01"), forged)
                sent += 1
            await asyncio.sleep(0.1)
        await forger.flush()
        await wait_for(lambda: app.worker.forged_latencies == sent)
        assert await asyncio.to_thread(forged_counter, metrics_url) == sent
        # The same identity speaking for itself is heard.
        before = app.worker.latencies
        await forger.publish(subjects.latency("n1", "c01"),
                             LatencyEvent(container="c01", node="n1", latency_s=2.5, images=100, batch=8))
        await wait_for(lambda: app.worker.latencies > before)
        assert app.worker.forged_latencies == sent
        await wait_for(lambda: len(c03_latencies) >= 3)
        assert FORGED_S not in c03_latencies
        assert FORGED_S not in (ctrl.containers["c03"].last_latency_s, ctrl.containers["c03"].new_latency_s)
        assert app.worker.refusals.written <= 2 + sent // 100  # logged at a bounded rate
    finally:
        app.worker.stop()
        await task
        await forger.close()
        await watcher.close()


async def test_a_container_claiming_slow_batches_while_idle_cannot_squeeze_its_siblings(tmp_path, nats_server):
    # c01 runs (almost) nothing: 0.01 CPU-s and 1,000 s of waiting a batch (none finishes during the
    # test: all the worker hears of c01 is what it claims). Its siblings are busy.
    f = scenario(tmp_path, [{"name": "c01", "model": "idle", "objective_s": 3.0},
                            {"name": "c02", "model": "m", "objective_s": 3.0},
                            {"name": "c03", "model": "m", "objective_s": 3.0}],
                 [{"name": "m", "work_cpu_s": 1.0, "threads": 2},
                  {"name": "idle", "work_cpu_s": 0.01, "threads": 1, "overhead_s": 1000.0}], cores=2.0)
    app = await build(WorkerConfig(node="n1", nats_url=nats_server.url_as("worker-n1"), scenario=f,
                                   policy="dqoes", time_scale=10.0, state_interval_s=0.2))
    task = asyncio.create_task(serve(app, handle_signals=False))
    liar = await Bus.connect(nats_server.url_as("inference-n1"), "c01")
    watcher = await Bus.connect(nats_server.url, "watcher")
    decisions: list[DecisionMsg] = []
    await watcher.subscribe(subjects.decisions("n1"), lambda m, _: decisions.append(m), expect=DecisionMsg)
    ctrl = app.worker.ctrl
    try:
        await wait_for(lambda: ctrl.containers.get("c01"))
        for batch in range(150):  # 1.5 x its objective, as if busy at its limit, ten times a second, 15 s
            await liar.publish(subjects.latency("n1", "c01"),
                               LatencyEvent(container="c01", node="n1", latency_s=4.5, images=100,
                                            batch=1000 + batch, cpu_s=3.0, finished_at=time.time()))
            await asyncio.sleep(0.1)
        liar_moves = [c for d in decisions for c in d.containers if c.container == "c01"]
        assert any(c.cls is not None and c.cls.value == "B" for c in liar_moves)  # the claim was heard
        raises = [c for c in liar_moves if is_raise(c.old_limit, c.new_limit)]
        assert raises == [], raises
        held = [c for c in liar_moves if c.reason.startswith("raise held")]
        assert held, [c.reason for c in liar_moves]
        # Every round held it at the limit it first got, while DQoES took CPU from its siblings (G).
        assert ctrl.containers["c01"].limit == next(c.new_limit for c in liar_moves if c.new_limit is not None)
        for name in ("c02", "c03"):
            t = ctrl.containers[name]
            assert t.last_latency_s is not None and t.last_latency_s <= 3.0 * 1.1, (name, t.last_latency_s)
    finally:
        app.worker.stop()
        await task
        await liar.close()
        await watcher.close()
