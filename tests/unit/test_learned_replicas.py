"""Replicas on a node (same model, same images per batch) share what their curves show.

docs/design/learned.md, "Work shared by replicas": each curve's height takes its replicas' as a prior, as
wide as replicas on the node are seen to differ; a newcomer with a replica is placed before its first
batch; a replica whose curve moved on its own leaves the pool.
"""

from __future__ import annotations

import math
import time

import pytest

from shared.core.learned import Curve, LearnedParams, LearnedPolicy, PlanKind
from shared.core.learned.curve import NodeShare
from shared.core.learned.pooling import HEIGHT_SPREAD_MIN, group_of, pool_heights
from shared.core.types import BatchObs, ContainerView, NodeView, workload_of
from shared.scenarios.spec import parse_scenario
from shared.sim.engine import simulate

CORES = 4.0


def _view(name: str, objective_s: float, limit: float | None, batches: tuple[BatchObs, ...] = (),
          workload: str | None = None) -> ContainerView:
    lat = batches[-1].latency_s if batches else None
    return ContainerView(name=name, objective_s=objective_s, alpha=0.1, latency_s=lat, last_latency_s=lat,
                         cpu_share=None, limit=limit, batches=batches, workload=workload)


def _batch(work_cpu_s: float, limit: float, at_s: float, index: int) -> BatchObs:
    latency = work_cpu_s / (limit * CORES)
    return BatchObs(latency_s=latency, finished_at_s=at_s, limit=limit, clean=True, index=index,
                    cpu_s=work_cpu_s)


def _seen(policy: LearnedPolicy, works: dict[str, float], objectives: dict[str, float], rounds: int = 6,
          workload: str = "m@10") -> dict[str, float]:
    """Rounds of explicit views in which each container finishes one batch under its limit."""
    limits: dict[str, float | None] = {n: 0.2 for n in works}
    for r in range(rounds):
        views = tuple(_view(n, objectives[n], limits[n], (_batch(w, limits[n] or 0.2, 10.0 * r, r + 1),),
                            workload) for n, w in works.items())
        d = policy.decide(NodeView(node="n1", cores=CORES, now_s=10.0 * r, containers=views))
        limits.update({c.name: c.new_limit for c in d.containers})
    return {n: v for n, v in limits.items() if v is not None}


@pytest.mark.parametrize("pool", [1.0, 0.0])
@pytest.mark.parametrize("seen", [1, 2])
def test_a_newcomer_with_a_replica_is_placed_before_its_first_batch(pool, seen):
    # Replicas doing 8 CPU-seconds a batch have been seen at about one core (asked 8 s); "b" runs the
    # same model (its label says so, no batch yet) and asks 9 s a batch. Its replicas' curve places it
    # at once: met; in its band once two replicas show how far replicas on this node differ (one alone
    # cannot, so it is aimed with the margin an unknown spread asks). Without them it starts at an
    # equal part of what no limit holds.
    policy = LearnedPolicy(LearnedParams(pool_work=pool))
    names = [f"a{i}" for i in range(seen)]
    limits = _seen(policy, {n: 8.0 for n in names}, {n: 8.0 for n in names})
    views = (*(_view(n, 8.0, limits[n], workload="m@10") for n in names), _view("b", 9.0, None, workload="m"))
    d = policy.decide(NodeView(node="n1", cores=CORES, now_s=100.0, containers=views))
    b = next(c for c in d.containers if c.name == "b")
    if pool:
        latency = 8.0 / (b.new_limit * CORES)
        assert (8.1 if seen == 2 else 4.5) <= latency <= 9.9, b
        # Placed by its replicas' curve before any batch of its own.
        assert policy.curves["b"].node.height is not None and policy.curves["b"].n == 0
        assert policy.plans["b"].kind is not PlanKind.LEARNING, policy.plans["b"]
    else:
        assert policy.plans["b"].kind is PlanKind.LEARNING, policy.plans["b"]


def test_replicas_that_differ_are_each_learnt_from_their_own_batches():
    # Three replicas; "odd" does 1.6 x the work of the other two. The spread between replicas that
    # this shows widens every prior, so each fit follows its own batches.
    policy = LearnedPolicy()
    works = {"r1": 6.0, "r2": 6.0, "odd": 9.6}
    _seen(policy, works, {n: 8.0 for n in works}, rounds=8)
    for name, work in works.items():
        curve = policy.curves[name]
        pred = curve.predict(1.0)
        assert pred is not None and abs(pred[0] - math.log(work)) < 0.1, (name, pred, work)
    assert policy.curves["r1"].node.height is not None
    assert math.sqrt(policy.curves["r1"].node.height[2]) > 0.15  # the odd one shows replicas differ


def test_replicas_that_agree_are_trusted_no_closer_than_the_spread_measured_on_a_real_node():
    policy = LearnedPolicy()
    works = {"r1": 6.0, "r2": 6.0, "r3": 6.0}
    _seen(policy, works, {n: 8.0 for n in works}, rounds=8)
    sd = math.sqrt(policy.curves["r1"].node.height[2])  # the spread, and the mean of two's own variance
    assert HEIGHT_SPREAD_MIN <= sd < HEIGHT_SPREAD_MIN * math.sqrt(1.5) * 1.05


def test_a_replica_whose_curve_moved_leaves_the_pool():
    policy = LearnedPolicy()
    works = {"r1": 6.0, "r2": 6.0, "r3": 6.0}
    objectives = {n: 8.0 for n in works}
    limits = _seen(policy, works, objectives, rounds=6)
    # r3's work doubles: two batches far off the curve restart it, and its replicas no longer speak for it.
    for r in range(6, 12):
        views = tuple(_view(n, 8.0, limits[n], (_batch(w * (2.0 if n == "r3" else 1.0), limits[n], 10.0 * r,
                                                       r + 1),), "m@10") for n, w in works.items())
        d = policy.decide(NodeView(node="n1", cores=CORES, now_s=10.0 * r, containers=views))
        limits.update({c.name: c.new_limit for c in d.containers})
    r3 = policy.curves["r3"]
    assert r3.node.solo and r3.node.height is None
    assert abs(r3.predict(1.0)[0] - math.log(12.0)) < 0.1
    assert policy.curves["r1"].node.height is not None  # the other two still pool with each other
    assert 8.0 * 0.9 <= 12.0 / (limits["r3"] * CORES) <= 8.0 * 1.1, limits  # back in its band


def test_a_model_known_by_its_label_joins_its_replicas_while_they_run_one_batch_size():
    one = {"m@10": {}}
    assert group_of("m", one) == "m@10"
    assert group_of("m@10", one) == "m@10"
    assert group_of("m@20", one) is None
    assert group_of("m", {"m@10": {}, "m@20": {}}) is None  # which one it will be is not known
    assert group_of("other", one) is None and group_of(None, one) is None
    assert workload_of("resnet50", 10) == "resnet50@10" and workload_of("resnet50") == "resnet50"
    assert workload_of(None, 10) is None and workload_of("", None) is None


def test_no_replica_seen_no_prior():
    a, b = Curve(node=NodeShare(workload="m@10")), Curve(node=NodeShare(workload="n@10"))
    a.add(0.0, math.log(6.0), 1.0, (1.0, 1.0))
    b.add(0.0, math.log(3.0), 1.0, (1.0, 1.0))
    curves = {"a": a, "b": b}
    pool_heights(curves)
    assert a.node.height is None and b.node.height is None  # one of each model: nobody to learn from


def test_pool_work_is_a_parameter_like_the_others():
    assert LearnedParams().pool_work == 1.0
    with pytest.raises(ValueError, match="pool_work must be a number in"):
        LearnedParams(pool_work=2.0)


def _replicas_arriving(pool: float, seed: int) -> float:
    """Mean seconds from a replica's arrival to its first round with a met batch, on a scarce node."""
    # Six replicas of a slow model (60 CPU-seconds a batch) on 2 cores, asked 200 s a batch: 0.3 cores
    # each, 1.8 of the 2 cores in all. They arrive 60 s apart; the floor (1/12 of the node) would take
    # 360 s a batch.
    sc = parse_scenario({
        "name": "replicas", "duration_s": 2400.0, "noise_sigma": 0.05,
        "nodes": [{"name": "n1", "cores": 2.0}], "models": [{"name": "slow", "work_cpu_s": 60.0, "threads": 4}],
        "containers": [{"name": f"c{i}", "model": "slow", "objective_s": 200.0, "submit_at_s": 60.0 * i}
                       for i in range(6)],
        "controller": {"pool_work": pool},
    })
    res = simulate(sc, "learned", seed, record=True)
    waits = []
    for i in range(6):
        rows = [r for r in res.timeline if r["kind"] == "container" and r["container"] == f"c{i}"
                and r["latency_s"] is not None and r["latency_s"] <= 220.0]
        waits.append(rows[0]["t_s"] - 60.0 * i if rows else 2400.0)
    assert res.met_final == 6, (pool, seed, res.met_final)
    return sum(waits) / len(waits)


def test_on_a_scarce_node_a_replica_is_met_sooner_with_its_replicas_curve():
    pooled = [_replicas_arriving(1.0, seed) for seed in (1, 2, 3)]
    alone = [_replicas_arriving(0.0, seed) for seed in (1, 2, 3)]
    assert sum(pooled) < 0.8 * sum(alone), (pooled, alone)


def test_the_worker_hands_the_workload_its_batches_report_to_the_controller():
    from bench.fuzz_inputs import Harness
    from shared.schema import LatencyEvent

    h = Harness()
    try:
        w = h.worker
        w.on_latency(LatencyEvent(container="c1", node="n1", latency_s=2.9, images=10, batch=0,
                                  model="resnet50", finished_at=time.time()))
        assert w.ctrl.containers["c1"].workload == "resnet50@10"
    finally:
        h.close()
