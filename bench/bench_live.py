"""The live worker over a real nats-server: ingest rate, reaction time, CPU cost.

Goals (issues "The live system" and 11): a worker ingests >= 50,000 latency
events a second over real NATS with none lost; time from a latency event to
the published decision (median, p99); worker CPU < 1% of one core at 100
containers in steady state. The server runs the project's default
configuration (authentication and permissions, shared/auth.py), as an
experiment's private bus does (experiments.common.PrivateNats): the worker
connects as worker-n1, the publishers as the node's inference identity.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, median, pct, report
from experiments.common import PrivateNats
from services.worker.app import WorkerConfig, build, serve
from shared import schema, subjects
from shared.bus import Bus
from shared.schema import ControlMsg, DecisionMsg, LatencyEvent

CONTROL_RTT: list[float] = []
"""Round trips of control requests sent during the last ingest flood."""

ROOT = Path(__file__).resolve().parents[1]

PUBLISHER = r"""
import asyncio, sys, time
from shared.bus import Bus
from shared import schema, subjects
from shared.schema import LatencyEvent

async def main(url, n, containers):
    bus = await Bus.connect(url, "bench-publisher")
    msgs = [(subjects.latency("n1", f"c{i:03d}"),
             schema.encode(LatencyEvent(container=f"c{i:03d}", node="n1", latency_s=10.0 + i % 7, images=100,
                                        batch=1, cpu_s=9.0), "bench")) for i in range(containers)]
    t0 = time.perf_counter()
    for k in range(n):
        s, d = msgs[k % containers]
        await bus._nc.publish(s, d)
    await bus.flush(30)
    print(f"published {n} in {time.perf_counter() - t0:.3f} s", flush=True)
    await bus.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def scenario_file(d: Path, containers: int, cores: float, work_cpu_s: float, objective_s: float) -> Path:
    sc = {
        "name": f"bench-{containers}", "duration_s": 1e9, "noise_sigma": 0.03,
        "nodes": [{"name": "n1", "cores": cores}],
        "models": [{"name": "m", "work_cpu_s": work_cpu_s, "threads": 1}],
        "containers": [{"name": f"c{i:03d}", "model": "m", "objective_s": objective_s} for i in range(containers)],
    }
    p = d / f"bench-{containers}.json"
    p.write_text(json.dumps(sc))
    return p


async def ingest(urls: dict[str, str], d: Path, n: int) -> tuple[float, int]:
    """Events/s one in-process worker takes in while another process publishes; and how many were lost."""
    url = urls["worker-n1"]
    cfg = WorkerConfig(node="n1", nats_url=url, scenario=str(scenario_file(d, 100, 16.0, 1e9, 10.0)),
                       state_interval_s=5.0)
    app = await build(cfg)
    task = asyncio.create_task(serve(app, handle_signals=False))
    w = app.worker
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", PUBLISHER, urls["inference-n1"], str(n), "100",
                                                env=env, stdout=subprocess.PIPE)
    admin = await Bus.connect(urls["admin"], "bench-admin")
    probe = schema.encode(ControlMsg(), "bench-admin")
    control_rtt: list[float] = []

    async def control_probe() -> None:
        """Operator control requests while the flood runs (the worker answers on its own connection)."""
        while True:
            t0 = time.perf_counter()
            try:
                await admin.request(subjects.control("n1"), probe, timeout_s=5.0)
                control_rtt.append(time.perf_counter() - t0)
            except Exception:
                control_rtt.append(float("inf"))
            await asyncio.sleep(0.1)

    prober = asyncio.create_task(control_probe())
    first = None
    t_end = time.monotonic() + 120
    while w.latencies < n and time.monotonic() < t_end:
        if first is None and w.latencies > 0:
            first = (time.perf_counter(), w.latencies)
        await asyncio.sleep(0.001)
    last = time.perf_counter()
    prober.cancel()
    await admin.close()
    CONTROL_RTT[:] = control_rtt
    got = w.latencies
    await proc.wait()
    await asyncio.sleep(1.0)  # anything still in flight
    lost = n - w.latencies
    w.stop()
    await task
    if first is None or got <= first[1]:
        return 0.0, lost
    return (got - first[1]) / (last - first[0]), lost


async def reaction(urls: dict[str, str], d: Path, samples: int) -> list[float]:
    """Seconds from a latency event that breaks a satisfied container's band to the decision it causes."""
    cfg = WorkerConfig(node="n1", nats_url=urls["worker-n1"], scenario=str(scenario_file(d, 1, 2.0, 1e9, 10.0)),
                       initial_interval_s=0.05, state_interval_s=5.0)
    app = await build(cfg)
    task = asyncio.create_task(serve(app, handle_signals=False))
    client = await Bus.connect(urls["inference-n1"], "bench-container")
    watcher = await Bus.connect(urls["client"], "bench-client")
    got: asyncio.Queue[float] = asyncio.Queue()

    def on_decision(m: DecisionMsg, _):
        if m.event and m.event.startswith("disturbance"):
            got.put_nowait(time.perf_counter())

    await watcher.subscribe(subjects.decisions("n1"), on_decision, expect=DecisionMsg)
    subj = subjects.latency("n1", "c000")

    def ev(lat: float) -> bytes:
        return schema.encode(LatencyEvent(container="c000", node="n1", latency_s=lat, images=100, batch=1), "bench")

    out = []
    ctrl = app.worker.ctrl
    for _ in range(samples):
        # In band until the listener has backed off (interval above its initial value).
        while True:
            await client.publish_raw(subj, ev(10.0))
            await asyncio.sleep(0.02)
            dcs = ctrl.last_decision
            if dcs and dcs.interval_s > 0.05 and ctrl.containers["c000"].cls is not None \
                    and ctrl.containers["c000"].cls.value == "S":
                break
        await client.publish_raw(subj, ev(20.0))
        await client.flush()
        t0 = time.perf_counter()
        await client.publish_raw(subj, ev(20.5))
        t1 = await asyncio.wait_for(got.get(), 5)
        out.append(t1 - t0)
    app.worker.stop()
    await task
    await client.close()
    await watcher.close()
    return out


def worker_cpu(url: str, creds: Path, d: Path, warm_s: float, span_s: float) -> float:
    """Share of one core a worker process uses with 100 simulated containers, real time."""
    sc = scenario_file(d, 100, 16.0, 3.0, 20.0)  # 100 containers sharing 16 cores: ~19 s batches
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "services.worker", "--nats", url, "--creds", str(creds), "--node", "n1",
                          "--scenario", str(sc), "--log-level", "warning"], env=env)
    try:
        time.sleep(warm_s)
        c0, t0 = cpu_seconds(p.pid), time.monotonic()
        time.sleep(span_s)
        return (cpu_seconds(p.pid) - c0) / (time.monotonic() - t0)
    finally:
        p.terminate()
        p.wait(10)


def run() -> dict:
    res: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, PrivateNats(["n1"]) as nats:
        _run(res, nats, Path(tmp))
    return res


def _run(res: dict, nats: PrivateNats, d: Path) -> None:
    urls = {i: nats.url_as(i) for i in ("worker-n1", "inference-n1", "client", "admin")}
    n = int(os.environ.get("DQOES_BENCH_INGEST_EVENTS", "200000"))
    rate, lost = asyncio.run(ingest(urls, d, n))
    res["ingest_events_per_s"] = report(f"latency events ingested by one worker ({n:,} sent, real NATS)", rate,
                                        "/s", goal=50_000, lower_is_better=False)
    res["ingest_events_lost"] = report("  of them lost (goal: none)", lost, "events")
    if CONTROL_RTT:
        res["control_during_flood_max_ms"] = report(
            f"  control request round trip during the flood, worst of {len(CONTROL_RTT)}", max(CONTROL_RTT) * 1e3,
            "ms")
    xs = asyncio.run(reaction(urls, d, 60))
    res["event_to_decision_median_ms"] = report("latency event -> published decision, median (60 samples)",
                                                median(xs) * 1e3, "ms")
    res["event_to_decision_p99_ms"] = report("latency event -> published decision, p99", pct(xs, 0.99) * 1e3, "ms")
    share = worker_cpu(nats.server.url, nats.creds("worker-n1"), d, warm_s=20.0, span_s=60.0)
    res["worker_cpu_100_containers"] = report("worker CPU, 100 containers, steady state (60 s)", share * 100,
                                              "% of a core", goal=1.0)
