"""Control core and simulator speed: a paper experiment and one Algorithm 1 round at scale.

Goals (issue "The control core..."): simulating paper-cluster-40 (>= 1,000 s of
virtual time) under 2 s of wall time; one Algorithm 1 round for 1,000 containers
on one node under 5 ms.
"""

from __future__ import annotations

import random
import time

from bench.common import median, pct, report, time_it
from shared.core import registry
from shared.core.classification import classify_views
from shared.core.controller import NodeController
from shared.core.dqoes import DQoESParams, update_limits
from shared.core.types import ContainerView
from shared.scenarios.builtin import BUILTINS
from shared.sim.engine import simulate


def views(n: int, seed: int = 7) -> list[ContainerView]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        o = rng.uniform(5, 100)
        out.append(ContainerView(f"c{i}", o, 0.1, o * rng.uniform(0.5, 1.5), None,
                                 rng.uniform(0.0005, 0.002), rng.uniform(0.0005, 0.002)))
    return out


def run() -> dict:
    res = {}
    sc = BUILTINS["paper-cluster-40"](1)
    ts = time_it(lambda: simulate(sc, "dqoes", 1), repeat=5)
    res["sim_cluster40_dqoes_s"] = report(
        f"paper-cluster-40, DQoES, {sc.duration_s:.0f} s simulated (median of 5)", median(ts), "s", goal=2.0)
    ts = time_it(lambda: simulate(sc, "default", 1), repeat=5)
    res["sim_cluster40_default_s"] = report("paper-cluster-40, default Swarm (median of 5)", median(ts), "s", goal=2.0)
    ts = time_it(lambda: simulate(sc, "oracle", 1), repeat=3)
    res["sim_cluster40_oracle_s"] = report("paper-cluster-40, oracle (median of 3)", median(ts), "s")
    r = simulate(sc, "dqoes", 1)
    res["sim_speedup"] = report("  virtual seconds per wall second (DQoES)", sc.duration_s / median(time_it(lambda: simulate(sc, 'dqoes', 1), 3)), "x")

    vs = views(1000)
    p = DQoESParams()
    ts = time_it(lambda: update_limits(classify_views(vs), p.beta, 1.0, len(vs)), repeat=50)
    res["alg1_round_1000_ms"] = report("Algorithm 1, one round, 1,000 containers (median of 50)", median(ts) * 1e3, "ms", goal=5.0)
    report("  p99", pct(ts, 0.99) * 1e3, "ms")

    ctrl = NodeController("n", 64.0, registry.build("dqoes"))
    for v in vs:
        ctrl.add(v.name, 0.0, cpu_total_s=0.0, objective_s=v.objective_s)
    totals = {v.name: 0.0 for v in vs}
    rng = random.Random(3)
    ts = []
    for k in range(51):
        for v in vs:  # what arrives between rounds: not part of the round
            totals[v.name] += 0.64 * 10 * rng.uniform(0.5, 1.5)
            ctrl.record_latency(v.name, (v.latency_s or v.objective_s) * rng.uniform(0.9, 1.1))
        t0 = time.perf_counter()
        ctrl.run_round(10.0 * (k + 1), totals)
        if k:
            ts.append(time.perf_counter() - t0)
    res["controller_round_1000_ms"] = report(
        "NodeController round (CPU deltas, Alg. 1 + 2), 1,000 containers", median(ts) * 1e3, "ms", goal=5.0)
    res["satisfied_cluster40_seed1"] = {"value": r.satisfied_final, "unit": "containers"}
    return res
