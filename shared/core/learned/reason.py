"""Why a container got its limit, as data: a plan's kind and the facts of its fit, rendered once.

A round's reason is kept as a `Reason` (an enum and numbers) so tests and tools read the kind and
the fit's facts directly; `text` is the one place it becomes the line people read (the reason a
ContainerDecision carries to the dashboard and the logs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.core.learned.curve import Curve
from shared.core.learned.plan import Plan, PlanKind

PREFIX = "learned: "
"""What every reason of this policy starts with."""
CHANCE_NOTE = ", given what is left for a chance"
"""What a reason adds for a container given what was left for a chance at its band."""
NO_FIT_NOTE = "no clean batch yet"
"""What a reason says in place of a fit's facts before the curve has one."""
STEPS_NOTE = ", whole cores above one: its threads follow the limit"
"""What a reason adds for a container whose threads follow its limit."""


@dataclass(frozen=True, slots=True)
class FitFacts:
    """What a curve's fit said when the reason was given."""

    k: float
    """The slope of log latency against log cores."""
    noise_sd: float
    """The batch-to-batch noise (sd of log latency)."""
    batches: int
    """Observations the curve has taken since its last restart."""
    replicas_sd: float | None = None
    """sd (log) of the height its replicas on the node give its curve; None: no such prior."""
    steps: bool = False
    """Its threads follow its limit (whole cores above one)."""


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a container got its limit this round: the plan's kind (`PlanKind`, the reason's kind),
    whether it was given what was left for a chance, and its fit's facts (None: no fit yet)."""

    kind: PlanKind
    chance: bool = False
    fit: FitFacts | None = None

    @classmethod
    def of(cls, plan: Plan, curve: Curve, chance: bool = False) -> Reason:
        """The reason for a plan, from what the container's curve says now."""
        f = curve.solve()
        if f is None:
            return cls(plan.kind, chance)
        node = curve.node.height
        return cls(plan.kind, chance, FitFacts(f.k, f.noise_sd, curve.n,
                                               math.sqrt(node[2]) if node is not None else None, curve.steps))

    def text(self) -> str:
        """The reason for people (what a ContainerDecision carries)."""
        kind = f"{self.kind}{CHANCE_NOTE}" if self.chance else str(self.kind)
        f = self.fit
        if f is None:
            return f"{PREFIX}{kind} ({NO_FIT_NOTE})"
        pooled = f", its replicas' curve ±{f.replicas_sd:.2f}" if f.replicas_sd is not None else ""
        steps = STEPS_NOTE if f.steps else ""
        return f"{PREFIX}{kind} (k {f.k:.2f}, noise {f.noise_sd:.2f}, {f.batches} batches{pooled}{steps})"
