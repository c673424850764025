"""What a run counts: every container's latest batch, and an oracle that knows the noise.

A client sees its latest batch whenever the policy last ran a round, so the
final counts come from the latest batches, not from the last round's view.
Under noise the oracle policy sets the allocation with the most expected met
+ in band (it knows the curves and the noise), the ceiling a run is compared
with.
"""

from __future__ import annotations

from typing import Any

from shared.core.oracle import OracleItem, expected_plan, plan_node
from shared.scenarios.spec import parse_scenario
from shared.sim.engine import simulate

MODEL = {"name": "m", "work_cpu_s": 10.0, "threads": 4}


def scenario(containers: list[dict[str, Any]], *, noise: float = 0.0, **controller: Any):
    return parse_scenario({
        "name": "counting", "duration_s": 600.0, "noise_sigma": noise,
        "nodes": [{"name": "n1", "cores": 4.0}], "models": [MODEL],
        "containers": [{"model": "m", **c} for c in containers], "controller": controller,
    })


def test_a_policy_that_rounds_rarely_is_counted_on_its_latest_batches():
    # No limit: 4 cores, 2.5 s a batch, in band from the first batch. The only round the policy
    # runs is at the arrival, before any batch: counting that round's view would say 0.
    sc = scenario([{"name": "c1", "objective_s": 2.5}], initial_interval_s=5000.0, max_interval_s=5000.0)
    res = simulate(sc, "default", 1)
    assert res.rounds == 1
    assert (res.met_final, res.satisfied_final) == (1, 1)
    assert (res.series[-1][1], res.met_series[-1][1]) == (0, 0)  # the round's own view, kept as it was


def test_a_late_objective_change_is_counted_from_the_batches_after_it():
    # The objective moves at 540 s, as the final window opens, and no round follows its own:
    # the batches after it are late against 1 s; the count follows them within the window.
    sc = scenario([{"name": "c1", "objective_s": 2.5, "changes": [{"at_s": 540.0, "objective_s": 1.0}]}],
                  initial_interval_s=5000.0, max_interval_s=5000.0)
    res = simulate(sc, "default", 1)
    assert (res.met_final, res.satisfied_final) == (0, 0)
    assert res.satisfied_at_end == 0


def _oracle_limits(sc, noise_aware: float, made: list) -> tuple[dict[str, float], list]:
    made.clear()
    res = simulate(sc, "oracle", 3, record=True)
    last = {r["container"]: r["limit"] for r in res.timeline if r["kind"] == "container"}
    assert made and made[0].params.noise_aware == noise_aware
    return last, [OracleItem(c.name, c.objective_s, 0.1, sc.profile_of(c)) for c in sc.containers]


def test_the_oracle_sets_the_best_allocation_under_the_noise_it_knows(policies_made):
    containers = [{"name": f"c{i}", "objective_s": s} for i, s in enumerate((4.0, 6.0, 9.0, 12.0, 30.0))]
    noisy = scenario(containers, noise=0.12)
    limits, items = _oracle_limits(noisy, 1.0, policies_made)
    want = expected_plan(items, 4.0, 0.12).limits
    assert limits == {k: round(v, 4) for k, v in want.items()}
    # Asked not to (or with no noise to know), it sets the noise-free plan.
    plain = scenario(containers, noise=0.12, noise_aware=0)
    limits, items = _oracle_limits(plain, 0.0, policies_made)
    assert limits == {k: round(v, 4) for k, v in plan_node(items, 4.0).limits.items()}


def test_rounds_after_each_change_count_moves_until_the_next_change():
    from shared.core.measures import rounds_after_each_change, rounds_to_settle

    # (time, largest relative move): the rounds at a change's own instant answer it and are not counted.
    rounds = [(0.0, 1.0), (5.0, 0.3), (10.0, 0.02), (15.0, 0.2), (20.0, 0.5), (25.0, 0.1), (40.0, 0.0), (60.0, 0.3)]
    assert rounds_after_each_change(rounds, [0.0, 20.0, 20.0, 50.0]) == [2, 1, 1]
    assert rounds_after_each_change(rounds, []) == []
    assert rounds_to_settle(rounds, 20.0) == (2, 40.0)


def test_a_run_reports_how_it_settles_after_each_change():
    # Two containers arrive 200 s apart; the learned allocator answers each arrival in a few rounds.
    sc = scenario([{"name": "a", "objective_s": 5.0}, {"name": "b", "objective_s": 8.0, "submit_at_s": 200.0}],
                  noise=0.03)
    res = simulate(sc, "learned", 1)
    s = res.settle
    assert s["change_rounds_max"] <= 3 and 0 <= s["change_rounds_mean"] <= s["change_rounds_max"]
    assert s["changes_settled_within_3"] == 1.0
    dq = simulate(sc, "dqoes", 1).settle
    assert dq["change_rounds_mean"] > s["change_rounds_mean"]
