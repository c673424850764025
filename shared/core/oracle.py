"""The oracle: the most containers one node can hold inside their band, and how.

It knows every container's latency curve (its model profile), which no real
controller does, and solves the static problem exactly: choose limits, each in
[1/(2|C|), T_R] like DQoES's (from one core where the floor is more, for a
workload whose threads follow its limit: with no limit it runs one thread),
with the containers' average CPU use summing to at most the node, maximising
how many containers land inside +-alpha of their objective. With a value of
one per container this knapsack is solved exactly by taking the cheapest
extra CPU first. Its count is the "physical limit" other policies are
measured against: every container needs at least the average CPU its slowest
acceptable batch burns, and no policy can hand out more CPU than the node has
(a container held at the floor, or sharing by CFS, still burns at least the
floor's worth). The capacity constraint is on average use, not on limits,
because batches with non-CPU overhead leave CPU for others (a bound on limits
was beaten by default Swarm in property testing). For the count each curve is
read as sharing the node can reach it (`shared_reading`); the limits the
oracle policy sets are solved for what limits alone reach.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.allocate import Choice, choose
from shared.core.classification import classify_views
from shared.core.dqoes import floor_limit
from shared.core.measures import lower_median_count, normal_cdf
from shared.core.policy import (
    BaseParams,
    CurveLookup,
    PolicyBase,
    PolicySpec,
    build_decision,
    check_total_resource,
    no_curves,
)
from shared.core.profiles import ModelProfile, limit_for_latency, limit_for_min_latency
from shared.core.types import Decision, NodeView

_EPS = 1e-12
# Feasibility uses the closed band widened by a hair, never narrowed: the count
# must stay an upper bound even where a latency lands exactly on an edge.
_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class OracleItem:
    name: str
    objective_s: float
    alpha: float
    profile: ModelProfile


@dataclass(frozen=True, slots=True)
class OraclePlan:
    limits: dict[str, float]
    satisfied: tuple[str, ...]
    too_fast: tuple[str, ...]
    """Faster than the band even at the floor (stuck in G)."""
    too_slow: tuple[str, ...]
    """Slower than the band even at the cap (unachievable)."""
    no_room: tuple[str, ...]
    """Achievable alone, left out for lack of CPU."""
    steps_over: tuple[str, ...] = ()
    """Met from some limit on, but never in band: its latency steps over the band (threads that follow
    the limit add a whole core's worth at once)."""
    met_most: int | None = None
    """The met bound (None: those in band and those too fast, as for curves without steps)."""

    @property
    def count(self) -> int:
        """The in-band bound."""
        return len(self.satisfied)

    @property
    def met_count(self) -> int:
        """The met bound: the most containers met at once, those faster than their band even at the floor
        included.

        For continuous curves maximising met picks the same set as maximising in
        band (unit values, cheapest extra CPU first, the same costs); a container
        too fast for its band at the floor is met at no extra cost. A container
        whose latency steps over its band counts for met alone, so it is solved
        for separately (`met_most`).
        """
        return len(self.satisfied) + len(self.too_fast) if self.met_most is None else self.met_most


def average_use(p: ModelProfile, limit: float, node_cores: float) -> float:
    """Average CPU (fraction of the node) a container burns running batch after
    batch at this limit: its CPU per batch over its batch latency. Time spent in
    per-batch overhead uses none, so containers with overhead can share a node
    beyond the sum of their limits; the capacity constraint is on this average."""
    limit_cores = limit * node_cores
    rate = min(limit_cores, float(p.threads_at(limit_cores)), node_cores)
    if rate <= 0:
        return 0.0
    cpu_s = p.work_cpu_s * p.cpu_multiplier(limit_cores)
    return cpu_s / (cpu_s / rate + p.overhead_s) / node_cores


def lowest_limit(p: ModelProfile, floor: float, node_cores: float) -> float:
    """The least limit (fraction of the node) the plan weighs for a workload: the floor, or for one whose
    threads follow its limit, one core where that is less. With no limit such a workload runs one
    thread, the state of a one-core limit, which a policy that never limits it reaches below the floor;
    limits between one core and the floor change only its thread count, so from three cores of floor up
    the plan weighs a few states a floor-keeping policy cannot reach (a looser bound, never a wrong one)."""
    return min(floor, 1.0 / node_cores) if p.follows_limit else floor


def shared_reading(p: ModelProfile) -> ModelProfile:
    """The curve a workload can reach on a shared node, for the bound: its threads at any rate up to
    their count, without a quota's penalty.

    Why: under a limit above its need, a workload's threads get what CFS leaves them, any rate below
    the limit. A workload whose threads follow its limit runs whole cores under a limit alone, but on an
    over-subscribed node four threads under a four-core limit ran at 3.6 cores, in a band every limit
    alone stepped over (DQoES beat the stepped bound in property testing); and a quota's efficiency
    penalty does not apply to a rate CFS sets. Loose where no policy can arrange that sharing, never wrong.
    """
    if not p.follows_limit and not p.efficiency:
        return p
    return dataclasses.replace(p, follows_limit=False, efficiency=())


def plan_node(
    items: Sequence[OracleItem], node_cores: float, total_resource: float = 1.0, sharing: bool = True
) -> OraclePlan:
    """Exact count-maximising static allocation for one node.

    sharing: the bound, with each curve as sharing the node can reach it (`shared_reading`); False: the
    plan limits alone reach (a follower's whole cores, a quota's penalty), which the oracle policy sets."""
    n = len(items)
    if n == 0:
        return OraclePlan({}, (), (), (), ())
    floor = floor_limit(n)
    cap = total_resource
    low = {it.name: lowest_limit(it.profile, floor, node_cores) for it in items}
    if sharing:
        items = [dataclasses.replace(it, profile=shared_reading(it.profile)) for it in items]
    by_name = {it.name: it for it in items}

    def use(p: ModelProfile, limit: float) -> float:
        return average_use(p, limit, node_cores)

    def extra(k: str, limit: float) -> float:
        """What container k burns at this limit beyond its lowest."""
        return use(by_name[k].profile, limit) - use(by_name[k].profile, low[k])

    def bracket(k: str, target_use: float) -> tuple[float, float] | None:
        """The limits either side of where k's use passes target_use: (the most that uses at most it,
        the least that uses more); None where even the cap uses no more. Use grows with the limit."""
        p = by_name[k].profile
        a, b = low[k], cap
        if use(p, b) <= target_use:
            return None
        for _ in range(60):
            m = (a + b) / 2
            if use(p, m) <= target_use:
                a = m
            else:
                b = m
        return a, b

    def limit_for(k: str, target_use: float) -> float:
        """The most k may have while using at most target_use."""
        side = bracket(k, target_use)
        return cap if side is None else side[0]

    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    over: dict[str, float] = {}
    too_fast, too_slow = [], []
    for it in items:
        slow_edge = (1 + it.alpha) * it.objective_s * (1 + _SLACK)
        fast_edge = (1 - it.alpha) * it.objective_s * (1 - _SLACK)
        need = limit_for_latency(it.profile, slow_edge, node_cores, lo=low[it.name], hi=cap)
        most = limit_for_min_latency(it.profile, fast_edge, node_cores, lo=low[it.name], hi=cap)
        if need is None:
            too_slow.append(it.name)
        elif most is None:
            too_fast.append(it.name)
        elif most < need:
            # Faster than the band from `need` on and slower below it: a step over the band.
            over[it.name] = need
        else:
            lo[it.name], hi[it.name] = need, most
    limits = dict(low)
    budget = 1.0 - sum(use(it.profile, low[it.name]) for it in items)
    met_most = None
    if over:
        # Met: the most containers whose extra CPU to be met fits, cheapest first (unit values).
        left, met_most = budget, len(too_fast)
        for more in sorted(extra(k, v) for k, v in (*lo.items(), *over.items())):
            if more <= left + _EPS:
                left -= more
                met_most += 1

    def grow(k: str, more: float) -> float:
        """Raise k's limit to use up to `more` beyond what it uses now, charging the budget what it
        does use (a step function, such as whole cores, may take less): that amount."""
        nonlocal budget
        p = by_name[k].profile
        now = use(p, limits[k])
        new = limit_for(k, now + more)
        gained = use(p, new) - now
        if gained <= 0:
            return 0.0
        limits[k] = new
        budget -= gained
        return gained

    def next_step(k: str) -> float:
        """What k's next rise in use costs (inf: none below the cap)."""
        p = by_name[k].profile
        now = use(p, limits[k])
        side = bracket(k, now + _EPS)
        return math.inf if side is None else use(p, side[1]) - now

    def cheapest_first(targets: dict[str, float]) -> tuple[list[str], list[str]]:
        """Set each container to its target, cheapest extra CPU first, while the budget lasts:
        (those set, those left out)."""
        nonlocal budget
        taken, left_out = [], []
        for more, k in sorted((extra(k, v), k) for k, v in targets.items()):
            if more <= budget + _EPS:
                budget -= more
                limits[k] = targets[k]
                taken.append(k)
            else:
                left_out.append(k)
        return taken, left_out

    chosen, no_room = cheapest_first(lo)
    # Met, for those whose latency steps over their band, before any is centred.
    met_over, _ = cheapest_first(over)
    # Spend what is left moving chosen containers towards the band's centre.
    wants = []
    for k in chosen:
        it = by_name[k]
        centre = limit_for_latency(it.profile, it.objective_s, node_cores, lo=low[k], hi=cap)
        if centre is not None:
            target = min(max(centre, lo[k]), hi[k])
            wants.append((use(it.profile, target) - use(it.profile, lo[k]), k, target))
    for more, k, target in sorted(wants):
        if more <= 0:
            continue
        if more <= budget + _EPS:
            budget -= more
            limits[k] = target
        elif budget > _EPS:
            # Partial step: the most the rest buys (a follower's whole cores may leave some of it over).
            grow(k, budget)
    # The rest goes to the unachievable, whose latency it can only improve.
    slow = [k for k in too_slow + no_room + sorted(set(over) - set(met_over)) if extra(k, cap) > 0]
    while budget > _EPS and slow:
        share = budget / len(slow)
        moved = False
        for k in slow:
            moved = grow(k, share) > _EPS or moved
        slow = [k for k in slow if extra(k, cap) - extra(k, limits[k]) > _EPS]
        if not moved:
            # Every next step (a whole core, for threads that follow the limit) costs more than an equal
            # share: the steps the rest pays for, cheapest first, one each.
            for cost, k in sorted((next_step(k), k) for k in slow):
                if cost <= budget + _EPS and grow(k, cost) > _EPS:
                    moved = True
            if not moved:
                break
    return OraclePlan(limits, tuple(sorted(chosen)), tuple(too_fast), tuple(too_slow), tuple(no_room),
                      tuple(sorted(over)), met_most)


@dataclass(frozen=True, slots=True)
class OracleParams(BaseParams):
    total_resource: float = 1.0
    """T_R, the cap on any one limit, as a fraction of the node (as DQoES's)."""
    noise_aware: float = 1.0
    """1: where the batches' noise is known too (the simulator), set the allocation with the most
    expected met + in band (expected_plan below); 0: the noise-free plan."""

    def __post_init__(self) -> None:
        BaseParams.__post_init__(self)
        check_total_resource(self.total_resource)
        v = self.noise_aware
        if isinstance(v, bool) or not isinstance(v, int | float) or not (0.0 <= v <= 1.0):
            raise ValueError(f"noise_aware must be a number in [0, 1], got {v!r}")


class OraclePolicy(PolicyBase):
    """Sets the oracle's plan as the limits every round; reports like every policy."""

    name = "oracle"

    def __init__(self, params: OracleParams | None = None, curve_of: CurveLookup = no_curves,
                 noise_sd: float = 0.0) -> None:
        self.params = params or OracleParams()
        self.curve_of = curve_of
        self.noise_sd = noise_sd
        self._expected: tuple[tuple, Expected] | None = None
        """The last plan under noise and what it was solved for (it changes only on events)."""

    def decide(self, view: NodeView) -> Decision:
        cl = classify_views(view.containers)
        items = []
        for c in view.containers:
            curve = self.curve_of(c.name)
            if curve is not None:
                items.append(OracleItem(c.name, c.objective_s, c.alpha, curve))
        plan = plan_node(items, view.cores, self.params.total_resource, sharing=False)
        under_noise = self.params.noise_aware >= 0.5 and self.noise_sd > 0
        if under_noise:
            key = (tuple(items), view.cores, self.noise_sd, self.params.total_resource)
            if self._expected is None or self._expected[0] != key:
                self._expected = (key, expected_plan(items, view.cores, self.noise_sd, self.params.total_resource))
            limits = self._expected[1].limits
        ups = {}
        for c in view.containers:
            if c.name not in plan.limits:
                ups[c.name] = (c.limit, "no latency curve known")
                continue
            if under_noise:
                ups[c.name] = (limits[c.name], "oracle: most expected met + in band under noise")
                continue
            why = (
                "oracle: in band"
                if c.name in plan.satisfied
                else "oracle: too fast at floor"
                if c.name in plan.too_fast
                else "oracle: unachievable"
                if c.name in plan.too_slow
                else "oracle: steps over its band (met from a whole core on)"
                if c.name in plan.steps_over
                else "oracle: no room"
            )
            ups[c.name] = (plan.limits[c.name], why)
        return build_decision(
            self.name, view, cl, ups, interval_s=self.initial_interval_s,
            extra={"oracle_count": float(plan.count), "oracle_met": float(plan.met_count)},
        )


SPEC = PolicySpec(
    name="oracle",
    label="oracle",
    summary="the ceiling: knows every container's latency curve and sets the count-maximising limits",
    params_type=OracleParams,
    factory=lambda params, context: OraclePolicy(params, context.curve_of, context.noise_sd),
    needs_curves=True,
)


# --- The ceiling under noise -------------------------------------------------------------------
#
# With per-batch noise the latest batch of a container at a given limit is a random draw, so "in
# band" and "met" are probabilities, and the count above (which asks only that the noise-free
# latency lies in the band) is a bound no policy can approach once the noise is as wide as the
# band. What any policy can expect is bounded by the best allocation of expected counts.

NOISE_GRID = 160
"""Limits tried per container between its lowest limit and the cap (geometric), for the ceilings below."""


def latency_cdf(p: ModelProfile, limit: float, node_cores: float, latency_s: float, sigma: float) -> float:
    """P(one batch's latency <= latency_s) alone at this limit (a fraction of the node), the
    work per batch log-normal with log standard deviation `sigma` (the simulator's noise)."""
    return _cdf(p.latency_s(limit * node_cores, node_cores) - p.overhead_s, p.overhead_s, latency_s, sigma)


def chances_at_rate(p: ModelProfile, limit_cores: float | None, rate_cores: float, objective_s: float,
                    alpha: float, sigma: float) -> tuple[float, float]:
    """(P(met), P(in band)) of one batch computing at `rate_cores` under a limit of `limit_cores` (None:
    none; it sets the quota's efficiency penalty), the work per batch log-normal with log sd `sigma`."""
    if rate_cores <= 0:
        return 0.0, 0.0
    cpu_part = p.work_cpu_s * p.cpu_multiplier(limit_cores) / rate_cores
    met = _cdf(cpu_part, p.overhead_s, (1 + alpha) * objective_s, sigma)
    too_fast = _cdf(cpu_part, p.overhead_s, (1 - alpha) * objective_s * (1 - 2 * _SLACK), sigma)
    return met, max(0.0, met - too_fast)


def _cdf(cpu_part: float, overhead_s: float, latency_s: float, sigma: float) -> float:
    """P(cpu_part x noise + overhead_s <= latency_s), the noise log-normal with log sd `sigma`."""
    room = latency_s - overhead_s
    if room <= 0:
        return 0.0
    if cpu_part <= 0:
        return 1.0
    if sigma <= 0:
        return 1.0 if cpu_part <= room * (1 + _SLACK) else 0.0
    return normal_cdf(math.log(room / cpu_part) / sigma)


@dataclass(frozen=True, slots=True)
class Expected:
    """Expected counts of one allocation, and the ceilings no allocation can pass."""

    met: float
    in_band: float
    cpu_share: float
    """Average CPU the allocation uses, as a fraction of the node."""
    limits: dict[str, float]
    met_ceiling: float
    """The most met any allocation can expect (it may spend the node making everyone fast)."""
    in_band_ceiling: float
    """The most in band any allocation can expect."""
    met_median: int = 0
    """Lower median of the allocation's met count: the statistic a run's plateau reports."""
    in_band_median: int = 0


def _grid(floor: float, cap: float) -> list[float]:
    if cap <= floor:
        return [floor]
    r = (cap / floor) ** (1.0 / (NOISE_GRID - 1))
    return [min(cap, floor * r**i) for i in range(NOISE_GRID)]


def _table(it: OracleItem, grid: Sequence[float], node_cores: float, sigma: float) -> list[tuple[float, float, float]]:
    """(use, P(met), P(in band)) at each limit of the grid."""
    rows = []
    slow = (1 + it.alpha) * it.objective_s
    fast = (1 - it.alpha) * it.objective_s
    for limit in grid:
        met = latency_cdf(it.profile, limit, node_cores, slow, sigma)
        too_fast = latency_cdf(it.profile, limit, node_cores, fast * (1 - 2 * _SLACK), sigma)
        rows.append((average_use(it.profile, limit, node_cores), met, max(0.0, met - too_fast)))
    return rows


def expected_plan(
    items: Sequence[OracleItem], node_cores: float, sigma: float, total_resource: float = 1.0,
    in_band_weight: float = 1.0,
) -> Expected:
    """The allocation maximising expected met + in_band_weight x expected in band, and the ceilings.

    Known curves and known noise: the oracle's best under noise (shared.core.allocate on a grid of
    limits). met_ceiling and in_band_ceiling are the LP bounds of the same problem with only met
    or only in band as the value, each curve as sharing the node can reach it (`shared_reading`):
    each alone, no one allocation need reach both."""
    if not items:
        return Expected(0.0, 0.0, 0.0, {}, 0.0, 0.0)
    floor = floor_limit(len(items))
    grids = [_grid(lowest_limit(it.profile, floor, node_cores), total_resource) for it in items]
    tables = [_table(it, grid, node_cores, sigma) for it, grid in zip(items, grids, strict=True)]
    # The ceilings take each curve as sharing the node can reach it; the allocation, what limits reach.
    bound_tables = []
    for it, grid, t in zip(items, grids, tables, strict=True):
        reach = shared_reading(it.profile)
        bound_tables.append(t if reach is it.profile
                            else _table(dataclasses.replace(it, profile=reach), grid, node_cores, sigma))

    def solve(rows, value) -> Choice:
        return choose([[(row[0], value(row)) for row in t] for t in rows], 1.0)

    met_ceiling = solve(bound_tables, lambda r: r[1]).bound
    band_ceiling = solve(bound_tables, lambda r: r[2]).bound
    plan = solve(tables, lambda r: r[1] + in_band_weight * r[2])
    rows = [t[j] for t, j in zip(tables, plan.picks, strict=True)]
    return Expected(
        sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[0] for r in rows),
        {it.name: grid[j] for it, grid, j in zip(items, grids, plan.picks, strict=True)},
        min(met_ceiling, len(items)), min(band_ceiling, len(items)),
        lower_median_count([r[1] for r in rows]), lower_median_count([r[2] for r in rows]),
    )
