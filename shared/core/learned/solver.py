"""The solver: from every container's curve and the node's size, this round's limits.

Pure: curves, views and settings in, a `Plan` per container out (plus which containers it chose
and which it gave what was left for a chance, which the next round reads for hysteresis).

Its order of preference is the paper's: the most containers met, then the most in band, then the
least CPU. Each round:

1. A container's need is the least limit at which its fitted curve reaches the band's slow edge
   less 1.5 noise sd, or its aim if that is cheaper; its aim is the limit where its next batch is
   most often met plus in band, given the measured noise and what the fit does not know yet
   (`expected_best_limit`). One that cannot be met even at the cap, unless its aim meets it more
   often than not, is unachievable; one faster than its band at the floor gets the floor.
2. Containers still learning (no fit) keep their limit; a newcomer gets an equal part of what no
   limit holds.
3. The rest are chosen cheapest first while the node has room (one unit of value each: this
   maximises the count for the model); last round's choice is kept where that costs no count.
4. Room left moves the chosen towards their aims, cheapest step first.
5. What is still left goes whole to one container left out for room (or at its edge) when that is
   worth more, in expected met + in band, than an equal split (`one_more_chance`).
6. The others left out share what remains equally (best effort), up to a fair share and a little
   past any ceiling seen, never below the floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from shared.core.dqoes import floor_limit
from shared.core.learned.curve import Curve
from shared.core.learned.fit import exp_or_inf
from shared.core.learned.plan import BEST_EFFORT, Plan, PlanKind
from shared.core.learned.settings import Limits
from shared.core.measures import band_chances
from shared.core.types import ContainerView

TARGET_GRID = 48
"""Limits tried between the floor and the cap when aiming a container (geometric)."""
TARGET_FINE = 17
"""Limits tried between the two grid neighbours of the best, to place the aim within about 1 %."""
CHANCE_MARGIN = 0.1
"""How much more (in P(met) + P(in band)) than an equal split a new holder of what is left must gain."""
SAT_PROBE = 1.5
"""A container that cannot be met may get this many times its seen ceiling (room to show more);
above 1 / (1 - BEST_EFFORT_DEAD_BAND), so the probe is never held back by the dead band."""
EDGE_NOISE_SD = 1.5
"""A container's need is where its curve reaches the band's slow edge less this many noise sds."""


@dataclass(frozen=True, slots=True)
class Solution:
    """The solver's answer for one node and round."""

    plans: dict[str, Plan]
    """Every container's plan."""
    chosen: set[str]
    """Containers given what they need to be met."""
    chances: set[str]
    """Containers not met for sure that were given what was left for a chance at their band (last
    round's where nothing was left to give this round)."""


Solver = Callable[[Mapping[str, Curve], Sequence[ContainerView], float, Limits, AbstractSet[str], AbstractSet[str]],
                  Solution]
"""What plans a round: (curves, views, cores, limits, last round's chosen, last round's chances) to a
`Solution` (`solve`)."""


def chances(curve: Curve, v: ContainerView, cores: float) -> tuple[float, float]:
    """(P(met), P(in band)) of the next batch under a limit of this many cores, per the fit and the noise."""
    pred = curve.predict_limit(cores)
    if pred is None:
        return 0.0, 0.0
    return band_chances(pred[0], math.sqrt(curve.noise**2 + pred[1] ** 2),
                        math.log((1 + v.alpha) * v.objective_s), math.log((1 - v.alpha) * v.objective_s))


def faster_than_band(pred: tuple[float, float] | None, v: ContainerView) -> bool:
    """Whether a predicted (mean log latency, sd) puts the container faster than its band."""
    return pred is not None and exp_or_inf(pred[0]) < (1 - v.alpha) * v.objective_s


def in_band_now(v: ContainerView) -> bool:
    """Whether the container's latest reported latency is inside its band."""
    lat = v.latency_s if v.latency_s is not None else v.last_latency_s
    return lat is not None and abs(v.objective_s - lat) <= v.alpha * v.objective_s


def expected_best_limit(curve: Curve, v: ContainerView, cores: float, lo: float, hi: float) -> float:
    """The limit in [lo, hi] with the most P(met) + P(in band) for the next batch, least CPU on ties.

    The next batch's log latency is the curve's prediction, spread by sqrt(noise^2 + model var):
    the measured batch-to-batch noise and what the fit does not know yet."""
    if curve.solve() is None:
        return hi
    ratio = (hi / lo) ** (1.0 / (TARGET_GRID - 1)) if hi > lo else 1.0
    best = _best_on_grid(curve, v, cores, lo, ratio, TARGET_GRID, hi)
    if ratio > 1.0:
        # A grid step (about 6 % of a limit) is more than the dead band: between two steps of nearly
        # equal value the aim would flip with every small change of the fit. Refine around the best.
        fine = ratio ** (2.0 / (TARGET_FINE - 1))
        best = _best_on_grid(curve, v, cores, max(lo, best / ratio), fine, TARGET_FINE, min(hi, best * ratio))
    # The same value for less: a limit above one core cut to its whole cores when threads follow it.
    return curve.snap(best, cores, lo)


def _best_on_grid(curve: Curve, v: ContainerView, cores: float, start: float, ratio: float, steps: int,
                  hi: float) -> float:
    """The limit among start * ratio**i (i < steps, at most hi) with the most P(met) + P(in band),
    the least CPU on ties."""
    best, best_value = hi, -1.0
    for i in range(steps):
        limit = min(hi, start * ratio**i)
        met, in_band = chances(curve, v, limit * cores)
        if met + in_band > best_value + 1e-6:
            best, best_value = limit, met + in_band
    return best


def choose(candidates: Sequence[tuple[float, str]], budget: float, incumbents: AbstractSet[str]) -> list[str]:
    """The most containers whose extra CPU fits the budget, keeping last round's where that costs no count.

    Cheapest first gives the largest count (one unit of value each). Taking
    last round's chosen first, then the others cheapest first, is kept when it
    reaches the same count: the set does not change for a tie.
    """
    def greedy(order: Sequence[tuple[float, str]]) -> list[str]:
        left, out = budget, []
        for extra, name in order:
            if extra <= left + 1e-12:
                left -= extra
                out.append(name)
        return out

    best = greedy(sorted(candidates))
    stable = greedy(sorted(candidates, key=lambda c: (c[1] not in incumbents, c[0], c[1])))
    return stable if len(stable) >= len(best) else best


def floors(curves: Mapping[str, Curve], views: Sequence[ContainerView], cores: float) -> dict[str, float]:
    """The least limit of each container: the paper's floor, and for a request server the limit its
    queue drains under (`Curve.least_limit`); servers whose loads together leave the others less than
    their floor share what is left in proportion to their loads."""
    floor = floor_limit(len(views))
    server = {v.name: curves[v.name].least_limit(cores) for v in views}
    total = sum(server.values())
    if total <= 0:
        return {v.name: floor for v in views}
    others = sum(1 for x in server.values() if x <= 0)
    scale = min(1.0, max(0.0, 1.0 - floor * others) / total)
    return {name: max(floor, x * scale) for name, x in server.items()}


def fair_share(limits: Limits, n: int) -> float:
    """The most a container that cannot be met gets from an equal split (never below the floor)."""
    return max(floor_limit(n), min(limits.total_resource, limits.best_effort_share / max(1, n)))


def solve(curves: Mapping[str, Curve], views: Sequence[ContainerView], cores: float, limits: Limits,
          incumbents: AbstractSet[str] = frozenset(), chances_before: AbstractSet[str] = frozenset()) -> Solution:
    """Limits (fractions of the node) for every container: most met, then in band, then least CPU.

    `curves`: every container's curve, by name; `incumbents`: last round's chosen (kept on ties);
    `chances_before`: last round's holders of what was left (kept while worth no less)."""
    n = len(views)
    low = floors(curves, views, cores)
    cap = limits.total_resource
    plans: dict[str, Plan] = {}
    candidates: list[tuple[float, str]] = []
    aim: dict[str, float] = {}
    best_effort: list[str] = []
    learning: list[ContainerView] = []
    best_limit: dict[str, float] = {}
    for v in views:
        curve, floor = curves[v.name], low[v.name]
        if curve.solve() is None:
            learning.append(v)
            continue
        noise = curve.noise
        # Cheapest met: the band's slow edge on the fitted curve, less some noise.
        edge_s = v.objective_s * (1 + v.alpha) * math.exp(-EDGE_NOISE_SD * noise)
        edge = curve.cores_for(edge_s, 0.0)
        # Where its next batch is most often met and in band, the least CPU on ties.
        best = expected_best_limit(curve, v, cores, floor, cap)
        best_limit[v.name] = best
        if edge is not None and not (math.isfinite(edge) and edge <= cap * cores):
            # Not with the margin, but where it does best (its ceiling, a thread's worth) it may still
            # be met more often than not: then that is its need, not a fair share that leaves it late.
            if chances(curve, v, best * cores)[0] >= 0.5:
                edge = best * cores
        if edge is None or not math.isfinite(edge) or edge > cap * cores:
            best_effort.append(v.name)  # at its edge, what is left may still give it a chance
            plans[v.name] = Plan(floor, PlanKind.UNACHIEVABLE)
            continue
        fast_edge = curve.cores_for((1 - v.alpha) * v.objective_s * math.exp(noise), 0.0) or math.inf
        # Aimed where it does best; never priced above it.
        need = min(edge / cores, best)
        aim[v.name] = best
        if v.limit is not None and need * (1 - limits.dead_band) <= v.limit <= min(cap, fast_edge / cores) \
                and in_band_now(v):
            at = curve.predict_limit(v.limit * cores)
            if at is not None and at[0] <= math.log(edge_s):
                # In band where it is and the curve agrees: leave it there (no trimming).
                aim[v.name] = v.limit
        if need <= floor and faster_than_band(curve.predict_limit(floor * cores), v):
            plans[v.name] = Plan(floor, PlanKind.TOO_FAST, need)
            continue
        # Met at the floor is free to choose; room may still move it to its aim above the floor.
        plans[v.name] = Plan(max(need, floor), PlanKind.CANDIDATE, need)
        candidates.append((max(0.0, need - floor), v.name))
    base = floor_limit(n)
    budget = 1.0 - base * n - sum(x - base for x in low.values())
    budget = _place_learning(plans, learning, views, low, cap, budget)
    chosen = choose(candidates, budget, incumbents)
    for extra, name in candidates:
        if name in chosen:
            budget -= extra
            plans[name] = Plan(plans[name].limit, PlanKind.IN_BAND, plans[name].need)
        else:
            best_effort.append(name)
            plans[name] = Plan(low[name], PlanKind.NO_ROOM, plans[name].need)
    # Room left: towards each chosen container's aim, cheapest step first. Twice: a step cut to whole
    # cores leaves room that a container earlier in the order may take on the second pass.
    for _ in range(2):
        for step, name in sorted((aim[n] - plans[n].limit, n) for n in chosen):
            if step <= 0 or budget <= 1e-12:
                continue
            # Threads that follow the limit use only its whole cores above one: no part of a core.
            new = curves[name].snap(plans[name].limit + min(step, budget), cores, plans[name].limit)
            budget -= new - plans[name].limit
            plans[name] = Plan(new, PlanKind.IN_BAND, plans[name].need)
    held = set(chances_before)
    if budget > 1e-9:
        budget, held = one_more_chance(curves, views, plans, best_effort, best_limit, cores, budget, limits,
                                       chances_before)
    _share_best_effort(curves, plans, best_effort, cores, budget, fair_share(limits, n), low, cap)
    return Solution(plans, set(chosen), held)


def _place_learning(plans: dict[str, Plan], learning: Sequence[ContainerView], views: Sequence[ContainerView],
                    low: Mapping[str, float], cap: float, budget: float) -> float:
    """Containers still learning keep what they have; a newcomer starts at an equal part of the CPU no
    limit holds, never more than the node can spare once the others have their floor. Returns the
    budget left."""
    free = 1.0 - sum(v.limit for v in views if v.limit is not None)
    newcomers = sum(1 for v in learning if v.limit is None)
    for v in learning:
        floor = low[v.name]
        share = v.limit if v.limit is not None else max(floor, min(cap, free / max(1, newcomers)))
        plans[v.name] = Plan(share, PlanKind.LEARNING)
        budget -= share - floor
    for v in learning:
        if v.limit is None and budget < 0:
            back = min(plans[v.name].limit - low[v.name], -budget)
            plans[v.name] = Plan(plans[v.name].limit - back, PlanKind.LEARNING)
            budget += back
    return budget


def _share_best_effort(curves: Mapping[str, Curve], plans: dict[str, Plan], best_effort: Sequence[str],
                       cores: float, budget: float, limit_each: float, low: Mapping[str, float],
                       cap: float) -> None:
    """An equal part of what is left to each container that cannot be met, up to its fair share (and a
    little past a ceiling it showed); a share short of a whole core above one adds no thread. A request
    server may take up to the cap: it uses only what its requests cost whatever its limit, so what is
    left shortens its queue and spends nothing more."""
    want = {}
    for name in best_effort:
        curve, floor = curves[name], low[name]
        top = max(floor, cap if curve.load.cores else limit_each)
        if curve.sat_cores is not None:
            # Up to its ceiling and a little past it: a ceiling seen once may have been a
            # slow spell, and a container held at it could never show that it is not.
            top = min(top, max(floor, SAT_PROBE * curve.sat_cores / cores))
        want[name] = curve.snap(top, cores, floor)
    while budget > 1e-9 and want:
        share = budget / len(want)
        for name in list(want):
            give = min(share, want[name] - plans[name].limit)
            plans[name] = Plan(plans[name].limit + give, plans[name].kind, plans[name].need)
            budget -= give
            if plans[name].limit >= want[name] - 1e-12:
                del want[name]
    for name in best_effort:
        plans[name] = Plan(curves[name].snap(plans[name].limit, cores, low[name]), plans[name].kind, plans[name].need)


def one_more_chance(curves: Mapping[str, Curve], views: Sequence[ContainerView], plans: dict[str, Plan],
                    best_effort: list[str], best_limit: Mapping[str, float], cores: float, budget: float,
                    limits: Limits, chances_before: AbstractSet[str]) -> tuple[float, set[str]]:
    """What is left to the containers not met for sure, one at a time, where that is worth more than
    the fair split.

    A container met alone but left out for room gets nothing from an equal split that reaches its
    band; all of what is left may give it a fair chance. So does one at the edge of what it can
    do (met about every other batch at its ceiling, judged unachievable by a hair): held at its
    ceiling it is met that often, dropped to a fair share never, and a verdict that flips with
    each batch moves its limit each time. Compared in expected met + in band of the next batches:
    the fair split (below) against the one container, among those left, that the rest lifts
    furthest; repeated while what is left lifts one further. Removes the holders from `best_effort`;
    returns the budget left and the holders."""
    by_name = {v.name: v for v in views}
    limit_each = fair_share(limits, len(views))

    def value(name: str, limit: float) -> float:
        met, in_band = chances(curves[name], by_name[name], limit * cores)
        return met + in_band

    held: set[str] = set()
    while budget > 1e-9 and best_effort:
        split = budget / len(best_effort)
        spread = sum(value(k, min(limit_each, plans[k].limit + split)) - value(k, plans[k].limit)
                     for k in best_effort)
        best = None
        for k in best_effort:
            if k not in best_limit or plans[k].kind not in BEST_EFFORT:
                continue
            top = curves[k].snap(min(best_limit[k], plans[k].limit + budget), cores, plans[k].limit)
            gain = value(k, top) - value(k, plans[k].limit)
            # Hysteresis: a new holder must be worth clearly more than the split; last round's
            # holders keep it while they are worth no less, and before any other.
            kept = k in chances_before
            if gain > spread + (1e-9 if kept else CHANCE_MARGIN):
                key = (kept, gain)
                if best is None or key > best[0]:
                    best = (key, k, top)
        if best is None:
            break
        _, k, top = best
        held.add(k)
        budget -= top - plans[k].limit
        plans[k] = Plan(top, plans[k].kind, plans[k].need)
        best_effort.remove(k)
    return budget, held
