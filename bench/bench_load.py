"""Load: 1,000 simulated containers on 10 nodes, one batch a second each, through real NATS.

A whole deployment (`Stack`: authenticated nats-server, the manager, one
worker process per node) runs a scenario of 10 nodes x 100 containers whose
batches take about a second of scenario time, for `DQOES_LOAD_SIM_S`
scenario seconds (default 600, ten minutes) at `DQOES_LOAD_TIME_SCALE`
(default 10). A client counts every decision each worker publishes: a round
number never seen is a decision lost. The resident memory of every worker and
of the manager is sampled every 2 s; the bound stated here is 300 MiB each.
`python -m bench load` (opt-in: minutes, ten processes).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

from bench.common import report
from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.bus import Bus
from shared.scenarios.spec import parse_scenario
from shared.schema import DecisionMsg

NODES = 10
PER_NODE = 100
MEMORY_BOUND_MIB = 300.0


def scenario(sim_s: float) -> dict:
    # 100 single-threaded containers share 16 cores: 0.16 core each, so 0.16 CPU-s of work
    # is a batch of about a second at fair share (and objectives of 1 s).
    return {
        "name": "load-1000", "duration_s": sim_s + 60, "noise_sigma": 0.03,
        "nodes": [{"name": f"n{i:02d}", "cores": 16} for i in range(NODES)],
        "models": [{"name": "m", "work_cpu_s": 0.16, "threads": 1}],
        "containers": [{"name": f"n{i:02d}c{k:03d}", "model": "m", "objective_s": 1.0, "node": f"n{i:02d}"}
                       for i in range(NODES) for k in range(PER_NODE)],
    }


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def follow(stack: Stack, wall_s: float) -> tuple[dict[str, set[int]], dict[str, float], int]:
    """Decision rounds seen per node, peak RSS per process, and latency-free wall time."""
    bus = await Bus.connect(stack.url, "bench-load")
    rounds: dict[str, set[int]] = {}
    peak: dict[str, float] = {}

    def on_decision(m: DecisionMsg, _: object) -> None:
        rounds.setdefault(m.node, set()).add(m.round)

    await bus.subscribe(subjects.DECISIONS_ALL, on_decision, expect=DecisionMsg)
    t_end = time.monotonic() + wall_s
    samples = 0
    while time.monotonic() < t_end:
        for name, p in stack.procs.items():
            peak[name] = max(peak.get(name, 0.0), rss_mib(p.pid))
        samples += 1
        stack.supervise()
        await asyncio.sleep(2.0)
    await asyncio.sleep(1.0)
    await bus.close()
    return rounds, peak, samples


def run() -> dict:
    sim_s = float(os.environ.get("DQOES_LOAD_SIM_S", "600"))
    scale = float(os.environ.get("DQOES_LOAD_TIME_SCALE", "10"))
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(StackSpec(parse_scenario(scenario(sim_s)), time_scale=scale, start_delay_s=3.0,
                                state_interval_s=1.0), run_dir=Path(tmp) / "run")
        with stack:
            rounds, peak, _ = asyncio.run(follow(stack, sim_s / scale + 3.0))
            restarts = dict(stack.restarts)
    lost = 0
    for node in (f"n{i:02d}" for i in range(NODES)):
        seen = rounds.get(node, set())
        if seen:
            lost += len(set(range(min(seen), max(seen) + 1)) - seen)
    decisions = sum(len(s) for s in rounds.values())
    print(f"  {NODES} nodes x {PER_NODE} containers, {sim_s:g} s of scenario time at x{scale:g}: "
          f"{decisions} decisions from {len(rounds)} workers, restarts {restarts or 'none'}", flush=True)
    res["decisions_lost"] = report("decisions lost (round numbers never seen)", lost, "decisions")
    workers = [v for k, v in peak.items() if k.startswith("worker-")]
    res["worker_rss_peak_mib"] = report("worker resident memory, peak of the 10", max(workers, default=0.0), "MiB",
                                        goal=MEMORY_BOUND_MIB)
    res["manager_rss_peak_mib"] = report("manager resident memory, peak", peak.get("manager", 0.0), "MiB",
                                         goal=MEMORY_BOUND_MIB)
    return res
