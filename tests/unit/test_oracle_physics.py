"""The oracle's exact plans, the profiles' latency curves and the simulated node's physics."""

from __future__ import annotations

import math
import random

import pytest

from shared.core.oracle import OracleItem, plan_node
from shared.core.profiles import BUILTIN_PROFILES, ModelProfile, at_batch, limit_for_latency
from shared.sim.physics import SimNode, water_fill

P = ModelProfile("m", work_cpu_s=10.0, threads=4)


def test_water_fill():
    assert water_fill([1, 1], 4) == [1, 1]
    assert water_fill([4, 4], 4) == [2, 2]
    assert water_fill([0.5, 4, 4], 4) == [0.5, 1.75, 1.75]
    assert water_fill([], 4) == []
    assert sum(water_fill([3, 3, 3], 2)) == pytest.approx(2)


def test_latency_curve():
    assert P.latency_s(None, 2.0) == 5.0  # two cores, four threads
    assert P.latency_s(1.0, 8.0) == 10.0
    assert P.latency_s(8.0, 8.0) == 2.5  # capped by threads
    q = ModelProfile("q", 10.0, 1, efficiency=((0.25, 2.0), (0.5, 1.2), (1.0, 1.0)))
    assert q.cpu_multiplier(None) == 1.0
    assert q.cpu_multiplier(0.5) == pytest.approx(1.2)
    assert q.cpu_multiplier(0.75) == pytest.approx(1.1)
    assert q.cpu_multiplier(0.1) == 2.0
    assert q.latency_s(0.5, 2.0) == pytest.approx(10 * 1.2 / 0.5)


def test_profile_validation():
    with pytest.raises(ValueError):
        ModelProfile("x", 0)
    with pytest.raises(ValueError):
        ModelProfile("x", 1, efficiency=((0.5, 1.0), (1.0, 1.5)))


def test_a_profile_at_another_batch_scales_its_work_by_images_and_pixels():
    q = ModelProfile("q", 2.0, 1, overhead_s=0.1, efficiency=((0.5, 1.2),), batch_images=10, resolution_px=224)
    assert at_batch(q, 10, 224) is q
    assert at_batch(q, 30, 224).work_cpu_s == pytest.approx(6.0)
    big = at_batch(q, 10, 448)
    assert big.work_cpu_s == pytest.approx(8.0) and big.resolution_px == 448 and "scaled from 10 images" in big.source
    assert (big.overhead_s, big.efficiency, big.threads) == (q.overhead_s, q.efficiency, q.threads)
    assert big.latency_s(0.5, 2.0) == pytest.approx(4 * (q.latency_s(0.5, 2.0) - 0.1) + 0.1)
    for images, px in ((0, 224), (10, 0), (1.5, 224)):
        with pytest.raises(ValueError):
            at_batch(q, images, px)


def test_limit_for_latency_inverts_the_curve():
    L = limit_for_latency(P, 20.0, 4.0, lo=0.01, hi=1.0)
    assert P.latency_s(L * 4.0, 4.0) == pytest.approx(20.0, rel=1e-6)
    assert limit_for_latency(P, 1.0, 4.0, lo=0.01, hi=1.0) is None  # faster than 4 threads allow


def items(*objectives, profile=P):
    return [OracleItem(f"c{i}", o, 0.1, profile) for i, o in enumerate(objectives)]


def test_oracle_counts_what_fits():
    # 4-core node, 10 CPU-s a batch. Objective 10 s needs 1 core (0.25 of the node, /1.1 at the edge).
    plan = plan_node(items(10, 10, 10, 10), 4.0)
    assert plan.count == 4
    # Five: floor 0.1 each; at the band edge (11 s) one needs 0.227 of the node,
    # so four would take 4 * 0.227 + 0.1 > 1 and only three fit.
    plan = plan_node(items(10, 10, 10, 10, 10), 4.0)
    assert plan.count == 3 and len(plan.no_room) == 2
    assert sum(plan.limits.values()) == pytest.approx(1.0)
    assert all(plan.limits[k] == pytest.approx(0.25) for k in plan.satisfied)  # leftover moved them to the centre


def test_oracle_classifies_the_impossible():
    plan = plan_node(items(1.0, 1000.0, 10.0), 4.0)
    assert plan.too_slow == ("c0",)  # faster than four threads can go
    assert plan.too_fast == ("c1",)  # even the floor (1/6 of the node) is too fast
    assert plan.satisfied == ("c2",)


def test_oracle_plan_is_feasible_and_in_band():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 8)
        cores = rng.choice([2.0, 4.0, 4.6])
        its = [
            OracleItem(f"c{i}", rng.uniform(1, 120), rng.choice([0.1, 0.2]),
                       ModelProfile("m", rng.uniform(1, 30), rng.choice([1, 2, 4])))
            for i in range(n)
        ]
        plan = plan_node(its, cores)
        floor = 1 / (2 * n)
        used = sum(min(plan.limits[i.name], i.profile.threads / cores) for i in its)
        assert used <= 1 + 1e-9
        for it in its:
            L = plan.limits[it.name]
            assert floor - 1e-12 <= L <= 1.0 + 1e-12
            if it.name in plan.satisfied:
                lat = it.profile.latency_s(L * cores, cores)
                lo, hi = (1 - it.alpha) * it.objective_s, (1 + it.alpha) * it.objective_s
                assert lo * (1 - 1e-6) <= lat <= hi * (1 + 1e-6)


def node_with(*profiles, cores=2.0, sigma=0.0):
    n = SimNode("n", cores)
    for i, p in enumerate(profiles):
        n.add(f"c{i}", p, 0.0, random.Random(i), sigma)
    return n


def test_alone_a_batch_takes_work_over_threads():
    n = node_with(ModelProfile("m", 10.0, threads=1), cores=2.0)
    done = n.advance(35.0)
    assert [round(b.latency_s, 9) for b in done] == [10.0, 10.0, 10.0]
    assert n.cpu_total_s("c0") == pytest.approx(35.0)


def test_fair_share_and_limits():
    n = node_with(ModelProfile("m", 10.0, 2), ModelProfile("m", 10.0, 2), cores=2.0)
    done = n.advance(10.0)
    assert {b.container for b in done} == {"c0", "c1"}  # one core each -> 10 s
    n.set_limit("c0", 0.25, 10.0)  # half a core
    done = n.advance(40.0)
    lat = {b.container: b.latency_s for b in done if b.batch == 1}
    assert lat["c0"] == pytest.approx(20.0)
    assert lat["c1"] == pytest.approx(10.0 / 1.5)  # water-filling hands c1 the other 1.5 cores


def test_overhead_frees_the_cpu():
    p = ModelProfile("m", 2.0, threads=1, overhead_s=2.0)
    n = node_with(p, p, cores=1.0)
    # Computing together each gets half a core: 4 s compute, then 2 s overhead.
    b = n.advance(6.0)
    assert [round(x.latency_s, 9) for x in b] == [6.0, 6.0]


def test_efficiency_multiplier_costs_cpu_under_a_quota():
    p = ModelProfile("m", 10.0, threads=1, efficiency=((0.5, 2.0), (1.0, 1.0)))
    n = node_with(p, cores=1.0)
    n.set_limit("c0", 0.5, 0.0)
    b = n.advance(50.0)[0]
    assert b.latency_s == pytest.approx(40.0)  # 20 CPU-s at half a core
    assert b.cpu_s == pytest.approx(20.0)


def test_noise_is_reproducible_per_container():
    p = BUILTIN_PROFILES["resnet50"]
    a = [b.latency_s for b in node_with(p, sigma=0.03).advance(200)]
    b = [b.latency_s for b in node_with(p, sigma=0.03).advance(200)]
    assert a == b and len(set(a)) > 1
    assert all(abs(math.log(x / 18.0)) < 0.2 for x in a)


def _log_latencies(rho: float, sigma: float, batches: int = 2000) -> list[float]:
    node = SimNode("n", 4.0)
    node.add("c", P, 0.0, random.Random("sticky"), sigma, None, rho)
    out: list[float] = []
    t = 0.0
    while len(out) < batches:
        t += 50.0
        out += [math.log(b.latency_s) for b in node.advance(t)]
    return out[:batches]


def _lag_one(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((a - m) * (b - m) for a, b in zip(xs, xs[1:], strict=False)) / sum((x - m) ** 2 for x in xs)


@pytest.mark.parametrize("rho", [0.0, 0.6, 0.9])
def test_noise_that_persists_keeps_its_spread_and_has_its_correlation(rho):
    # Alone on 4 cores with 4 threads a batch takes 2.5 s times its noise: the log latencies are
    # the noise itself. Each batch's spread stays sigma whatever rho is; only the runs change.
    xs = _log_latencies(rho, 0.2)
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    assert sd == pytest.approx(0.2, rel=0.15 if rho < 0.9 else 0.3)
    assert _lag_one(xs) == pytest.approx(rho, abs=0.06)


def test_independent_noise_draws_as_before():
    # rho 0 keeps the draws of independent noise, so every run recorded before rho existed repeats.
    a, b = SimNode("a", 4.0), SimNode("b", 4.0)
    a.add("c", P, 0.0, random.Random("same"), 0.1, None)
    b.add("c", P, 0.0, random.Random("same"), 0.1, None, 0.0)
    assert [x.latency_s for x in a.advance(500.0)] == [x.latency_s for x in b.advance(500.0)]


@pytest.mark.parametrize("rho", [-0.1, 1.0, 1.5])
def test_a_correlation_outside_0_to_1_is_refused(rho):
    with pytest.raises(ValueError, match="noise_rho must be in"):
        SimNode("n", 4.0).add("c", P, 0.0, random.Random(1), 0.1, None, rho)
