"""Algorithm 1 (classification and limit update), table-driven with explicit values."""

from __future__ import annotations

import pytest

from shared.core.classification import classify_views
from shared.core.dqoes import floor_limit, update_limits
from shared.core.types import Cls, ContainerView, classify


def view(name, objective_s, latency_s=None, *, cpu=None, limit=None, alpha=0.1, prev=None, last=None):
    return ContainerView(
        name=name,
        objective_s=objective_s,
        alpha=alpha,
        latency_s=latency_s,
        last_latency_s=last,
        cpu_share=cpu,
        limit=limit,
        prev_cls=prev,
    )


@pytest.mark.parametrize(
    "objective_s, latency_s, alpha, expected",
    [
        (40, 30, 0.1, Cls.G),  # q = 10 > 4
        (40, 36, 0.1, Cls.S),  # q = 4 = alpha*o: the band is closed
        (40, 35.9, 0.1, Cls.G),
        (40, 40, 0.1, Cls.S),
        (40, 44, 0.1, Cls.S),  # q = -4: still S
        (40, 44.1, 0.1, Cls.B),
        (40, 60, 0.1, Cls.B),
        (40, 30, 0.3, Cls.S),  # a wider band
        (5, 18, 0.1, Cls.B),
    ],
)
def test_classification(objective_s, latency_s, alpha, expected):
    assert classify(objective_s, latency_s, alpha) is expected


@pytest.mark.parametrize(
    "before, latency_s, after",
    [
        (Cls.G, 38, Cls.S),
        (Cls.G, 50, Cls.B),
        (Cls.S, 30, Cls.G),
        (Cls.S, 50, Cls.B),
        (Cls.B, 40, Cls.S),
        (Cls.B, 30, Cls.G),
        (None, 40, Cls.S),
    ],
)
def test_every_class_transition(before, latency_s, after):
    cl = classify_views([view("a", 40, latency_s, cpu=0.2, prev=before, last=40)])
    assert cl.items[0].cls is after


def test_sums_over_classes():
    cl = classify_views(
        [
            view("g1", 40, 20, cpu=0.3),  # q = 20
            view("g2", 40, 30, cpu=0.2),  # q = 10
            view("s", 40, 40, cpu=0.1),
            view("b", 20, 30, cpu=0.4),  # q = -10
            view("p", 40),  # pending
        ]
    )
    assert (cl.slack_sum_g_s, cl.slack_sum_b_s) == (30, -10)
    assert cl.r_g == pytest.approx(0.5)
    assert cl.r_b == pytest.approx(0.4)
    assert cl.satisfied == 1
    assert cl.members(Cls.G) == ("g1", "g2")
    assert [c.cls for c in cl.items][-1] is None


def test_additive_update_moves_what_g_frees_to_b():
    # G: q 20 and 10 (Q_G = 30), using 0.3 and 0.2 (R_G = 0.5); B: q -5 (Q_B = -5).
    cl = classify_views(
        [
            view("g1", 40, 20, cpu=0.3, limit=0.3),
            view("g2", 40, 30, cpu=0.2, limit=0.2),
            view("b", 20, 25, cpu=0.4, limit=0.4),
        ]
    )
    up = update_limits(cl, beta=0.1, total_resource=1.0, n_containers=3)
    assert up["g1"].new_limit == pytest.approx(0.3 - (20 / 30) * 0.5 * 0.1)
    assert up["g2"].new_limit == pytest.approx(0.2 - (10 / 30) * 0.5 * 0.1)
    assert up["b"].new_limit == pytest.approx(0.4 + 1.0 * 0.5 * 0.1)
    freed = (0.3 + 0.2) - (up["g1"].new_limit + up["g2"].new_limit)
    assert freed == pytest.approx(up["b"].new_limit - 0.4) == pytest.approx(0.5 * 0.1)


def test_first_change_starts_from_measured_use():
    cl = classify_views([view("g", 40, 20, cpu=0.3), view("b", 20, 30, cpu=0.5)])
    up = update_limits(cl, 0.1, 1.0, 2)
    assert up["g"].new_limit == pytest.approx(0.3 - 1.0 * 0.3 * 0.1)
    assert up["b"].new_limit == pytest.approx(0.5 + 1.0 * 0.3 * 0.1)


def test_q_g_zero_round_moves_nothing():
    # Every container in B and none in G: R_G = 0, free competition.
    cl = classify_views([view("b1", 20, 30, cpu=0.5), view("b2", 20, 35, cpu=0.5, limit=0.5)])
    assert cl.slack_sum_g_s == 0
    up = update_limits(cl, 0.1, 1.0, 2)
    assert up["b1"].new_limit is None
    assert up["b2"].new_limit == 0.5
    assert "R_G = 0" in up["b1"].reason


def test_q_b_zero_round_only_shrinks_g():
    cl = classify_views([view("g", 40, 20, cpu=0.4, limit=0.4), view("s", 40, 41, cpu=0.3, limit=0.3)])
    assert cl.slack_sum_b_s == 0
    up = update_limits(cl, 0.1, 1.0, 2)
    assert up["g"].new_limit == pytest.approx(0.4 - 0.4 * 0.1)
    assert up["s"].new_limit == 0.3
    assert up["s"].reason == "satisfied"


def test_floor_is_one_over_twice_the_containers():
    assert floor_limit(10) == 0.05
    # One G container holds all of Q_G and R_G; beta 0.9 would take it far below.
    cl = classify_views([view("g", 100, 10, cpu=0.6, limit=0.06)] + [view(f"s{i}", 40, 40, cpu=0.04) for i in range(9)])
    up = update_limits(cl, 0.9, 1.0, 10)
    assert up["g"].new_limit == 0.05
    assert "floor" in up["g"].reason


def test_cap_is_total_resource():
    cl = classify_views([view("g", 100, 10, cpu=0.5, limit=0.5), view("b", 10, 100, cpu=0.5, limit=0.98)])
    up = update_limits(cl, 0.5, 1.0, 2)
    assert up["b"].new_limit == 1.0
    assert "cap" in up["b"].reason
    cl = classify_views([view("g", 100, 10, cpu=0.5, limit=0.5), view("b", 10, 100, cpu=0.5, limit=0.7)])
    assert update_limits(cl, 0.5, 0.75, 2)["b"].new_limit == 0.75


def test_container_without_new_batch_keeps_class_and_limit():
    cl = classify_views(
        [
            view("g", 40, 20, cpu=0.4, limit=0.4),
            view("quiet", 40, None, cpu=0.3, limit=0.3, prev=Cls.G, last=25),
        ]
    )
    quiet = cl.items[1]
    assert quiet.cls is Cls.G and not quiet.fresh
    # It still counts in Q_G and R_G (it is a member of G) ...
    assert cl.slack_sum_g_s == 20 + 15
    up = update_limits(cl, 0.1, 1.0, 2)
    # ... but its limit does not move until a new batch reports.
    assert up["quiet"].new_limit == 0.3
    assert up["g"].new_limit < 0.4


def test_pending_container_is_left_alone():
    cl = classify_views([view("new", 40)])
    assert cl.items[0].cls is None
    up = update_limits(cl, 0.1, 1.0, 1)
    assert up["new"].new_limit is None


def test_no_cpu_reading_yet_keeps_unlimited():
    cl = classify_views([view("g", 40, 20, cpu=None), view("g2", 40, 10, cpu=0.3)])
    up = update_limits(cl, 0.1, 1.0, 2)
    assert up["g"].new_limit is None
    assert up["g"].reason == "no CPU reading yet"


def test_limits_held_are_clamped_when_floor_rises():
    # A satisfied container holding 0.05 when |C| shrinks to 2 (floor 0.25) is lifted.
    cl = classify_views([view("s", 40, 40, cpu=0.05, limit=0.05), view("t", 40, 40, cpu=0.5)])
    up = update_limits(cl, 0.1, 1.0, 2)
    assert up["s"].new_limit == 0.25
