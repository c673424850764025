"""The learned allocator in the simulator, with explicit times: drift, noise, the unachievable,
arrivals and departures, objectives that change twice.

Each scenario is small and written out here, so what the policy faces is
visible: a model `m` whose batch costs 10 CPU-seconds on up to 4 threads
(latency = 10 / cores below 4 cores), on one node.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.learned import Curve, LearnedPolicy, Plan, PlanKind, Solution, solve
from shared.core.learned.guards import take
from shared.core.learned.observe import observe_straddled
from shared.core.learned.solver import chances, expected_best_limit
from shared.core.types import Cls, is_satisfied
from shared.scenarios.spec import parse_scenario
from shared.sim.engine import SimResult, simulate

MODEL = {"name": "m", "work_cpu_s": 10.0, "threads": 4}


def scenario(containers: list[dict[str, Any]], *, cores: float = 4.0, duration_s: float = 900.0,
             noise: float = 0.03, **controller: Any):
    return parse_scenario({
        "name": "learned-test", "duration_s": duration_s, "noise_sigma": noise,
        "nodes": [{"name": "n1", "cores": cores}], "models": [MODEL],
        "containers": [{"model": "m", **c} for c in containers], "controller": controller,
    })


def run(sc, seed: int = 1) -> SimResult:
    return simulate(sc, "learned", seed, record=True)


def container_rows(res: SimResult, name: str) -> list[dict[str, Any]]:
    return [r for r in res.timeline if r["kind"] == "container" and r["container"] == name]


def final(res: SimResult, name: str):
    return next(f for f in res.final if f.name == name)


def rounds_out_of_band_after(res: SimResult, name: str, after_s: float, objective_s: float, alpha: float = 0.1) -> int:
    """Rounds after `after_s` that reported the container outside its band before it was back for good."""
    rows = [r for r in container_rows(res, name) if r["t_s"] > after_s and r["latency_s"] is not None]
    last_out = 0
    for i, r in enumerate(rows, 1):
        if not is_satisfied(objective_s, r["latency_s"], alpha):
            last_out = i
    return last_out


def test_a_curve_that_doubles_is_back_in_band_within_three_rounds():
    # c1 needs 10/12 = 0.83 cores, then 1.67 when its batches cost twice as much (the floor,
    # a sixth of the node, is 0.67 cores).
    sc = scenario([
        {"name": "c1", "objective_s": 12.0, "changes": [{"at_s": 400.0, "work_factor": 2.0}]},
        {"name": "c2", "objective_s": 10.0},
        {"name": "c3", "objective_s": 12.0},
    ])
    res = run(sc)
    before = [r for r in container_rows(res, "c1") if 300 < r["t_s"] < 400]
    assert before and all(r["cls"] == "S" for r in before)
    assert rounds_out_of_band_after(res, "c1", 400.0, 12.0) <= 3
    f = final(res, "c1")
    assert f.satisfied and 1.5 <= f.limit * 4.0 <= 2.0
    assert final(res, "c2").satisfied and final(res, "c3").satisfied


def test_noisy_latencies_do_not_make_limits_flap():
    sc = scenario([{"name": f"c{i}", "objective_s": o} for i, o in enumerate((12.0, 20.0, 30.0, 40.0, 25.0, 15.0))],
                  noise=0.15, duration_s=1800.0)
    res = run(sc)
    for i in range(6):
        late = [r for r in container_rows(res, f"c{i}") if r["t_s"] > 600]
        limits = [r["limit"] for r in late]
        changes = sum(1 for a, b in zip(limits, limits[1:], strict=False) if a != b)
        # Twenty minutes of batches at sigma 0.15: a limit may be corrected, not chased.
        assert changes <= 3, (f"c{i}", changes, limits)
    assert res.met_final >= 5


def test_an_unachievable_container_gets_a_fair_best_effort_and_the_others_are_met():
    sc = scenario([
        {"name": "hopeless", "objective_s": 1.0},  # 10 CPU-s in 1 s needs 10 cores; the node has 4
        {"name": "a", "objective_s": 10.0},
        {"name": "b", "objective_s": 20.0},
        {"name": "c", "objective_s": 40.0},
    ])
    res = run(sc)
    assert all(final(res, n).met for n in "abc")
    h = final(res, "hopeless")
    assert not h.met
    # Never starved: at least its fair share of the node (a quarter), and it keeps getting batches.
    assert h.limit is not None and h.limit >= 0.25 - 1e-9
    assert h.batches > 60  # a batch every 10 s or less


def test_arrivals_and_departures_leave_no_state_behind_and_free_their_cpu(policies_made):
    sc = scenario([
        {"name": "stay", "objective_s": 10.0},
        {"name": "brief", "objective_s": 5.0, "submit_at_s": 100.0, "duration_s": 300.0},
        {"name": "late", "objective_s": 4.0, "submit_at_s": 500.0},
    ])
    res = run(sc)
    (policy,) = policies_made
    assert set(policy.curves) == {"stay", "late"}  # "brief" left: nothing of it is kept
    assert final(res, "late").met and final(res, "stay").met
    # "late" needs 2.5 cores: only there because "brief" (2 cores) released its CPU.
    assert final(res, "late").limit * 4.0 >= 2.4


def test_an_objective_changed_twice_in_quick_succession_ends_on_the_second():
    # The floor is a quarter of the node (1 core): 20 s is faster than asked even there; 5 s
    # needs 2 cores and 8 s 1.25.
    sc = scenario([
        {"name": "c1", "objective_s": 20.0,
         "changes": [{"at_s": 400.0, "objective_s": 5.0}, {"at_s": 405.0, "objective_s": 8.0}]},
        {"name": "c2", "objective_s": 10.0},
    ])
    res = run(sc)
    rows = [r for r in container_rows(res, "c1") if r["t_s"] >= 405.0]
    assert rows[0]["objective_s"] == 8.0
    assert rounds_out_of_band_after(res, "c1", 405.0, 8.0) <= 3
    f = final(res, "c1")
    assert f.satisfied and f.objective_s == 8.0
    # The learned curve answers a new objective at once: few moves after the second change.
    moves = [r for r in rows if r["t_s"] > 405.0]
    limits = [r["limit"] for r in moves]
    assert sum(1 for a, b in zip(limits, limits[1:], strict=False) if abs(b - a) > 0.05 * max(a, b)) <= 3


def test_an_even_split_it_learns_matches_the_oracle_on_the_papers_achievable_experiment():
    from shared.scenarios.builtin import BUILTINS

    for name in ("paper-identical-achievable", "fig2node-identical-achievable"):
        res = simulate(BUILTINS[name](1), "learned", 1)
        assert res.met_final == res.oracle_met == 10, name
        assert res.satisfied_final == res.oracle_satisfied == 10, name


def test_the_last_plans_say_what_the_solver_decided(policies_made):
    res = run(scenario([{"name": "hopeless", "objective_s": 1.0}, {"name": "a", "objective_s": 10.0}]))
    (policy,) = policies_made
    assert policy.plans["hopeless"].kind is PlanKind.UNACHIEVABLE
    assert policy.plans["a"].kind is PlanKind.IN_BAND
    assert res.timeline[-1]["cls"] in (Cls.S.value, Cls.G.value, Cls.B.value)


@pytest.mark.parametrize("slow_batch", [0, 1], ids=["warm-up", "a slow spell"])
def test_a_slow_batch_is_not_taken_for_a_ceiling_for_good(slow_batch):
    """A batch that used little CPU with room to spare must not cap the container for good.

    Explicit views, no simulator: `x` (objective 4 s) needs 2.5 of the node's 4 cores for its
    10 CPU-seconds a batch; one batch (the warm-up, which loads the model, or a later slow
    spell) took 30 s at a third of a core with the node nearly idle.
    """
    from shared.core.types import BatchObs, ContainerView, NodeView

    policy = LearnedPolicy()
    objectives = {"x": 4.0, "y": 20.0}
    limits: dict[str, float | None] = {"x": None, "y": None}
    now, index = 0.0, 0
    for _ in range(12):
        views = []
        for name, objective in objectives.items():
            limit = limits[name]
            if index == slow_batch:
                latency, cpu_s = 30.0, 10.0  # slow, and far from using its CPU
            elif limit is None:
                latency, cpu_s = 5.0, 10.0  # no limits yet: two cores each
            else:
                latency, cpu_s = 10.0 / (limit * 4.0), 10.0
            batch = BatchObs(latency_s=latency, finished_at_s=now, limit=limit, clean=True, index=index, cpu_s=cpu_s)
            views.append(ContainerView(name=name, objective_s=objective, alpha=0.1, latency_s=latency,
                                       last_latency_s=latency, cpu_share=cpu_s / latency / 4.0, limit=limit,
                                       batches=(batch,)))
        decision = policy.decide(NodeView(node="n1", cores=4.0, now_s=now, containers=tuple(views)))
        limits.update({c.name: c.new_limit for c in decision.containers})
        now, index = now + 30.0, index + 1
    x_latency = 10.0 / (limits["x"] * 4.0)
    assert x_latency <= 4.0 * 1.1, limits
    assert 10.0 / (limits["y"] * 4.0) <= 20.0 * 1.1, limits


def _fraction(res: SimResult, name: str, after_s: float, objective_s: float, test) -> float:
    rows = [r for r in container_rows(res, name) if r["t_s"] > after_s and r["latency_s"] is not None]
    return sum(1 for r in rows if test(objective_s, r["latency_s"])) / max(1, len(rows))


def test_under_noise_as_wide_as_the_band_it_aims_where_batches_land_in_band_most():
    # sigma 0.12 against a +-10 % band: a slow-edge margin of 1.5 sigma would aim faster than the band
    # (1.1 x exp(-0.18) = 0.92 of the objective); the expected solve aims nearer the centre. Room for
    # everyone (3.1 of 4 cores at the objectives; the floor, 0.67 cores, is slower than each band), so
    # only the aim matters. The slow-edge margin kept 0.39 of batches in band on these runs
    # (docs/decisions/expected-aim.md).
    objectives = (8.0, 10.0, 12.0)
    containers = [{"name": f"c{i}", "objective_s": o} for i, o in enumerate(objectives)]
    band, met = [], []
    for seed in (1, 2, 3):
        res = run(scenario(containers, noise=0.12, duration_s=2400.0), seed)
        for i, o in enumerate(objectives):
            band.append(_fraction(res, f"c{i}", 900.0, o, lambda ob, lat: is_satisfied(ob, lat, 0.1)))
            met.append(_fraction(res, f"c{i}", 900.0, o, lambda ob, lat: lat <= 1.1 * ob))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(band) > 0.42, band
    # In band at best ~2 Phi(0.1 / 0.12) - 1 = 0.6 of batches; met stays most of the time.
    assert mean(met) >= 0.8, met


def test_a_container_left_out_for_room_gets_what_is_left_when_that_gives_it_a_chance():
    # 2 cores, a floor of a quarter core each: c0-c2 need 0.55 core each at their band's slow edge and
    # a little more with a margin for the noise, so two fit with margins and the third does not; c3
    # cannot be met at all. An equal split of what is left between c3 and the third leaves the third
    # late every batch; all of it brings the third to its slow edge, met about every other batch.
    # Eight seeds: how the noise falls decides how much of the margin the two keep (a run or two in
    # three gives the third little).
    # An equal split met the three 2.04 batch shares together on these seeds, the third 0.06
    # (docs/decisions/expected-aim.md); what is left, given whole, does better.
    def met_fractions(seed: int) -> list[float]:
        sc = scenario([{"name": "c0", "objective_s": 16.6}, {"name": "c1", "objective_s": 16.6},
                       {"name": "c2", "objective_s": 16.6}, {"name": "c3", "objective_s": 1.0}],
                      cores=2.0, noise=0.05, duration_s=1500.0)
        res = run(sc, seed)
        return [_fraction(res, f"c{i}", 600.0, 16.6, lambda ob, lat: lat <= 1.1 * ob) for i in range(3)]

    chance = [met_fractions(seed) for seed in range(1, 9)]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731

    assert mean([sum(x) for x in chance]) > 2.1, chance
    assert mean([min(x) for x in chance]) > 0.25, chance


def test_the_noise_it_allows_for_is_the_noise_there_is_after_a_dozen_batches(policies_made):
    # Long batches (about two minutes each, a dozen a run) spread by sigma 0.12 (log sd): the
    # margin each container is aimed with must be about that, not what a few lucky first
    # batches suggested (an earlier estimate stayed at half of it).
    sigma = 0.12
    ratios = []
    for seed in range(1, 6):
        policies_made.clear()
        sc = parse_scenario({
            "name": "long-batches", "duration_s": 1500.0, "noise_sigma": sigma,
            "nodes": [{"name": "n1", "cores": 4.0}], "models": [{"name": "m", "work_cpu_s": 120.0, "threads": 4}],
            "containers": [{"name": f"c{i}", "model": "m", "objective_s": o}
                           for i, o in enumerate((100.0, 120.0, 140.0, 160.0))],
        })
        simulate(sc, "learned", seed)
        (policy,) = policies_made
        for curve in policy.curves.values():
            assert 5 <= curve.n <= 20
            ratios.append(curve.noise / sigma)
    assert len(ratios) == 20
    assert 0.7 <= sum(ratios) / len(ratios) <= 1.2, ratios


class _FixedPlans(LearnedPolicy):
    """The learned allocator's arbitration (dead bands, capacity) on plans given outright."""

    def __init__(self, plans) -> None:
        super().__init__(solver=lambda *_: Solution(dict(self.fixed), set(), set()))
        self.fixed = plans


def _views(limits: dict[str, float], objective_s: float = 10.0):
    from shared.core.types import ContainerView

    return tuple(ContainerView(name=n, objective_s=objective_s, alpha=0.1, latency_s=None, last_latency_s=None,
                               cpu_share=None, limit=lim, batches=()) for n, lim in limits.items())


def _decide(policy: LearnedPolicy, limits: dict[str, float], objective_s: float = 10.0) -> dict[str, float]:
    from shared.core.types import NodeView

    d = policy.decide(NodeView(node="n1", cores=4.0, now_s=100.0, containers=_views(limits, objective_s)))
    return {c.name: c.new_limit for c in d.containers}


def test_rises_of_the_best_effort_give_way_before_a_kept_limit_is_cut():
    # Four containers, floor 1/8. "t" is faster than its band even at the floor and keeps its limit
    # (up to 1.5 floors, no trimming); "u" cannot be met and its share rises from 0.15 to 0.25. The
    # plans sum to the node, so what "t" keeps over its plan comes out of that rise: "t" does not move.
    plans = {"t": Plan(0.125, PlanKind.TOO_FAST), "u": Plan(0.25, PlanKind.UNACHIEVABLE),
             "a": Plan(0.3, PlanKind.UNACHIEVABLE), "b": Plan(0.325, PlanKind.UNACHIEVABLE)}
    new = _decide(_FixedPlans(plans), {"t": 0.18, "u": 0.15, "a": 0.3, "b": 0.325})
    assert new["t"] == 0.18
    assert new["u"] == pytest.approx(0.25 - 0.055)
    assert (new["a"], new["b"]) == (0.3, 0.325)
    assert sum(new.values()) <= 1.0 + 1e-9


def test_a_container_too_fast_at_the_floor_is_not_trimmed_as_the_floor_falls_unless_room_is_short():
    # "t" is faster than its band even at the floor. Set at the floor of a node of two (a quarter),
    # it keeps that limit when two more arrive (the floor falls to an eighth: 2 floors), up to 3
    # floors; a newcomer's share of 2 floors is trimmed (not yet held as too fast); and when the
    # others' plans need the room, what it holds over its plan is taken back, only as far as they need.
    def plans(floor: float, others: float, names: str = "abc") -> dict:
        return {"t": Plan(floor, PlanKind.TOO_FAST), **{n: Plan(others, PlanKind.LEARNING) for n in names}}

    def held_at(limit: float) -> _FixedPlans:
        pol = _FixedPlans(plans(0.25, 0.75, "a"))
        assert _decide(pol, {"t": limit, "a": 0.75})["t"] == 0.25
        return pol

    pol = held_at(0.25)
    pol.fixed = plans(0.125, 0.2)
    assert _decide(pol, {"t": 0.25, "a": 0.2, "b": 0.2, "c": 0.2})["t"] == 0.25
    assert _decide(_FixedPlans(plans(0.125, 0.2)), {"t": 0.25, "a": 0.2, "b": 0.2, "c": 0.2})["t"] == 0.125
    pol = held_at(0.25)
    pol.fixed = plans(0.08, 0.2)  # a floor of 1/12: 3.1 floors
    assert _decide(pol, {"t": 0.25, "a": 0.2, "b": 0.2, "c": 0.2})["t"] == 0.08
    pol = held_at(0.25)
    pol.fixed = plans(0.125, 0.27)
    short = _decide(pol, {"t": 0.25, "a": 0.2, "b": 0.2, "c": 0.2})
    assert short["t"] == pytest.approx(0.19)
    assert [short[n] for n in "abc"] == [0.27] * 3
    assert sum(short.values()) <= 1.0 + 1e-9


def test_a_container_in_band_is_not_trimmed_for_a_chance_it_barely_gains():
    # A curve known from many batches (10 CPU-seconds a batch, log sd 0.08) and an objective of 10 s:
    # at 1.06 cores (9.4 s) and at 1.0 core (10 s) its next batch is about as likely met plus in
    # band (1.67 either way: late less often, too fast more often), so a plan 6 % lower is not
    # worth a move; from 1.6 cores (6.25 s, faster than its band every batch) it is.
    import math

    def policy_with_curve(plan_limit: float) -> LearnedPolicy:
        pol = _FixedPlans({"x": Plan(plan_limit, PlanKind.IN_BAND), "y": Plan(0.25, PlanKind.UNACHIEVABLE)})
        curve = pol.curve("x")
        for i in range(40):
            cores = (0.8, 1.0, 1.25, 1.6)[i % 4]
            curve.add(math.log(cores), math.log(10.0 / cores) + (0.08 if i % 8 < 4 else -0.08), 1.0, (1.0, 1.0))
        return pol

    assert _decide(policy_with_curve(0.25), {"x": 1.06 / 4, "y": 0.25})["x"] == 1.06 / 4
    assert _decide(policy_with_curve(0.25), {"x": 1.6 / 4, "y": 0.25})["x"] == 0.25


def test_a_container_far_faster_than_its_band_is_trimmed_even_when_the_step_is_worth_little_yet():
    # Every batch seen at 1 core, 10 s; the objective is now 40 s. A plan of half a core (20 s,
    # still faster than the band) is worth little more by the fit, but staying would keep it
    # faster than asked for good: it moves, and learns the curve further down.
    import math

    pol = _FixedPlans({"x": Plan(0.125, PlanKind.IN_BAND), "y": Plan(0.25, PlanKind.UNACHIEVABLE)})
    curve = pol.curve("x")
    for i in range(20):
        curve.add(0.0, math.log(10.0) + (0.08 if i % 2 else -0.08), 1.0, (1.0, 1.0))
    assert _decide(pol, {"x": 0.25, "y": 0.25}, objective_s=40.0)["x"] == 0.125


def test_a_passing_slow_spell_does_not_cost_the_curve():
    # c1 (0.8 of the node's 2 cores for 12.5 s) runs in band on a full node; from 600 s to 640 s its
    # batches cost 30 % more (another tenant's burst), then they are as before. Two slow batches in a
    # row restart its curve; the batches after the spell land where the curve before it put them,
    # so that curve comes back and c1 is in band again, not re-learnt from the spell.
    from shared.core.types import is_satisfied

    fractions = []
    for seed in (1, 2, 3, 4):
        sc = scenario([
            {"name": "c1", "objective_s": 12.5,
             "changes": [{"at_s": 600.0, "work_factor": 1.3}, {"at_s": 640.0, "work_factor": 1.0}]},
            {"name": "c2", "objective_s": 40.0}, {"name": "c3", "objective_s": 25.0},
            {"name": "c4", "objective_s": 60.0}, {"name": "c5", "objective_s": 50.0},
        ], cores=2.0, noise=0.04, duration_s=1500.0)
        res = run(sc, seed)
        fractions.append(_fraction(res, "c1", 700.0, 12.5, lambda ob, lat: is_satisfied(ob, lat, 0.1)))
        assert final(res, "c1").met
    assert sum(fractions) / len(fractions) >= 0.85, fractions


def test_a_container_met_more_often_than_not_at_its_ceiling_gets_its_ceiling():
    # One thread: at most 1 core, 10 s a batch (log sd 0.06); asked 9.3 s, so the band's slow edge is
    # 10.23 s. The slow edge less 1.5 sd is out of its reach, but at its ceiling it is met about
    # two batches in three: it gets the ceiling, not a fair share that leaves it late every batch.
    import math

    policy = LearnedPolicy()
    curve = policy.curve("x")
    for i in range(40):
        cores = (0.5, 0.7, 0.85, 1.0)[i % 4]
        curve.add(math.log(cores), math.log(10.0 / cores) + (0.06 if i % 8 < 4 else -0.06), 1.0, (1.0, 1.0))
    curve.sat_cores = 1.0
    policy.curve("y")  # no batch yet: still learning
    views = _views({"x": 0.25, "y": 0.25}, objective_s=9.3)
    plans = solve(policy.curves, views, 4.0, policy.settings.limits).plans
    assert plans["x"].kind is PlanKind.IN_BAND, plans["x"]
    assert plans["x"].limit * 4.0 >= 0.95


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_container_at_the_edge_of_its_ceiling_keeps_it_while_there_is_room(seed, policies_made):
    # At its ceiling (4 threads, 4 cores) c0 takes 2.5 s a batch (log sd 0.1); asked 2.2 s, the band's
    # slow edge is 2.42 s: met about one batch in three there, never at a fair share (2.67 cores, 3.75 s).
    # Whether it counts as met more often than not turns with each batch; the limit must not follow
    # (the verdict flipped it between the two about once every two minutes on a real node). 8 cores:
    # room for its ceiling beside c1 and c2 (1 core each). Rounds at least every 20 s, so that the
    # rows sampled at rounds (about 90 after 300 s) tell how often it is met.
    sc = scenario([{"name": "c0", "objective_s": 2.2}, {"name": "c1", "objective_s": 10.0},
                   {"name": "c2", "objective_s": 10.0}], cores=8.0, noise=0.1, duration_s=1800.0,
                  max_interval_s=20.0)
    res = run(sc, seed)
    (policy,) = policies_made
    late = [r for r in container_rows(res, "c0") if r["t_s"] > 300]
    limits = [r["limit"] for r in late]
    assert sum(1 for a, b in zip(limits, limits[1:], strict=False) if a != b) <= 2, limits
    assert min(limits) * 8.0 >= 3.9, limits
    assert _fraction(res, "c0", 300.0, 2.2, lambda ob, lat: lat <= 1.1 * ob) >= 0.15
    for other in ("c1", "c2"):  # and the others keep theirs
        assert _fraction(res, other, 300.0, 10.0, lambda ob, lat: lat <= 1.1 * ob) >= 0.8
    # Whichever way the verdict falls, it holds that limit as met or as given what is left for a chance.
    kind = policy.plans["c0"].kind
    assert kind is PlanKind.IN_BAND or (kind is PlanKind.UNACHIEVABLE and "c0" in policy.chances), kind


def test_a_wild_first_fit_is_unachievable_not_an_overflow():
    # Found by the property test: two early batches at a vanishing share of the node (1e-303 cores),
    # the slower one with more CPU, fit a slope the prior clamps. Asked for a latency that slope puts
    # past a float's range of cores, the need is infinite (it cannot be met), not an OverflowError.
    import math


    c = Curve()
    c.add(-699.0, math.log(0.5), 0.3, (1.0, 1.0))
    c.add(-697.0, math.log(63.0), 1.0, (1.0, 1.0))
    fit = c.solve()
    assert fit is not None and fit.k == 0.3
    # Within range it answers on the line through its data (log latency ~4 at log cores ~-698).
    need = c.cores_for(1.0, 0.0)
    assert need is not None and 0 < need < 1e-290
    assert c.cores_for(1e-300, 0.0) == math.inf
    assert c.cores_for(1e-300, 1.0) == math.inf


def test_the_aim_is_where_the_value_peaks_not_the_nearest_grid_step():
    # The value (P(met) + P(in band)) is flat near its peak: on a grid of 6 % steps, more than the
    # dead band, the aim flipped between two steps with each small change of the fit (a container
    # moved 0.496 <-> 0.529 four times in 80 s). The aim must be within about 1 % of the peak.
    import math

    from shared.core.types import ContainerView

    curve = Curve()
    for limit, latency in ((0.5, 8.0), (1.0, 4.1), (2.0, 2.0), (1.5, 2.8), (0.8, 5.0)):
        curve.add(math.log(limit), math.log(latency), 1.0, (1.0, 1.0))
    cores, off = 6.0, []
    for i in range(20):
        objective = 3.0 + 0.17 * i
        v = ContainerView(name="c", objective_s=objective, alpha=0.1, latency_s=None, last_latency_s=None,
                          cpu_share=None, limit=None)
        dense = [0.05 * (20.0 ** (j / 3999)) for j in range(4000)]
        peak = max(dense, key=lambda lim: sum(chances(curve, v, lim * cores)))
        aim = expected_best_limit(curve, v, cores, 0.05, 1.0)
        off.append(abs(math.log(aim / peak)))
    assert max(off) < 0.012, off


def test_one_odd_batch_is_held_out_until_the_next_says_whether_the_curve_moved():
    # Long batches: two seen, then the work grows 1.7x. The first slow batch used to join the fit
    # (down-weighted), which still tripled the noise, so the second slow one was no longer odd and
    # the curve never restarted (random-cluster seed 17: a mixed fit with k 0.72 for 900 s).
    import math


    def two_seen() -> Curve:
        c = Curve()
        for y in (150.0, 140.0):
            take(c, math.log(0.5), math.log(y), 1.0, (0.917, 0.917))
        return c

    drift = two_seen()
    take(drift, math.log(0.5), math.log(245.0), 1.0, (0.917, 0.917))
    assert drift.n == 2 and len(drift.watch.suspects) == 1 and drift.noise < 0.08
    take(drift, math.log(0.5), math.log(250.0), 1.0, (0.917, 0.917))  # slow again
    assert drift.n == 2 and not drift.watch.suspects  # restarted from the two slow batches
    assert math.exp(drift.predict(0.5)[0]) > 200.0

    odd = two_seen()
    take(odd, math.log(0.5), math.log(245.0), 1.0, (0.917, 0.917))
    take(odd, math.log(0.5), math.log(147.0), 1.0, (0.917, 0.917))  # back on the curve: it was one odd batch
    assert odd.n == 4 and not odd.watch.suspects
    assert math.exp(odd.predict(0.5)[0]) < 165.0


def test_a_batch_that_straddled_several_limits_is_read_from_the_cpu_it_used():
    # 10 CPU-seconds of work (k = 1) on a 4-core node: 2 s at 2 cores, 4 s at 1 core, then 4 s at
    # half a core (the limit it finished under). The batch only records the last change (1 -> 0.5
    # cores at 6 s). Read with 1 core before it, it would say 16 s at half a core; with the 1.33
    # cores it used before it on average (10 - 0.5 x 4 CPU-seconds over 6 s), 20 s: the truth.
    import math

    from shared.core.types import BatchObs

    curve = Curve()
    batch = BatchObs(latency_s=10.0, finished_at_s=110.0, limit=0.125, clean=False, index=3, cpu_s=10.0,
                     since_s=106.0, prev_limit=0.25)
    observe_straddled(batch, curve, 4.0, (1.0, 1.0))
    assert curve.n == 1
    assert math.exp(curve.sums.sy / curve.sums.sw) == pytest.approx(20.0)
    assert math.exp(curve.sums.sx / curve.sums.sw) == pytest.approx(0.5)


@pytest.mark.parametrize(("others_cores", "ceiling"), [(0.93, True), (1.0, False)], ids=["idle left", "node full"])
def test_a_ceiling_is_seen_on_a_busy_node_when_the_node_left_room(others_cores, ceiling):
    """On a node whose cores are all handed out, a container held by its own threads below its limit
    is at its ceiling if the node left idle at least half of what it left unused; not if the node was full.

    Explicit views, no simulator: 8 cores; `x` has 1.55 cores of limit but one thread (it uses 1.0 core,
    0.9 s a batch); seven others use `others_cores` each at their limits (0.93: the node 94 % busy, as on
    the 16-core host's run of 26 Nov; 1.0: every core busy, where `x` may have been starved).
    """
    sat = _short_batches(1.55, 1.0, 3, others=7, others_cores=others_cores, work_cpu_s=0.9,
                         objective_s=0.72).curves["x"].sat_cores
    if ceiling:
        assert sat is not None and sat == pytest.approx(1.05, rel=0.01)
    else:
        assert sat is None


def _short_batches(limit_cores: float, used_cores: float, batches: int, *, others: int = 6, others_cores: float = 1.0,
                   work_cpu_s: float = 1.2, objective_s: float = 1.45) -> LearnedPolicy:
    """`x` on an 8-core node beside `others` containers using `others_cores` each at their limits
    (by default, room to spare) runs `batches` batches of `work_cpu_s` under `limit_cores`, each
    using `used_cores`; one round a batch."""
    from shared.core.types import BatchObs, ContainerView, NodeView

    cores = 8.0
    policy = LearnedPolicy()
    limits = {"x": limit_cores / cores, **{f"o{i}": others_cores / cores for i in range(others)}}
    for index in range(1, batches + 1):
        views = []
        for name, limit in limits.items():
            used = used_cores if name == "x" else others_cores
            latency = work_cpu_s / used if name == "x" else 2.0
            batch = BatchObs(latency_s=latency, finished_at_s=10.0 * index, limit=limit, clean=True, index=index,
                             cpu_s=used * latency)
            views.append(ContainerView(name=name, objective_s=objective_s if name == "x" else 2.0, alpha=0.1,
                                       latency_s=latency, last_latency_s=latency, cpu_share=used / cores,
                                       limit=limit, batches=(batch,)))
        policy.decide(NodeView(node="n1", cores=cores, now_s=10.0 * index, containers=tuple(views)))
    return policy


def test_no_ceiling_is_read_under_a_limit_of_one_core_or_less():
    """One thread can use a whole core: a batch that used 0.8 of a 0.85-core limit was held by the
    node, not by itself (on the 16-core host of 27 Nov a ResNet-50 did so in one batch in seven and
    was judged unable to reach the band it was in)."""
    assert _short_batches(0.85, 0.68, 4).curves["x"].sat_cores is None


def test_a_ceiling_above_one_core_is_still_read():
    """One thread under 2.5 cores of limit uses one core: a ceiling of its own, read from its first batch."""
    assert _short_batches(2.5, 1.0, 1).curves["x"].sat_cores == pytest.approx(1.05)
