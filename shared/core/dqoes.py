"""DQoES: Algorithm 1 (limit update) and Algorithm 2 (adaptive listener).

Pure functions over explicit values; `DQoESPolicy` only strings them together
and carries the listener's state between rounds. Every reading of an ambiguous
passage of the paper is written down in docs/design/dqoes.md, and each is marked
here with "Reading:" where the code implements it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from shared.core.classification import Classification, classify_views
from shared.core.policy import (
    BaseParams,
    PolicyBase,
    PolicySpec,
    build_decision,
    check_interval,
    check_open_fraction,
    check_total_resource,
)
from shared.core.types import CLS_G, CLS_S, Decision, NodeView

ON_DROP_MODES = ("reset", "halve")


@dataclass(frozen=True, slots=True)
class DQoESParams(BaseParams):
    """Operator-settable DQoES parameters (all may change at runtime).

    `alpha` (the band) and `initial_interval_s` (IV_initial of Algorithm 2)
    come from `BaseParams`.
    """

    beta: float = 0.10
    """Step size: the share of R_G moved per round."""
    max_interval_s: float = 160.0
    """Cap on the doubled interval (the paper sets none; an operator wants one)."""
    total_resource: float = 1.0
    """T_R, the cap on any one limit, as a fraction of the node."""
    on_drop: str = "reset"
    """What a drop in |S| does to the interval: "reset" (journal) or "halve" (arXiv)."""

    def __post_init__(self) -> None:
        BaseParams.__post_init__(self)
        check_open_fraction(self.beta, "beta")
        check_interval(self.max_interval_s, "max_interval_s")
        if self.max_interval_s < self.initial_interval_s:
            raise ValueError("max_interval_s must be >= initial_interval_s")
        check_total_resource(self.total_resource)
        if self.on_drop not in ON_DROP_MODES:
            raise ValueError(f"on_drop must be one of {ON_DROP_MODES}, got {self.on_drop!r}")


def floor_limit(n_containers: int) -> float:
    """Algorithm 1, lines 19-20: the lower bound 1/(2|C|), a fraction of the node."""
    return 1.0 / (2 * max(1, n_containers))


class LimitUpdate(NamedTuple):
    """A container's new limit and why: the (new limit, reason) pair a Decision is built from."""

    new_limit: float | None
    reason: str


def update_limits(
    cl: Classification, beta: float, total_resource: float, n_containers: int
) -> dict[str, LimitUpdate]:
    """Algorithm 1, lines 16-24: shrink G, grow B, leave S alone.

    Reading (docs/design/dqoes.md, "The step is additive"): each G container gives
    up (q_i/Q_G) * R_G * beta of the node and each B container receives
    (q_i/Q_B) * R_G * beta, so G's limits fall by R_G * beta in total and B
    receives exactly what G saved, as section IV-A's prose says. Multiplying
    these by L(t), as the pseudo-code's typesetting suggests, moves limits ~10x
    too slowly to reproduce Fig. 4-7.
    Reading: L(t) for a container DQoES has never limited is its measured CPU
    use over the last interval (a limit starting at T_R would not bind).
    Reading: the floor 1/(2|C|) applies to every limit DQoES sets, and limits
    it holds are kept inside [floor, T_R] when |C| changes.
    Reading: with R_G = 0 nothing moves; an unlimited container stays unlimited.
    (R_G is the CPU G used over the last interval, so G only shrinks while it
    actually burns CPU.)
    """
    floor = floor_limit(n_containers)
    cap = total_resource
    r_g, q_g, q_b = cl.r_g, cl.slack_sum_g_s, cl.slack_sum_b_s
    out: dict[str, LimitUpdate] = {}
    for c in cl.items:
        v = c.view
        old = v.limit
        cls = c.cls
        if cls is None:
            out[v.name] = LimitUpdate(_clamp(old, floor, cap), "pending: no batch yet")
            continue
        if not c.fresh or cls is CLS_S:
            why = "satisfied" if cls is CLS_S else "no new batch: class and limit kept"
            out[v.name] = LimitUpdate(_clamp(old, floor, cap), why)
            continue
        base = old if old is not None else v.cpu_share
        if base is None:
            out[v.name] = LimitUpdate(old, "no CPU reading yet")
            continue
        assert c.slack_s is not None
        if r_g == 0.0:
            out[v.name] = LimitUpdate(_clamp(old, floor, cap), "R_G = 0: free competition")
            continue
        if cls is CLS_G:
            new = _clamp(base - (c.slack_s / q_g) * r_g * beta, floor, cap)
            out[v.name] = LimitUpdate(new, _SHRINK_AT_FLOOR if new == floor else _SHRINK)
        else:
            new = _clamp(base + (c.slack_s / q_b) * r_g * beta, floor, cap)
            out[v.name] = LimitUpdate(new, _GROW_AT_CAP if new == cap else _GROW)
    return out


_SHRINK, _SHRINK_AT_FLOOR, _GROW, _GROW_AT_CAP = "G: shrink", "G: shrink (at floor)", "B: grow", "B: grow (at cap)"


def _clamp(limit: float | None, floor: float, cap: float) -> float | None:
    """min(cap, max(floor, limit)), without the two calls (a round makes one a container)."""
    if limit is None:
        return None
    if not limit >= floor:  # NaN too, as max(floor, NaN) gives floor
        limit = floor
    return cap if limit > cap else limit


@dataclass(frozen=True, slots=True)
class ListenerState:
    """Algorithm 2's memory: the interval, the converging streak, last round's Q values."""

    interval_s: float
    streak: int = 0
    prev_slack_sum_g_s: float | None = None
    prev_slack_sum_b_s: float | None = None
    prev_satisfied: int | None = None


def _approaches_zero(prev: float, now: float, *, positive: bool) -> bool:
    # Reading: a set that stays empty (Q = 0 both times) counts as at 0, so a
    # node where everything is satisfied backs off instead of polling forever.
    if prev == 0.0 and now == 0.0:
        return True
    return now < prev if positive else now > prev


def listener_step(
    state: ListenerState,
    slack_sum_g_s: float,
    slack_sum_b_s: float,
    satisfied: int,
    params: DQoESParams,
    event: str | None = None,
) -> tuple[ListenerState, str]:
    """Algorithm 2: the interval until the next round, and why.

    - an event (new/finished container, changed objective) resets IV;
    - |S| dropped: reset (or halve) IV. Reading: the round that saw the drop has
      already run Algorithm 1 on fresh data, so "execute Algorithm 1 at once"
      means the next round comes after the reset interval, not a second update
      on the same data. The drop is checked before convergence;
    - Q_G fell and Q_B rose for 3 rounds in a row: double IV (up to the cap);
    - otherwise keep IV and restart the streak.
    """
    nxt = replace(state, prev_slack_sum_g_s=slack_sum_g_s, prev_slack_sum_b_s=slack_sum_b_s, prev_satisfied=satisfied)
    init = params.initial_interval_s
    if event is not None:
        return replace(nxt, interval_s=init, streak=0), f"reset: {event}"
    if state.prev_satisfied is None or state.prev_slack_sum_g_s is None or state.prev_slack_sum_b_s is None:
        return replace(nxt, streak=0), "first round"
    if satisfied < state.prev_satisfied:
        if params.on_drop == "halve":
            iv = max(init, state.interval_s / 2)
        else:
            iv = init
        why = f"{params.on_drop}: |S| dropped {state.prev_satisfied}->{satisfied}"
        return replace(nxt, interval_s=iv, streak=0), why
    converging = _approaches_zero(state.prev_slack_sum_g_s, slack_sum_g_s, positive=True) and _approaches_zero(
        state.prev_slack_sum_b_s, slack_sum_b_s, positive=False
    )
    if converging:
        streak = state.streak + 1
        if streak >= 3:
            iv = min(params.max_interval_s, state.interval_s * 2)
            return replace(nxt, interval_s=iv, streak=0), "doubled: 3 converging rounds"
        return replace(nxt, streak=streak), f"converging ({streak}/3)"
    return replace(nxt, streak=0), "kept"


class DQoESPolicy(PolicyBase):
    """Algorithm 1 every round, Algorithm 2 choosing when the next round runs."""

    name = "dqoes"

    def __init__(self, params: DQoESParams | None = None) -> None:
        self.params = params or DQoESParams()
        self.listener = ListenerState(self.params.initial_interval_s)

    def set_params(self, params: DQoESParams) -> None:
        """Operator change at runtime; the listener restarts from the new IV."""
        self.params = params
        self.listener = ListenerState(params.initial_interval_s)

    def decide(self, view: NodeView) -> Decision:
        p = self.params
        cl = classify_views(view.containers)
        ups = update_limits(cl, p.beta, p.total_resource, len(view.containers))
        self.listener, why = listener_step(
            self.listener, cl.slack_sum_g_s, cl.slack_sum_b_s, cl.satisfied, p, view.event
        )
        return build_decision(
            self.name, view, cl, ups,
            interval_s=self.listener.interval_s, listener=why, extra={"r_g": cl.r_g, "r_b": cl.r_b},
        )


SPEC = PolicySpec(
    name="dqoes",
    label="DQoES",
    summary="the DQoES paper: classify G/S/B, move CPU from G to B (Algorithm 1), adaptive interval (Algorithm 2)",
    params_type=DQoESParams,
    factory=lambda params, context: DQoESPolicy(params),
)
