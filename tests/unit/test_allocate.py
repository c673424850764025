"""The solver under noise: one option per container, the most value within a budget (shared.core.allocate).

Checked against brute force on small instances: what it returns fits the
budget, its bound is never below the true optimum, and its value is within
one container's step of that optimum (the LP relaxation's guarantee).
"""

from __future__ import annotations

import itertools
import random

import pytest

from shared.core.allocate import _hull, choose


def brute(items, budget):
    best = -1.0
    for picks in itertools.product(*(range(len(o)) for o in items)):
        cost = sum(items[k][j][0] for k, j in enumerate(picks))
        if cost <= budget + 1e-12:
            best = max(best, sum(items[k][j][1] for k, j in enumerate(picks)))
    return best


def random_items(rng, n, m):
    out = []
    for _ in range(n):
        opts = [(0.0, rng.uniform(0, 0.3))]
        for _ in range(m - 1):
            opts.append((rng.uniform(0, 1), rng.uniform(0, 2)))
        out.append(opts)
    return out


@pytest.mark.parametrize("seed", range(60))
def test_against_brute_force(seed):
    rng = random.Random(seed)
    items = random_items(rng, rng.randint(1, 4), rng.randint(1, 5))
    budget = rng.uniform(0, 2)
    got = choose(items, budget)
    opt = brute(items, budget)
    assert got.cost <= budget + 1e-9
    assert got.cost == pytest.approx(sum(items[k][j][0] for k, j in enumerate(got.picks)))
    assert got.value == pytest.approx(sum(items[k][j][1] for k, j in enumerate(got.picks)))
    assert got.bound >= opt - 1e-9
    assert got.value <= opt + 1e-9
    # Within one item's largest step of the optimum.
    step = max(max(v for _, v in o) - min(v for _, v in o) for o in items)
    assert got.value >= opt - step - 1e-9


def test_a_budget_that_covers_everything_gives_each_its_best():
    items = [[(0.0, 0.1), (0.3, 1.0), (0.6, 0.8)], [(0.0, 0.0), (0.2, 0.5)]]
    got = choose(items, 10.0)
    assert got.picks == (1, 1)
    assert got.value == pytest.approx(1.5) and got.bound == pytest.approx(1.5)


def test_no_budget_keeps_the_cheapest_options():
    items = [[(0.5, 1.0), (0.0, 0.2)], [(0.0, 0.0), (0.1, 0.9)]]
    got = choose(items, 0.0)
    assert got.picks == (1, 0)
    assert got.value == pytest.approx(0.2)


def test_the_steepest_value_per_cpu_goes_first():
    # One unit of budget: two cheap half-steps (0.9 each) beat one dear step (1.0).
    items = [[(0.0, 0.0), (1.0, 1.0)], [(0.0, 0.0), (0.5, 0.9)], [(0.0, 0.0), (0.5, 0.9)]]
    got = choose(items, 1.0)
    assert got.picks == (0, 1, 1)
    assert got.value == pytest.approx(1.8)


def test_hull_drops_dominated_and_concave_breaking_options():
    opts = [(0.0, 0.0), (0.2, 0.1), (0.4, 1.0), (0.5, 0.9), (1.0, 1.2)]
    # (0.2, 0.1) lies below the chord to (0.4, 1.0); (0.5, 0.9) is dominated.
    assert _hull(opts) == [0, 2, 4]
