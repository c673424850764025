"""The learned allocator's parameters, as they arrive and as the code reads them.

Parameters travel as floats (a scenario's `controller` table, a worker's `--param`, an operator's
control message; `numeric_params`), so `LearnedParams` is all numbers and checks their ranges.
`Settings.of` turns them once, at the edge, into typed groups: on/off switches become booleans,
and the rest are grouped by what they govern. Nothing below the edge reads a float as a switch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.core.policy import BaseParams, check_interval, check_total_resource


@dataclass(frozen=True, slots=True)
class LearnedParams(BaseParams):
    """Parameters of the learned allocator; every one is settable at runtime."""

    initial_interval_s: float = 5.0
    """The shortest wait between rounds when a container is learning (seconds)."""
    max_interval_s: float = 120.0
    """The longest wait between rounds when every container is settled."""
    total_resource: float = 1.0
    """T_R: the most any one limit may be, as a fraction of the node (as DQoES's)."""
    half_life_batches: float = 8.0
    """Observations lose half their weight after this many newer batches (follows drift)."""
    half_life_s: float = 60.0
    """A second, longer memory: observations keep half their weight for at least this many seconds of
    batches (0: none). A container's fit uses it while it foresees the container's batches better than
    the memory in batches (docs/design/learned.md, "Two memories")."""
    dead_band: float = 0.05
    """A limit that would move by less than this (relative) is left alone: no flapping."""
    best_effort_share: float = 1.0
    """What a container that cannot be met gets at most, in fair shares of the node (node / |C|)."""
    use_prior: float = 0.0
    """1: start each curve from the container's calibrated profile (when one is known); 0: observations only."""
    pool_work: float = 1.0
    """1: a container's prior on its curve's height is what its replicas on the node (same model, same
    images per batch) show, as far as replicas there agree (docs/design/learned.md, "Work shared by
    replicas"); a newcomer with a replica is placed by it before its first batch; 0: its own."""
    pool_slopes: float = 1.0
    """1: a container's prior on its slope is what the node's other containers show, where their
    slopes are pinned down and agree (docs/design/learned.md, "Slopes shared on a node"); 0: its own."""
    spell_guard: float = 1.0
    """1: two batches off a curve on the side the node's other containers' batches then lie off too,
    taken together (a slow spell of the host, not a drift of one curve), do not restart it; it is
    waited out for as many batches as a restart is watched (docs/design/learned.md, "Spells shared by a
    node"); 0: they do."""
    thread_steps: float = 1.0
    """1: a container whose threads follow its limit (its batches say so) runs floor(limit) threads above
    one core, so it is read at the cores those threads can use and given whole cores there
    (docs/design/learned.md, "Threads that follow the limit"); 0: its limit read as cores it may use."""

    def __post_init__(self) -> None:
        BaseParams.__post_init__(self)
        check_interval(self.max_interval_s, "max_interval_s")
        if self.max_interval_s < self.initial_interval_s:
            raise ValueError("max_interval_s must be >= initial_interval_s")
        check_total_resource(self.total_resource)
        for name, lo, hi in (("half_life_batches", 1.0, 1000.0), ("half_life_s", 0.0, 3600.0),
                             ("dead_band", 0.0, 0.5), ("best_effort_share", 0.0, 10.0),
                             *((s, 0.0, 1.0) for s in SWITCHES)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and lo <= v <= hi):
                raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}")


SWITCHES = ("use_prior", "pool_work", "pool_slopes", "spell_guard", "thread_steps")
"""The parameters that are on/off switches: on at 0.5 and above (`Settings.of`)."""


def _on(value: float) -> bool:
    """A switch's float, as it travels, read as on or off."""
    return value >= 0.5


@dataclass(frozen=True, slots=True)
class Rounds:
    """When rounds come."""

    initial_interval_s: float
    """The shortest wait between rounds (a container is learning)."""
    max_interval_s: float
    """The longest wait between rounds (every container settled)."""


@dataclass(frozen=True, slots=True)
class Memory:
    """How fast observations fade."""

    half_life_batches: float
    """Half-life of an observation's weight, in newer batches."""
    half_life_s: float
    """Half-life of the second, longer memory, in seconds of batches (0: none)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What the solver may hand out, and how readily a limit moves."""

    total_resource: float
    """The most any one limit may be, as a fraction of the node."""
    dead_band: float
    """Relative move below which a limit is left alone."""
    best_effort_share: float
    """The most a container that cannot be met gets, in fair shares of the node."""


@dataclass(frozen=True, slots=True)
class Sharing:
    """What a curve takes from elsewhere: a profile, the node's other containers, its threads."""

    use_prior: bool
    """Start each curve from the container's calibrated profile."""
    pool_work: bool
    """A curve's height from its replicas on the node."""
    pool_slopes: bool
    """A curve's slope from the node's other containers."""
    spell_guard: bool
    """A slow spell of the whole node does not restart a curve."""
    thread_steps: bool
    """Threads that follow the limit are read and given whole cores above one."""


@dataclass(frozen=True, slots=True)
class Settings:
    """`LearnedParams` as the code reads them: typed and grouped."""

    rounds: Rounds
    memory: Memory
    limits: Limits
    sharing: Sharing

    @classmethod
    def of(cls, p: LearnedParams) -> Settings:
        """Parse the parameters as they arrive (floats) into typed groups."""
        return cls(
            rounds=Rounds(p.initial_interval_s, p.max_interval_s),
            memory=Memory(p.half_life_batches, p.half_life_s),
            limits=Limits(p.total_resource, p.dead_band, p.best_effort_share),
            sharing=Sharing(*(_on(getattr(p, s)) for s in SWITCHES)),
        )
