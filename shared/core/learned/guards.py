"""The guards: what keeps a curve from chasing one odd batch, and a limit from chasing noise.

- Drift watch (`take`): a batch far off its curve is held out until the next one; two in a row on
  the same side mean the curve moved and it restarts from both (unless the node's other containers
  were off alike then: a spell of the host, waited out); one alone joins the fit down-weighted.
- Dead bands (`kept`): a limit moves only when the move is larger than what the fit can tell from
  noise and adds enough to the container's chances; a share of one that cannot be met moves only
  past a wide band; one too fast at the floor keeps what it holds within a slack.
- Steps (`stepped`): while a fit is uncertain a limit moves at most by a factor a round.
- Overcommit (`settle`): limits kept where they are must still fit the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from shared.core.learned.curve import RESTART_WATCH, Curve, Suspect
from shared.core.learned.fit import NOISE_PRIOR, Fit
from shared.core.learned.plan import Plan, PlanKind
from shared.core.learned.solver import chances, faster_than_band
from shared.core.types import ContainerView

OUTLIER_SD = 3.0
"""A batch further than this many standard deviations from the curve is suspect."""
MAX_STEP_UNCERTAIN = 2.0
"""While the fit is uncertain a limit moves at most by this factor a round."""
UNCERTAIN_SD = 0.25
"""A fit whose model sd of log latency at the new limit is above this is uncertain there."""
TELL_SD = 2.0
"""A move within this many model sds at the old limit is one the fit cannot tell from noise."""
BEST_EFFORT_DEAD_BAND = 0.25
"""A container that cannot be met keeps its share unless it would move by more than this."""
VALUE_DEAD_BAND = 0.05
"""A move of an aimed container that raises its P(met) + P(in band) by less than this is not made."""
TOO_FAST_SLACK = 3.0
"""A container faster than its band at the floor, once set or kept at a limit as such, keeps it while
it is at most this many floors: the floor falls as a node fills (1/(2|C|)), and one that chased it was
trimmed at each arrival. What it holds over its plan is taken back (largest holdings first) before
any plan is cut."""
TOO_FAST_FIRST = 1.5
"""The same before it is held as too fast: a newcomer's share past this many floors is trimmed."""

Spell = Callable[[float, float], bool]
"""`spell(start_s, side)`: whether the node's other containers ran off their curves on `side` (+1
slow, -1 fast) since `start_s` too."""


def batch_sd(fit: Fit, pred: tuple[float, float]) -> float:
    """The sd of a batch's log latency about its curve's prediction `pred` (mean, model sd): the spread
    of a batch where the curve is known, and what the fit does not know yet where it is not (two
    batches may put a third limit far off). What both the drift watch and the spell notes measure by."""
    return math.hypot(max(fit.noise_sd, NOISE_PRIOR), pred[1])


def take(curve: Curve, x: float, y: float, w: float, decay: tuple[float, float], start_s: float = math.nan,
         spell: Spell | None = None) -> None:
    """One observation (log cores, log latency) of weight w. A batch far off the curve is held out
    until the next: two in a row on the same side mean the curve moved (it restarts from both);
    otherwise it joins the fit at a weight that makes it count little. Held out meanwhile, one odd
    batch never inflates the noise, which would hide the drift it may be the start of.

    `spell(start, side)`: whether the node's other containers were off their curves on the same
    side since `start` (the held batch's); if so the curve is kept, the older batch dropped and the
    newer held in its place, for at most RESTART_WATCH such batches in a row."""
    curve.check_back(x, y)
    pred = curve.predict_x(x)
    fit = curve.solve()
    if pred is not None and fit is not None and curve.n >= 2:
        resid = y - pred[0]
        sd = batch_sd(fit, pred)
        if abs(resid) > OUTLIER_SD * sd:
            held = curve.watch.suspects[-1] if curve.watch.suspects else None
            if held is not None and held.resid * resid > 0:
                if (spell is not None and curve.watch.spell_held < RESTART_WATCH
                        and spell(held.start_s if math.isfinite(held.start_s) else start_s, math.copysign(1.0, resid))):
                    # A spell of the host: both batches say more of it than of this curve.
                    curve.watch.spell_held += 1
                    curve.watch.suspects[-1] = Suspect(resid, x, y, w, start_s)
                    return
                curve.restart()
                curve.add(held.x, held.y, held.w, decay)
                curve.add(x, y, w, decay)
                return
            # A new suspect (none held, or one on the other side) breaks any chain of slow batches.
            release(curve, decay)
            curve.watch.spell_held = 0
            curve.watch.suspects.append(Suspect(resid, x, y, w, start_s))
            return
    release(curve, decay)
    curve.watch.spell_held = 0
    curve.add(x, y, w, decay)


def release(curve: Curve, decay: tuple[float, float]) -> None:
    """A batch held out as a suspect that the next batch did not confirm joins the fit, down-weighted."""
    for resid, x, y, w, _ in curve.watch.suspects:
        fit = curve.solve()
        sd = max(fit.noise_sd, NOISE_PRIOR) if fit is not None else NOISE_PRIOR
        curve.add(x, y, w * min(1.0, OUTLIER_SD * sd / abs(resid)), decay)
    curve.watch.suspects.clear()


def kept(plan: Plan, curve: Curve, v: ContainerView, old: float, cores: float, floor: float, dead_band: float,
         fast_held_at: float | None) -> bool:
    """Whether a container stays at its limit `old` (fraction of the node) rather than move to its plan.

    Too fast at the floor: kept while at most TOO_FAST_FIRST floors over its plan, TOO_FAST_SLACK once
    held as such (`fast_held_at`: the limit it was last set or kept at as too fast). Aimed or learning:
    kept when the move is within the dead band or what the fit cannot tell from noise; aimed, also
    when the move adds less than VALUE_DEAD_BAND to its chances (a trim only where the curve puts it
    faster than its band). Cannot be met: kept within BEST_EFFORT_DEAD_BAND."""
    new = plan.limit
    if plan.kind is PlanKind.TOO_FAST:
        # Once trimmed as too fast, it is not trimmed again each time the floor falls.
        held = math.isclose(fast_held_at if fast_held_at is not None else -1.0, old, rel_tol=1e-3)
        return floor <= old <= new * (TOO_FAST_SLACK if held else TOO_FAST_FIRST)
    if plan.kind in (PlanKind.IN_BAND, PlanKind.LEARNING):
        # A move smaller than what the fit can tell apart from noise is not made.
        at_old = curve.predict_limit(old * cores)
        tell = TELL_SD * at_old[1] if at_old is not None else 0.0
        keep = abs(math.log(new / old)) <= max(math.log1p(dead_band), tell)
        if not keep and plan.kind is PlanKind.IN_BAND:
            # Nor one that adds little to its chances: the value is flat near its best.
            gain = sum(chances(curve, v, new * cores)) - sum(chances(curve, v, old * cores))
            # Nor trimming, unless the curve puts it faster than its band where it is.
            keep = gain < VALUE_DEAD_BAND and (new > old or not faster_than_band(at_old, v))
        return keep
    # Cannot be met: a share, not a target.
    return abs(new - old) <= BEST_EFFORT_DEAD_BAND * max(old, new)


def stepped(curve: Curve, new: float, old: float, cores: float, floor: float) -> float:
    """An aimed container's move from `old` to `new`, at most MAX_STEP_UNCERTAIN either way while the
    fit is uncertain at `new` (no fit, or a model sd above UNCERTAIN_SD)."""
    pred = curve.predict_limit(new * cores)
    if pred is None or pred[1] > UNCERTAIN_SD:
        # An uncertain fit moves a limit only so far a round.
        return curve.snap(min(max(new, old / MAX_STEP_UNCERTAIN), old * MAX_STEP_UNCERTAIN), cores, floor)
    return new


def give_back(proposal: dict[str, float], order: Sequence[tuple[float, str]], excess: float) -> float:
    """Take up to each (amount, name) from its proposed limit, in order, until `excess` is gone;
    returns what is still over."""
    for amount, name in order:
        if excess <= 1e-9:
            break
        back = min(amount, excess)
        proposal[name] -= back
        excess -= back
    return excess


def settle(proposal: dict[str, float], plans: Mapping[str, Plan], olds: Mapping[str, float | None],
           chances_held: set[str], low: Mapping[str, float]) -> None:
    """Staying put must not overcommit the node; changes `proposal` in place.

    What is left was split as if every container moved to its plan; those kept where they are hold
    some of it, so the best-effort rises it paid for give way first (no one moves for it), then the
    largest overshoots, then (only if the node is still overcommitted) the largest limits, down to
    each one's floor (`low`)."""
    excess = sum(proposal.values()) - 1.0
    rises = [(proposal[n] - old, n) for n in proposal
             if plans[n].kind in (PlanKind.NO_ROOM, PlanKind.UNACHIEVABLE) and (old := olds[n]) is not None
             and proposal[n] > old and n not in chances_held]
    excess = give_back(proposal, sorted(rises, reverse=True), excess)
    overs = sorted(((proposal[n] - plans[n].limit, n) for n in proposal), reverse=True)
    excess = give_back(proposal, [(over, n) for over, n in overs if over > 0], excess)
    give_back(proposal, [(proposal[n] - low[n], n) for n in sorted(proposal, key=lambda n: -proposal[n])], excess)
