"""The guards (shared/core/learned/guards.py) on explicit sequences of batches and limits."""

from __future__ import annotations

import math

import pytest

from shared.core.learned import RESTART_WATCH, Curve, Plan, PlanKind
from shared.core.learned.guards import (
    BEST_EFFORT_DEAD_BAND,
    MAX_STEP_UNCERTAIN,
    OUTLIER_SD,
    kept,
    settle,
    stepped,
    take,
)
from shared.core.types import ContainerView

DECAY = (0.917, 0.917)
X = math.log(1.0)


def settled(n: int = 12) -> Curve:
    """A curve that has seen n batches of 10 s at one core, +-1 %."""
    c = Curve()
    for i in range(n):
        take(c, X, math.log(10.0) + (0.01 if i % 2 else -0.01), 1.0, DECAY)
    return c


def test_one_batch_far_off_is_held_out_and_released_down_weighted_when_the_next_is_back():
    c = settled()
    sd_before = c.noise
    take(c, X, math.log(20.0), 1.0, DECAY)
    assert c.n == 12 and len(c.watch.suspects) == 1 and c.noise == sd_before
    take(c, X, math.log(10.0), 1.0, DECAY)
    assert c.n == 14 and not c.watch.suspects
    assert math.exp(c.predict(1.0)[0]) < 11.0  # the odd batch counted little


def test_two_batches_far_off_on_one_side_restart_the_curve_from_them():
    c = settled()
    take(c, X, math.log(20.0), 1.0, DECAY)
    take(c, X, math.log(21.0), 1.0, DECAY)
    assert c.n == 2 and c.node.solo and c.watch.before is not None
    assert math.exp(c.predict(1.0)[0]) == pytest.approx(20.5, rel=0.03)


def test_two_far_off_on_opposite_sides_are_no_drift():
    c = settled()
    take(c, X, math.log(20.0), 1.0, DECAY)
    take(c, X, math.log(5.0), 1.0, DECAY)
    assert c.n == 13 and len(c.watch.suspects) == 1 and c.watch.before is None


def test_a_restart_is_undone_when_two_batches_land_where_the_curve_before_put_them():
    c = settled()
    take(c, X, math.log(20.0), 1.0, DECAY)
    take(c, X, math.log(21.0), 1.0, DECAY)
    for _ in range(2):
        take(c, X, math.log(10.0), 1.0, DECAY)
    assert c.watch.before is None and not c.node.solo
    assert math.exp(c.predict(1.0)[0]) == pytest.approx(10.0, rel=0.03)


def test_a_spell_of_the_node_holds_a_restart_off_for_as_many_batches_as_a_restart_is_watched():
    c = settled()
    asked = []

    def spell(start_s: float, side: float) -> bool:
        asked.append(side)
        return True

    for i in range(RESTART_WATCH + 2):
        take(c, X, math.log(20.0), 1.0, DECAY, float(i), spell)
        if i <= RESTART_WATCH:
            assert c.n == 12, i  # held: the node was slow alike
    assert c.n <= 3 and c.node.solo  # past the watch: a drift after all
    assert asked and all(side == 1.0 for side in asked)


def view(limit: float, objective_s: float = 10.0) -> ContainerView:
    return ContainerView(name="x", objective_s=objective_s, alpha=0.1, latency_s=None, last_latency_s=None,
                         cpu_share=None, limit=limit, batches=())


@pytest.mark.parametrize(("old", "new", "stays"), [(0.25, 0.26, True), (0.25, 0.24, True), (0.25, 0.5, False)])
def test_an_aimed_limit_moves_only_past_the_dead_band(old, new, stays):
    c = settled(40)  # 10 CPU-s at one core; on 4 cores a quarter of the node gives 10 s
    plan = Plan(new, PlanKind.IN_BAND, new)
    # 0.5 is 5 s a batch: faster than the band, a move worth its while.
    assert kept(plan, c, view(old, objective_s=5.0 if new == 0.5 else 10.0), old, 4.0, 0.1, 0.05, None) is stays


def test_a_best_effort_share_moves_only_past_its_wide_dead_band():
    c = settled()
    small = 0.3 * (1 + BEST_EFFORT_DEAD_BAND * 0.9)
    large = 0.3 * (1 + BEST_EFFORT_DEAD_BAND * 1.5)
    for kind in (PlanKind.NO_ROOM, PlanKind.UNACHIEVABLE):
        assert kept(Plan(small, kind), c, view(0.3), 0.3, 4.0, 0.1, 0.05, None)
        assert not kept(Plan(large, kind), c, view(0.3), 0.3, 4.0, 0.1, 0.05, None)


def test_a_container_too_fast_keeps_what_it_holds_within_the_slack():
    c = settled()
    plan = Plan(0.1, PlanKind.TOO_FAST)
    assert not kept(plan, c, view(0.2), 0.2, 4.0, 0.1, 0.05, None)  # 2 floors, never held: trimmed
    assert kept(plan, c, view(0.2), 0.2, 4.0, 0.1, 0.05, 0.2)  # held there as too fast: kept


def test_an_uncertain_fit_moves_a_limit_at_most_by_a_factor_a_round():
    c = Curve()  # no fit: as uncertain as it gets
    assert stepped(c, 0.8, 0.1, 4.0, 0.05) == pytest.approx(0.1 * MAX_STEP_UNCERTAIN)
    assert stepped(c, 0.01, 0.1, 4.0, 0.005) == pytest.approx(0.1 / MAX_STEP_UNCERTAIN)
    assert stepped(settled(40), 0.5, 0.1, 4.0, 0.05) == 0.5  # a sure fit moves at once


def test_limits_kept_where_they_are_never_overcommit_the_node():
    # "k" stays at 0.4 over its plan of 0.2; "u" (best effort) was to rise from 0.2 to 0.4 with room
    # that "k" now holds: its rise gives way first, then overshoots.
    plans = {"k": Plan(0.2, PlanKind.IN_BAND), "u": Plan(0.4, PlanKind.UNACHIEVABLE),
             "a": Plan(0.4, PlanKind.IN_BAND)}
    proposal = {"k": 0.4, "u": 0.4, "a": 0.4}
    settle(proposal, plans, {"k": 0.4, "u": 0.2, "a": 0.4}, set(), dict.fromkeys(proposal, 1 / 6))
    assert proposal == pytest.approx({"k": 0.4, "u": 0.2, "a": 0.4})
    proposal = {"k": 0.6, "u": 0.4, "a": 0.4}
    settle(proposal, plans, {"k": 0.6, "u": 0.2, "a": 0.4}, set(), dict.fromkeys(proposal, 1 / 6))
    assert sum(proposal.values()) == pytest.approx(1.0)
    assert proposal["a"] == 0.4 and proposal["u"] == pytest.approx(0.2) and proposal["k"] == pytest.approx(0.4)


def test_the_outlier_threshold_is_in_standard_deviations():
    sd = math.hypot(max(settled().noise, 0.05), settled().predict(1.0)[1])
    within, beyond = settled(), settled()
    take(within, X, math.log(10.0) + 0.9 * OUTLIER_SD * sd, 1.0, DECAY)
    take(beyond, X, math.log(10.0) + 1.1 * OUTLIER_SD * sd, 1.0, DECAY)
    assert not within.watch.suspects and len(beyond.watch.suspects) == 1


def test_a_restart_keeps_the_curve_before_it_apart_and_a_return_restores_only_the_curves_own_parts():
    c = settled()
    c.node.k = (1.0, 0.01)  # the node's slope: what the node says now, not part of the curve's own past
    short, long, k_sd = c.sums.short, list(c.sums.long), c.prior.k_sd
    c.restart()
    old = c.watch.before
    assert old is not None and (old.sums.short, old.sums.long, old.sums.n) == (short, long, 12)
    assert c.sums.n == 0 and c.node.solo and c.prior.theta_sd == math.inf and c.prior.k_sd != k_sd
    c.add(math.log(2.0), math.log(30.0), 1.0, DECAY)  # the restarted curve learns ...
    assert (old.sums.short, old.sums.long, old.sums.n) == (short, long, 12)  # ... and the old one is untouched
    c.node.k = (0.9, 0.02)
    back = old.predict(1.0)
    assert back is not None
    c.check_back(X, back[0])
    c.check_back(X, back[0])  # two batches in a row where the curve before put them: it was a spell
    assert c.watch.before is None and c.fit is None
    assert (c.sums.short, c.sums.n, c.prior.k_sd, c.node.solo) == (short, 12, k_sd, False)
    assert c.node.k == (0.9, 0.02)  # the node's slope as it is now, not as it was
