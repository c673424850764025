"""What the solver decides for one container each round: a limit and a kind."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PlanKind(StrEnum):
    """Why a container gets the limit it gets (the value is how a reason names it)."""

    IN_BAND = "in band"
    """Chosen to be met: given at least its need, and its aim as room allows."""
    TOO_FAST = "too fast"
    """Faster than its band even at the floor: the floor (met, not in band)."""
    NO_ROOM = "no room"
    """Could be met alone, but the node has no room for it beside those chosen: best effort."""
    UNACHIEVABLE = "unachievable"
    """Cannot be met even with the most one limit may be: best effort."""
    LEARNING = "learning"
    """No fit yet: keeps its limit (a newcomer gets an equal part of what no limit holds)."""
    CANDIDATE = "candidate"
    """Met at some limit the node can give; the solver has not yet chosen (never returned)."""


BEST_EFFORT = (PlanKind.NO_ROOM, PlanKind.UNACHIEVABLE)
"""The kinds whose limit is a share of what is left, not a target."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What the solver decided for one container this round."""

    limit: float
    """The limit, as a fraction of the node."""
    kind: PlanKind
    need: float | None = None
    """The least limit (fraction of the node) at which it is met, where one is known."""
