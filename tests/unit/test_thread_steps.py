"""Workloads whose threads follow their limit: max(1, floor(limit)) threads, so above one core only
whole cores help. The profile, the simulator's physics, the oracle's bound and the learned allocator
each take it into account; a workload that reports a fixed thread count is read as before."""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import pytest

from shared.core.controller import NodeController
from shared.core.learned import LearnedParams, LearnedPolicy
from shared.core.oracle import OracleItem, average_use, expected_plan, plan_node
from shared.core.profiles import ModelProfile
from shared.scenarios.builtin import load
from shared.scenarios.spec import ScenarioError, parse_scenario, scenario_to_dict
from shared.sim.engine import simulate
from shared.sim.physics import SimNode

FOLLOWS = ModelProfile("m", work_cpu_s=10.0, threads=4, follows_limit=True)
PINNED = ModelProfile("m", work_cpu_s=10.0, threads=4)


def test_a_follower_runs_the_whole_cores_of_its_limit_up_to_its_threads():
    assert [FOLLOWS.threads_at(c) for c in (None, 0.5, 1.0, 1.6, 2.0, 3.99, 7.0)] == [1, 1, 1, 1, 2, 3, 4]
    assert [PINNED.threads_at(c) for c in (None, 0.5, 1.6, 7.0)] == [4, 4, 4, 4]
    lat = [round(FOLLOWS.latency_s(c, 8.0), 3) for c in (0.5, 1.0, 1.6, 2.0, 3.5, 8.0)]
    assert lat == [20.0, 10.0, 10.0, 5.0, 3.333, 2.5]
    assert round(PINNED.latency_s(1.6, 8.0), 3) == 6.25
    # Alone on a node, a follower is fastest under a limit of the whole node; with no limit it runs one thread.
    assert FOLLOWS.fastest_s(8.0) == 2.5 and FOLLOWS.latency_s(None, 8.0) == 10.0
    assert FOLLOWS.with_threads(2).follows_limit and not FOLLOWS.with_threads(2, follows_limit=False).follows_limit
    with pytest.raises(ValueError, match="follows_limit"):
        ModelProfile("m", work_cpu_s=1.0, follows_limit=1)  # type: ignore[arg-type]


def test_the_simulated_node_gives_a_follower_only_the_whole_cores_of_its_limit():
    node = SimNode("n", 8.0)
    node.add("f", FOLLOWS, 0.0, random.Random(1), noise_sigma=0.0, limit=1.6 / 8)
    node.add("p", PINNED, 0.0, random.Random(2), noise_sigma=0.0, limit=1.6 / 8)
    assert node.containers["f"].rate == pytest.approx(1.0)
    assert node.containers["p"].rate == pytest.approx(1.6)
    node.set_limit("f", 2.0 / 8, 0.0)
    assert node.containers["f"].rate == pytest.approx(2.0)
    done = node.advance(5.01)
    assert [round(b.latency_s, 3) for b in done if b.container == "f"] == [5.0]


def test_the_oracles_plan_counts_a_container_whose_latency_steps_over_its_band_as_met_never_in_band():
    # 10 CPU-s a batch asked for 7 s (band 6.3-7.7): one thread takes 10 s, two take 5 s. Seven others
    # asked for 18 s need about half a core each (the floor, an eighth of the 8 cores' half, is 0.5).
    items = [OracleItem("x", 7.0, 0.1, FOLLOWS), *(OracleItem(f"y{i}", 18.0, 0.1, FOLLOWS) for i in range(7))]
    plan = plan_node(items, 8.0, sharing=False)
    assert plan.steps_over == ("x",) and len(plan.satisfied) == 7 and "x" not in plan.satisfied
    assert (plan.met_count, plan.count) == (8, 7)
    # Pinned threads reach the band at 10 / 7.7 = 1.3 cores: in band and met.
    pinned = plan_node([dataclasses.replace(it, profile=PINNED) for it in items], 8.0, sharing=False)
    assert (pinned.met_count, pinned.count, pinned.steps_over) == (8, 8, ())
    # With room for the others only, x is met by none: the plan does not count it for free.
    tight = plan_node(items, 5.0, sharing=False)
    assert tight.met_count == tight.count == 7
    # The bound reads x as sharing an over-subscribed node could run it (two threads at 1.3 cores), as
    # pinned threads: it never counts less than any policy reaches, so here it counts x in band.
    bound = plan_node(items, 8.0)
    assert (bound.met_count, bound.count, bound.steps_over) == (8, 8, ())


def test_the_oracles_plan_meets_a_container_that_steps_over_its_band_before_centring_others():
    # x (10 CPU-s asked for 7 s) is met from two whole cores on; seven one-thread y's asked for 18 s are
    # in band from 0.505 cores and centred at 0.556. On 5.8 cores, after the y's needs, 1.90 cores are
    # left: enough for x's two cores (1.64 more than its floor), not once the y's are centred (0.36).
    pinned_one = ModelProfile("y", work_cpu_s=10.0, threads=1)
    items = [OracleItem("x", 7.0, 0.1, FOLLOWS), *(OracleItem(f"y{i}", 18.0, 0.1, pinned_one) for i in range(7))]
    plan = plan_node(items, 5.8, sharing=False)
    assert plan.steps_over == ("x",) and plan.count == 7 and plan.met_count == 8
    assert plan.limits["x"] * 5.8 == pytest.approx(2.0)
    assert FOLLOWS.latency_s(plan.limits["x"] * 5.8, 5.8) <= 7.7
    assert sum(average_use(it.profile, plan.limits[it.name], 5.8) for it in items) <= 1.0 + 1e-9
    for it in items[1:]:
        assert 16.2 <= it.profile.latency_s(plan.limits[it.name] * 5.8, 5.8) <= 19.8 * (1 + 1e-6)  # the band, a hair wide


def test_the_bound_counts_what_sharing_an_over_subscribed_node_gives_a_follower():
    # Found by the property test: DQoES gave c1 (four threads following its limit, 7 CPU-s asked for
    # 2 s: three threads take 2.33 s, four 1.75 s) a limit above four cores beside c0's one thread on
    # 4.6 cores; CFS left it 3.6 cores, 1.94 s, in band, which no limit alone gives.
    tiny = ModelProfile("tiny", 7.0, 4, follows_limit=True)
    items = [OracleItem("c0", 8.0, 0.1, tiny), OracleItem("c1", 2.0, 0.1, tiny)]
    node = SimNode("n", 4.6)
    node.add("c0", tiny, 0.0, random.Random(1), noise_sigma=0.0, limit=0.25)
    node.add("c1", tiny, 0.0, random.Random(2), noise_sigma=0.0, limit=0.8804)
    assert node.containers["c1"].rate == pytest.approx(3.6)
    assert plan_node(items, 4.6, sharing=False).count == 0 and plan_node(items, 4.6).count == 1
    assert expected_plan(items, 4.6, 0.01).in_band_ceiling == pytest.approx(1.0, abs=0.05)


def test_the_oracle_splits_what_is_left_among_unachievable_followers_in_whole_cores():
    # Three followers that no limit meets, on 8 cores: what is left after their one core each was
    # charged in full shares of 2.33 cores, each running two threads, while the rest of the node
    # bought nothing (two cores idle). Charged what each step uses, it is three, three and two.
    slow = ModelProfile("slow", work_cpu_s=40.0, threads=8, follows_limit=True)
    items = [OracleItem(k, 1.0, 0.1, slow) for k in "abc"]
    plan = plan_node(items, 8.0, sharing=False)
    assert plan.too_slow == ("a", "b", "c")
    assert sorted(slow.threads_at(plan.limits[k] * 8.0) for k in "abc") == [2, 3, 3]
    assert sum(average_use(slow, plan.limits[k], 8.0) for k in "abc") == pytest.approx(1.0)


def test_the_oracle_never_leaves_a_core_idle_that_a_followers_next_thread_could_use():
    rng = random.Random(7)
    for _ in range(300):
        cores = rng.choice([2.0, 4.0, 8.0, 16.0])
        items = [
            OracleItem(f"c{i}", rng.uniform(0.5, 20.0), 0.1, ModelProfile(
                f"m{i}", work_cpu_s=rng.uniform(1.0, 40.0), threads=rng.choice([1, 2, 4, 8, 16]),
                overhead_s=rng.choice([0.0, 0.1, 1.0]), follows_limit=rng.random() < 0.7))
            for i in range(rng.randint(1, 6))
        ]
        plan = plan_node(items, cores, sharing=False)
        used = sum(average_use(it.profile, plan.limits[it.name], cores) for it in items)
        assert used <= 1.0 + 1e-9
        for it in items:
            now = plan.limits[it.name]
            met = it.profile.latency_s(now * cores, cores) <= (1 + it.alpha) * it.objective_s
            if it.name not in (*plan.too_slow, *plan.no_room, *plan.steps_over) or met or not it.profile.follows_limit:
                continue
            step = (it.profile.threads_at(now * cores) + 1) / cores
            if step <= 1.0 and it.profile.threads_at(now * cores) < it.profile.threads:
                more = average_use(it.profile, step, cores) - average_use(it.profile, now, cores)
                assert more > 1.0 - used + 1e-9, (it.name, now * cores, 1.0 - used, more)


def test_the_oracle_weighs_the_one_thread_a_follower_runs_with_no_limit():
    # One follower alone on 4.6 cores: the floor is 2.3 cores (two threads, 0.5 + 1 s = 1.5 s), faster
    # than its band around 2 s; with no limit it runs one thread (1 + 1 s = 2 s), in band. That is the
    # state of a one-core limit, which the plan now takes below the floor.
    tiny = ModelProfile("tiny", 1.0, 2, overhead_s=1.0, follows_limit=True)
    plan = plan_node([OracleItem("c0", 2.0, 0.1, tiny)], 4.6)
    assert (plan.count, plan.met_count, plan.satisfied) == (1, 1, ("c0",))
    assert plan.limits["c0"] * 4.6 == pytest.approx(1.0)
    ex = expected_plan([OracleItem("c0", 2.0, 0.1, tiny)], 4.6, 0.01)
    assert ex.in_band_ceiling == pytest.approx(1.0, abs=0.01) and ex.limits["c0"] * 4.6 == pytest.approx(1.0)
    # Pinned at two threads it has no such state: too fast at the floor, met and never in band.
    pinned = plan_node([OracleItem("c0", 2.0, 0.1, dataclasses.replace(tiny, follows_limit=False))], 4.6)
    assert (pinned.count, pinned.met_count, pinned.too_fast) == (0, 1, ("c0",))
    # Where the floor is a core or less, nothing changes: the plan starts at the floor.
    many = [OracleItem(f"c{i}", 2.0, 0.1, tiny) for i in range(3)]
    assert min(plan_node(many, 4.6).limits.values()) >= 1 / 6 - 1e-12


def _scenario(follows: bool, **controller: Any):
    return parse_scenario({
        "name": "steps", "duration_s": 600.0, "noise_sigma": 0.03,
        "nodes": [{"name": "n1", "cores": 4.0}],
        "models": [{"name": "m", "work_cpu_s": 10.0, "threads": 4, "follows_limit": follows}],
        # a: 10 CPU-s in 5.2 s (band 4.68-5.72) needs two threads, so two whole cores; b, c and d need
        # half a core each. All four start at a core each.
        "containers": [{"name": "a", "model": "m", "objective_s": 5.2},
                       *({"name": n, "model": "m", "objective_s": 20.0} for n in "bcd")],
        "controller": controller,
    })


def test_the_learned_allocator_gives_a_follower_that_needs_two_threads_two_whole_cores(policies_made):
    res = simulate(_scenario(True), "learned", 1, record=True)
    a = next(f for f in res.final if f.name == "a")
    assert a.met and a.satisfied
    assert a.limit * 4.0 == pytest.approx(2.0)  # whole cores: 1.9 would run one thread, 2.1 waste 0.1
    assert res.met_final == 4
    (policy,) = policies_made
    assert policy.curves["a"].steps  # read as a container whose threads follow its limit
    # Read as a limit of cores it may use (the earlier reading), a limit short of two cores runs one
    # thread at 10 s a batch, which looks like a ceiling of one core: never met.
    res0 = simulate(_scenario(True, thread_steps=0.0), "learned", 1, record=True)
    a0 = next(f for f in res0.final if f.name == "a")
    assert not a0.met
    # Pinned threads: read as before, any limit above 1.92 cores (10 CPU-s in 5.2 s) will do.
    pinned = simulate(_scenario(False), "learned", 1, record=True)
    ap = next(f for f in pinned.final if f.name == "a")
    assert ap.satisfied and ap.limit * 4.0 < 2.3


def test_a_fractional_share_above_one_core_is_cut_to_whole_cores_for_a_follower():
    # `hopeless` cannot be met (10 CPU-s in 1 s); its best effort is an equal part, whole cores of it.
    sc = parse_scenario({
        "name": "steps", "duration_s": 400.0, "noise_sigma": 0.03,
        "nodes": [{"name": "n1", "cores": 5.0}],
        "models": [{"name": "m", "work_cpu_s": 10.0, "threads": 4, "follows_limit": True}],
        "containers": [{"name": "hopeless", "model": "m", "objective_s": 1.0},
                       {"name": "b", "model": "m", "objective_s": 20.0}],
    })
    res = simulate(sc, "learned", 1, record=True)
    h = next(f for f in res.final if f.name == "hopeless")
    cores = h.limit * 5.0
    assert cores >= 1.0 and cores == pytest.approx(round(cores))


def test_the_controller_passes_on_what_the_batches_say_of_their_threads():
    ctrl = NodeController("n1", 4.0, LearnedPolicy())
    ctrl.add("c1", 0.0, objective_s=5.0)
    ctrl.record_latency("c1", 6.0, 1.0, 6.0, "m@10", follows_limit=True)
    view = ctrl.view(2.0, {})
    assert view.containers[0].follows_limit
    ctrl.record_latency("c1", 6.0, 3.0, 6.0, "m@10")
    assert not ctrl.view(4.0, {}).containers[0].follows_limit


def test_the_worker_hands_follows_limit_from_the_event_to_the_controller():
    from bench.fuzz_inputs import Harness
    from shared.schema import LatencyEvent

    h = Harness()
    try:
        w = h.worker
        w.on_latency(LatencyEvent(container="c1", node="n1", latency_s=2.9, images=10, batch=0,
                                  model="resnet50", finished_at=time.time(), follows_limit=True))
        assert w.ctrl.containers["c1"].follows_limit
    finally:
        h.close()


def test_a_scenario_file_says_whether_a_model_follows_its_limit():
    sc = _scenario(True)
    assert sc.profiles["m"].follows_limit
    again = parse_scenario(scenario_to_dict(sc))
    assert again.profiles["m"].follows_limit
    assert "follows_limit" not in scenario_to_dict(_scenario(False))["models"][0]
    with pytest.raises(ScenarioError, match="follows_limit"):
        parse_scenario({**scenario_to_dict(sc), "models": [{"name": "m", "work_cpu_s": 1.0, "follows_limit": "yes"}]})


def test_the_threads_variant_is_the_base_clusters_with_followers():
    base, var = load("random-cluster-40", 7), load("random-cluster-threads", 7)
    assert var.containers == base.containers and var.nodes == base.nodes
    assert all(p.follows_limit for p in var.profiles.values())
    assert not any(p.follows_limit for p in base.profiles.values())
    assert all(var.profile_of(c).threads == base.profile_of(c).threads for c in var.containers)


def test_thread_steps_is_a_parameter_like_the_others():
    assert LearnedParams().thread_steps == 1.0
    with pytest.raises(ValueError, match="thread_steps"):
        LearnedParams(thread_steps=2.0)
