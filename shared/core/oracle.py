"""The oracle: the most containers one node can hold inside their band, and how.

It knows every container's latency curve (its model profile), which no real
controller does, and solves the static problem exactly: choose limits, each in
[1/(2|C|), T_R] like DQoES's, with their CPU use summing to at most the node,
maximising how many containers land inside +-alpha of their objective. With a
value of one per container this knapsack is solved exactly by taking the
cheapest extra CPU first. It is the "physical limit" other policies are
measured against, for an allocation held steady.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.core.classification import classify_views
from shared.core.dqoes import decisions_from, floor_limit
from shared.core.profiles import ModelProfile, limit_for_latency, limit_for_min_latency
from shared.core.types import Decision, NodeView

_EPS = 1e-12
# Aim a hair inside the band edge so a noise-free batch classifies as S.
_EDGE = 1.0 - 1e-9


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
        return len(self.satisfied)


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
        # CPU actually burned at a limit: no more than its threads can use.
        return min(limit, p.threads / node_cores)

    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    too_fast, too_slow = [], []
    for it in items:
        slow_edge = (1 + it.alpha) * it.objective_s * _EDGE
        fast_edge = (1 - it.alpha) * it.objective_s / _EDGE
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
            # Partial step: find the limit that uses exactly the rest.
            # Below the thread cap a limit and its use coincide.
            limits[k] = use(p, limits[k]) + budget
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
            limits[k] = use(p, limits[k]) + give
            budget -= give
            if room - give > _EPS:
                still.append(k)
        slow = still
    return OraclePlan(limits, tuple(sorted(chosen)), tuple(too_fast), tuple(too_slow), tuple(no_room))


class OraclePolicy:
    """Sets the oracle's plan as the limits every round; reports like every policy."""

    name = "oracle"

    def __init__(
        self,
        profiles: Mapping[str, ModelProfile],
        alpha: float = 0.10,
        interval_s: float = 10.0,
        total_resource: float = 1.0,
    ) -> None:
        self.profiles = dict(profiles)
        self.alpha = alpha
        self.initial_interval_s = interval_s
        self.total_resource = total_resource

    def decide(self, view: NodeView) -> Decision:
        cl = classify_views(view.containers)
        known = [c for c in view.containers if c.name in self.profiles]
        plan = plan_node(
            [OracleItem(c.name, c.objective_s, c.alpha, self.profiles[c.name]) for c in known],
            view.cores,
            self.total_resource,
        )
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
        return Decision(
            node=view.node,
            now_s=view.now_s,
            policy=self.name,
            containers=decisions_from(view, cl, ups),
            q_g_s=cl.q_g_s,
            q_b_s=cl.q_b_s,
            satisfied=cl.satisfied,
            interval_s=self.initial_interval_s,
            listener="fixed",
            event=view.event,
            extra={"oracle_count": float(plan.count)},
        )
