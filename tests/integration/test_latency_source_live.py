"""End to end: a worker governs a real process by the percentile it scrapes from the process's metrics.

The worker (cgroup runtime, real nats-server) starts a process labelled
`dqoes.latency.source=prometheus`: a prometheus_client server that serves
itself requests of fixed CPU work and exports their latency as a histogram
(tests/latency_target.py). It publishes nothing on NATS. Fast against its
objective, it is given less CPU (down to DQoES's floor); given an objective it cannot meet, its
scraped p95 is what the policy classifies it by;
when its endpoint stops answering it turns stale (never met, limit kept) and
recovers by itself. Needs root and a cgroup cpu controller; skipped without
them unless DQOES_REQUIRE_CGROUP=1.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import pytest
from latency_parts import METRIC, Target, get

from services.worker.app import WorkerConfig, build, serve
from shared.ports import free_port
from shared.runtime import cgroupfs
from shared.schema import ObjectiveAssign

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

OBJECTIVE_S = 0.25


@pytest.fixture
def cgroups() -> None:
    def need(reason: str) -> None:
        if os.environ.get("DQOES_REQUIRE_CGROUP") == "1":
            pytest.fail(f"{reason} (and DQOES_REQUIRE_CGROUP=1)")
        pytest.skip(f"{reason}; set DQOES_REQUIRE_CGROUP=1 to make this a failure")

    if os.geteuid() != 0:
        need("not root: cannot create cgroups")
    try:
        cgroupfs.detect_layout(cgroupfs.DEFAULT_ROOT)
    except OSError as e:
        need(f"no cgroup cpu controller: {e}")


def test_a_worker_limits_a_process_by_its_scraped_percentile(nats_url, cgroups, caplog) -> None:
    caplog.set_level(logging.INFO)

    async def go() -> None:
        app = await build(WorkerConfig(node="n1", nats_url=nats_url, runtime="cgroup", cores=1.0, policy="dqoes",
                                       initial_interval_s=1.0, state_interval_s=0.5, training_policy="none",
                                       metrics_port=0))
        serving = asyncio.create_task(serve(app, handle_signals=False))
        worker, poller = app.worker, app.poller
        assert poller is not None
        port = free_port()
        target = Target(port, cpu_ms=15.0)
        labels = {"dqoes.latency.source": "prometheus", "dqoes.latency.port": str(port),
                  "dqoes.latency.metric": METRIC, "dqoes.latency.window_s": "1"}
        try:
            await app.runtime.spawn("lat-1", target.argv, objective_s=OBJECTIVE_S, labels=labels)  # type: ignore[attr-defined]
            t = worker.ctrl.containers
            for _ in range(300):  # fast against its objective: its limit comes down (to DQoES's floor, 1/2|C|)
                await asyncio.sleep(0.1)
                if "lat-1" in t and t["lat-1"].limit is not None and t["lat-1"].limit <= 0.5:
                    break
            c = t["lat-1"]
            assert c.limit is not None and c.limit <= 0.5, (c.limit, poller.status.get("lat-1"))
            status = poller.status["lat-1"]
            assert status.kind == "prometheus" and status.latency_s is not None and status.rate_per_s
            assert "lat-1" in worker.polled and worker.latencies == 0  # no NATS event was needed
            # what the controller holds is what was scraped
            assert c.new_latency_s == pytest.approx(status.latency_s) or c.last_latency_s == pytest.approx(
                status.latency_s)
            assert app.metrics is not None
            metrics = get(f"http://127.0.0.1:{app.metrics.port}/metrics").decode()
            assert "dqoes_request_rate_per_second{container=\"lat-1\",node=\"n1\"}" in metrics
            # an objective it cannot meet: the scraped p95 is what the policy classifies it by (class B)
            worker.on_objective(ObjectiveAssign(container="lat-1", objective_s=0.02, revision=1))
            await asyncio.sleep(1.5)
            (mine,) = [s for s in worker.node_state().containers if s.container == "lat-1"]
            scraped = poller.status["lat-1"].latency_s
            assert mine.cls is not None and mine.cls.value == "B" and mine.met is False, mine
            assert mine.latency_s == pytest.approx(scraped), (mine, poller.status["lat-1"])
            assert mine.request_rate_per_s is not None and mine.request_rate_per_s >= 0, mine  # beside it
            # a percentile objective: its percentile and window drive the scrape, not the labels'
            worker.on_objective(ObjectiveAssign(container="lat-1", objective_s=0.02, revision=2, percentile=50.0,
                                                window_s=2.0))
            assert "latency of lat-1: prometheus source" in caplog.text and "p50 every 2 s" in caplog.text
            await asyncio.sleep(2.5)
            (mine,) = [s for s in worker.node_state().containers if s.container == "lat-1"]
            assert (mine.percentile, mine.window_s, mine.objective_s) == (50.0, 2.0, 0.02), mine
            # its endpoint stops answering: stale, limit kept, one line; then it answers again
            get(f"http://127.0.0.1:{port}/mode?page=empty")
            for _ in range(50):
                await asyncio.sleep(0.1)
                if "lat-1" in worker.stale_containers():
                    break
            assert "lat-1" in worker.stale_containers()
            assert poller.status["lat-1"].state == "empty"
            held = c.limit
            state = worker.node_state()
            (mine,) = [s for s in state.containers if s.container == "lat-1"]
            assert mine.stale and mine.met is not True
            await asyncio.sleep(2.5)
            assert c.limit == held  # no news, no change
            get(f"http://127.0.0.1:{port}/mode?page=normal")
            for _ in range(50):
                await asyncio.sleep(0.1)
                if "lat-1" not in worker.stale_containers():
                    break
            assert "lat-1" not in worker.stale_containers()
            lines = [r.getMessage() for r in caplog.records if "latency of lat-1 not read" in r.getMessage()]
            assert len(lines) == 1, lines
            assert any("latency of lat-1 read again" in r.getMessage() for r in caplog.records)
        finally:
            worker.stop()
            await asyncio.wait_for(serving, 30)

    asyncio.run(go())


def test_malformed_latency_labels_make_a_container_stale_with_one_line(nats_url, cgroups, caplog) -> None:
    caplog.set_level(logging.INFO)

    async def go() -> None:
        app = await build(WorkerConfig(node="n1", nats_url=nats_url, runtime="cgroup", cores=1.0, policy="dqoes",
                                       initial_interval_s=1.0, training_policy="none"))
        serving = asyncio.create_task(serve(app, handle_signals=False))
        worker, poller = app.worker, app.poller
        assert poller is not None
        idle = [sys.executable, "-c", "import time; time.sleep(60)"]
        try:
            await app.runtime.spawn("no-port", idle, objective_s=1.0,  # type: ignore[attr-defined]
                                    labels={"dqoes.latency.source": "prometheus", "dqoes.latency.metric": "m"})
            await app.runtime.spawn("no-server", idle, objective_s=1.0,  # type: ignore[attr-defined]
                                    labels={"dqoes.latency.source": "promql", "dqoes.latency.query": "up"})
            for _ in range(50):
                await asyncio.sleep(0.05)
                if {"no-port", "no-server"} <= worker.stale_containers():
                    break
            assert {"no-port", "no-server"} <= worker.stale_containers()
            assert poller.status["no-port"].state == poller.status["no-server"].state == "misconfigured"
            assert "needs dqoes.latency.port" in poller.status["no-port"].detail
            assert "--prometheus-url" in poller.status["no-server"].detail
            states = {s.container: s for s in worker.node_state().containers}
            assert states["no-port"].stale and states["no-port"].met is not True
            lines = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
            assert len(lines) == 2, lines
        finally:
            worker.stop()
            await asyncio.wait_for(serving, 30)

    asyncio.run(go())
