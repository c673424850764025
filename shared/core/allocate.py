"""One option per container, the most total value within a CPU budget: the solver under noise.

Why: under batch-to-batch noise whether a container's next batch is met or
in band is a probability that grows (met) or rises and falls (in band) with
its limit, so "the most containers met" becomes "the most expected", a
multiple-choice knapsack: every container picks one limit from a grid, each
with a cost (CPU beyond its floor) and a value (its expected counts). The
oracle under noise (it knows every curve and the noise) solves it here. The
learned allocator does not: solved each round on its fitted curves, this
knapsack gained in band on random clusters but reshuffled limits every few
rounds (a container's limit moved 4-4.7 times after its own change), and
a bonus for staying put cost more counts than it saved moves (notes in
docs/design/learned.md).

The method is the classic LP relaxation of the multiple-choice knapsack:
each container's options are reduced to their upper concave hull (cost
against value, dominated options dropped), the hull's steps are taken
steepest first across all containers while they fit, and what is left is
spent on any further step that still fits, best value per CPU first. The
value of the relaxation (the steps taken plus the fitting fraction of the
first that did not fit) is an upper bound on any allocation's value; the
allocation returned is within one container's step of it.

Pure: numbers in, picks out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class Choice:
    picks: tuple[int, ...]
    """Index of the option each item takes."""
    value: float
    cost: float
    bound: float
    """No choice within the budget has more total value (LP relaxation)."""


def _hull(options: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the upper concave hull of (cost, value), from the cheapest option (ties: most value)."""
    order = sorted(range(len(options)), key=lambda i: (options[i][0], -options[i][1], i))
    pts: list[int] = []
    for i in order:
        c, v = options[i]
        if pts and v <= options[pts[-1]][1] + _EPS:
            continue  # costs more, worth no more: dominated
        while len(pts) >= 2:
            c1, v1 = options[pts[-2]]
            c2, v2 = options[pts[-1]]
            # Drop the middle point when it lies on or below the chord from pts[-2] to i.
            if (v2 - v1) * (c - c1) <= (v - v1) * (c2 - c1) + _EPS:
                pts.pop()
            else:
                break
        pts.append(i)
    return pts


def choose(items: Sequence[Sequence[tuple[float, float]]], budget: float) -> Choice:
    """For each item one (cost, value) option, the total cost within `budget`, the most total value.

    Every item starts at its cheapest option; an instance whose cheapest options
    alone exceed the budget gets them anyway (the caller's floors come first).
    """
    hulls = [_hull(opts) for opts in items]
    picks = [h[0] for h in hulls]
    spent = sum(items[k][h[0]][0] for k, h in enumerate(hulls))
    value = sum(items[k][h[0]][1] for k, h in enumerate(hulls))
    left = budget - spent
    steps = []  # (slope, item, position on its hull)
    for k, h in enumerate(hulls):
        for j in range(1, len(h)):
            dc = items[k][h[j]][0] - items[k][h[j - 1]][0]
            dv = items[k][h[j]][1] - items[k][h[j - 1]][1]
            steps.append((dv / dc if dc > _EPS else float("inf"), k, j))
    steps.sort(key=lambda s: (-s[0], s[1], s[2]))
    pos = [0] * len(items)
    bound = None
    blocked: set[int] = set()
    for slope, k, j in steps:
        if k in blocked or j != pos[k] + 1:
            continue
        h = hulls[k]
        dc = items[k][h[j]][0] - items[k][h[j - 1]][0]
        dv = items[k][h[j]][1] - items[k][h[j - 1]][1]
        if dc <= left + _EPS:
            left -= dc
            value += dv
            pos[k] = j
            picks[k] = h[j]
        else:
            if bound is None:
                bound = value + max(0.0, left) * slope
            blocked.add(k)  # its hull's next steps are no steeper: none can fit before this one
    if bound is None:
        bound = value
    # What is left: any single move up an item's options that fits, the best value per CPU first.
    improved = True
    while improved and left > _EPS:
        improved = False
        best = None
        for k, opts in enumerate(items):
            c0, v0 = opts[picks[k]]
            for i, (c, v) in enumerate(opts):
                dc, dv = c - c0, v - v0
                if dv > _EPS and 0 < dc <= left + _EPS:
                    key = (dv / dc, dv, -k, -i)
                    if best is None or key > best[0]:
                        best = (key, k, i, dc, dv)
        if best is not None:
            _, k, i, dc, dv = best
            picks[k] = i
            left -= dc
            value += dv
            improved = True
    cost = budget - left
    return Choice(tuple(picks), value, cost, max(bound, value))
