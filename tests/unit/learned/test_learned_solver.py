"""The solver (shared/core/learned/solver.py) against the exact oracle on small cases.

Where every curve is known (fitted from many batches of a known line with next to no noise), the
solver must choose the containers the oracle's exact count-maximising plan puts in band, and call
the same containers too fast; it never hands out more than the node.
"""

from __future__ import annotations

import math
import random

import pytest

from shared.core.learned import Curve, PlanKind, solve
from shared.core.learned.settings import LearnedParams, Settings
from shared.core.oracle import OracleItem, plan_node
from shared.core.profiles import ModelProfile
from shared.core.types import ContainerView

LIMITS = Settings.of(LearnedParams()).limits


def known_curve(work_cpu_s: float) -> Curve:
    """A curve fitted from 80 batches of latency = work / cores, off by at most 0.2 %."""
    c = Curve()
    for i in range(80):
        cores = (0.25, 0.5, 1.0, 2.0, 4.0)[i % 5]
        c.add(math.log(cores), math.log(work_cpu_s / cores) + (0.002 if i % 2 else -0.002), 1.0, (1.0, 1.0))
    return c


def view(name: str, objective_s: float, alpha: float = 0.1) -> ContainerView:
    return ContainerView(name=name, objective_s=objective_s, alpha=alpha, latency_s=None, last_latency_s=None,
                         cpu_share=None, limit=None, batches=())


def case(seed: int) -> tuple[float, list[tuple[str, float, float]]]:
    """A node and 2-6 containers: (name, work CPU-seconds per batch, objective in seconds)."""
    rng = random.Random(seed)
    cores = rng.choice((2.0, 4.0, 8.0))
    out = []
    for i in range(rng.randint(2, 6)):
        work = rng.uniform(2.0, 20.0)
        out.append((f"c{i}", work, work / (cores * rng.uniform(0.05, 0.9))))
    return cores, out


def _clear(cores: float, items: list[tuple[str, float, float]]) -> bool:
    """No container's need sits within 3 % of a floor or of what is left: the exact plan and one with a
    noise margin of a few thousandths cannot differ for a hair."""
    floor = 1 / (2 * len(items))
    needs = sorted(w / (1.1 * o) / cores for _, w, o in items)
    left = 1.0 - floor * len(items)
    sums = [sum(max(0.0, n - floor) for n in needs[:j]) for j in range(len(needs) + 1)]
    return (all(abs(n / floor - 1) > 0.03 for n in needs)
            and all(abs(s - left) > 0.03 * max(left, 1e-9) for s in sums)
            and all(abs(w / (0.9 * o) / cores / floor - 1) > 0.03 for _, w, o in items))


CASES = [c for c in map(case, range(60)) if _clear(*c)][:30]
"""Thirty small cases whose answer does not turn on a hair (see `_clear`)."""


@pytest.mark.parametrize(("cores", "items"), CASES)
def test_the_solver_chooses_the_containers_the_exact_oracle_puts_in_band(cores, items):
    curves = {n: known_curve(w) for n, w, _ in items}
    views = [view(n, o) for n, _, o in items]
    plans = solve(curves, views, cores, LIMITS).plans
    oracle = plan_node([OracleItem(n, o, 0.1, ModelProfile(n, w, threads=64)) for n, w, o in items], cores,
                       sharing=False)
    chosen = {n for n, p in plans.items() if p.kind is PlanKind.IN_BAND}
    too_fast = {n for n, p in plans.items() if p.kind is PlanKind.TOO_FAST}
    assert chosen == set(oracle.satisfied), (plans, oracle)
    assert too_fast == set(oracle.too_fast)
    assert sum(p.limit for p in plans.values()) <= 1.0 + 1e-9
    # Each chosen container's limit meets it on its known curve.
    for n, w, o in items:
        if n in chosen:
            assert w / (plans[n].limit * cores) <= 1.1 * o * (1 + 1e-6)


def test_a_container_that_cannot_be_met_gets_a_best_effort_share_and_no_less_than_the_floor():
    curves = {"hopeless": known_curve(10.0), "a": known_curve(10.0)}
    plans = solve(curves, [view("hopeless", 0.5), view("a", 10.0)], 4.0, LIMITS).plans
    assert plans["hopeless"].kind is PlanKind.UNACHIEVABLE
    assert plans["a"].kind is PlanKind.IN_BAND
    # Its fair share (the node over two), though more is left: more would not bring it in.
    assert plans["hopeless"].limit == pytest.approx(0.5)
    assert sum(p.limit for p in plans.values()) <= 1.0 + 1e-9


def test_a_newcomer_without_a_fit_gets_an_equal_part_of_what_no_limit_holds():
    curves = {"new": Curve(), "a": known_curve(4.0)}
    plans = solve(curves, [view("new", 5.0), view("a", 4.0)], 4.0, LIMITS).plans
    assert plans["new"].kind is PlanKind.LEARNING and plans["new"].limit == pytest.approx(0.75)


def test_last_rounds_choice_is_kept_on_a_tie():
    # Two containers that cost the same; room for one: last round's stays chosen.
    curves = {"a": known_curve(10.0), "b": known_curve(10.0)}
    views = [view("a", 4.0), view("b", 4.0)]
    for first in ("a", "b"):
        sol = solve(curves, views, 4.0, LIMITS, incumbents={first})
        assert sol.chosen == {first}
