"""The oracle: the most containers one node can hold inside their band, and how.

It knows every container's latency curve (its model profile), which no real
controller does, and solves the static problem exactly: choose limits, each in
[1/(2|C|), T_R] like DQoES's, with the containers' average CPU use summing to
at most the node, maximising how many containers land inside +-alpha of their
objective. With a value of one per container this knapsack is solved exactly
by taking the cheapest extra CPU first. Its count is the "physical limit"
other policies are measured against: every container needs at least the
average CPU its slowest acceptable batch burns, and no policy can hand out
more CPU than the node has (a container held at the floor, or sharing by CFS,
still burns at least the floor's worth). The capacity constraint is on average
use, not on limits, because batches with non-CPU overhead leave CPU for others
(a bound on limits was beaten by default Swarm in property testing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.classification import classify_views
from shared.core.dqoes import floor_limit
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

    @property
    def count(self) -> int:
        """The in-band bound."""
        return len(self.satisfied)

    @property
    def met_count(self) -> int:
        """The met bound: those in band, and those faster than their band even at the floor.

        Maximising met picks the same set as maximising in band (unit values,
        cheapest extra CPU first, the same costs); a container too fast for its
        band at the floor is met at no extra cost.
        """
        return len(self.satisfied) + len(self.too_fast)


def average_use(p: ModelProfile, limit: float, node_cores: float) -> float:
    """Average CPU (fraction of the node) a container burns running batch after
    batch at this limit: its CPU per batch over its batch latency. Time spent in
    per-batch overhead uses none, so containers with overhead can share a node
    beyond the sum of their limits; the capacity constraint is on this average."""
    limit_cores = limit * node_cores
    rate = min(limit_cores, float(p.threads), node_cores)
    if rate <= 0:
        return 0.0
    cpu_s = p.work_cpu_s * p.cpu_multiplier(limit_cores)
    return cpu_s / (cpu_s / rate + p.overhead_s) / node_cores


def plan_node(
    items: Sequence[OracleItem], node_cores: float, total_resource: float = 1.0
) -> OraclePlan:
    """Exact count-maximising static allocation for one node."""
    n = len(items)
    if n == 0:
        return OraclePlan({}, (), (), (), ())
    floor = floor_limit(n)
    cap = total_resource

    def use(p: ModelProfile, limit: float) -> float:
        return average_use(p, limit, node_cores)

    def limit_for(p: ModelProfile, target_use: float) -> float:
        # Average use grows with the limit: bisect for the limit that uses target_use.
        a, b = floor, cap
        if use(p, b) <= target_use:
            return b
        for _ in range(60):
            m = (a + b) / 2
            if use(p, m) <= target_use:
                a = m
            else:
                b = m
        return a

    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    too_fast, too_slow = [], []
    for it in items:
        slow_edge = (1 + it.alpha) * it.objective_s * (1 + _SLACK)
        fast_edge = (1 - it.alpha) * it.objective_s * (1 - _SLACK)
        need = limit_for_latency(it.profile, slow_edge, node_cores, lo=floor, hi=cap)
        most = limit_for_min_latency(it.profile, fast_edge, node_cores, lo=floor, hi=cap)
        if need is None:
            too_slow.append(it.name)
        elif most is None or most < need:
            too_fast.append(it.name)
        else:
            lo[it.name], hi[it.name] = need, most
    by_name = {it.name: it for it in items}
    limits = {it.name: floor for it in items}
    budget = 1.0 - sum(use(it.profile, floor) for it in items)
    chosen: list[str] = []
    no_room: list[str] = []
    order = sorted(lo, key=lambda k: (use(by_name[k].profile, lo[k]) - use(by_name[k].profile, floor), k))
    for k in order:
        p = by_name[k].profile
        extra = use(p, lo[k]) - use(p, floor)
        if extra <= budget + _EPS:
            budget -= extra
            limits[k] = lo[k]
            chosen.append(k)
        else:
            no_room.append(k)
    # Spend what is left moving chosen containers towards the band's centre.
    wants = []
    for k in chosen:
        it = by_name[k]
        centre = limit_for_latency(it.profile, it.objective_s, node_cores, lo=floor, hi=cap)
        if centre is not None:
            target = min(max(centre, lo[k]), hi[k])
            wants.append((use(it.profile, target) - use(it.profile, lo[k]), k, target))
    for extra, k, target in sorted(wants):
        if extra <= 0:
            continue
        p = by_name[k].profile
        if extra <= budget + _EPS:
            budget -= extra
            limits[k] = target
        elif budget > _EPS:
            # Partial step: the limit that uses exactly the rest.
            limits[k] = limit_for(p, use(p, limits[k]) + budget)
            budget = 0.0
    # The rest goes to the unachievable, whose latency it can only improve.
    slow = [k for k in too_slow + no_room if use(by_name[k].profile, cap) > use(by_name[k].profile, floor)]
    while budget > _EPS and slow:
        share = budget / len(slow)
        still = []
        for k in slow:
            p = by_name[k].profile
            room = use(p, cap) - use(p, limits[k])
            give = min(room, share)
            limits[k] = limit_for(p, use(p, limits[k]) + give)
            budget -= give
            if room - give > _EPS:
                still.append(k)
        slow = still
    return OraclePlan(limits, tuple(sorted(chosen)), tuple(too_fast), tuple(too_slow), tuple(no_room))


@dataclass(frozen=True, slots=True)
class OracleParams(BaseParams):
    total_resource: float = 1.0
    """T_R, the cap on any one limit, as a fraction of the node (as DQoES's)."""

    def __post_init__(self) -> None:
        BaseParams.__post_init__(self)
        check_total_resource(self.total_resource)


class OraclePolicy(PolicyBase):
    """Sets the oracle's plan as the limits every round; reports like every policy."""

    name = "oracle"

    def __init__(self, params: OracleParams | None = None, curve_of: CurveLookup = no_curves) -> None:
        self.params = params or OracleParams()
        self.curve_of = curve_of

    def decide(self, view: NodeView) -> Decision:
        cl = classify_views(view.containers)
        items = []
        for c in view.containers:
            curve = self.curve_of(c.name)
            if curve is not None:
                items.append(OracleItem(c.name, c.objective_s, c.alpha, curve))
        plan = plan_node(items, view.cores, self.params.total_resource)
        ups = {}
        for c in view.containers:
            if c.name not in plan.limits:
                ups[c.name] = (c.limit, "no latency curve known")
                continue
            why = (
                "oracle: in band"
                if c.name in plan.satisfied
                else "oracle: too fast at floor"
                if c.name in plan.too_fast
                else "oracle: unachievable"
                if c.name in plan.too_slow
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
    factory=lambda params, context: OraclePolicy(params, context.curve_of),
    needs_curves=True,
)
