"""What a container reports cannot buy it more CPU than its measured use justifies.

Why: every policy reads a container's latency from the container's own word
(its batch events). A compromised container that reports slow batches makes
any policy raise its limit, and a policy that shares the node out takes that
CPU from its siblings (issue 62). A raise helps only a container that its
limit holds back: one that the kernel throttled, or one that used most of its
limit over the last interval, or one that the other containers left no spare
CPU to use it (on a busy node, contention, not its limit, holds it back). One
that is none of these cannot run faster with more CPU, whatever it says, so
it keeps the limit it has.

The guard sits between the policy and the runtime in `NodeController`, so it
holds for every policy. What is not measured never blocks a raise: a
container without a CPU reading yet, or a runtime that reports no throttling
(the simulator), is judged on what is measured, or not at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import msgspec

from shared.core.types import ContainerDecision, Decision

USE_MIN = 0.5
"""Share of its limit a container must have used over the last interval for a raise to be able to
help it (below it, the limit is not what holds it back)."""
THROTTLED_MIN = 0.1
"""Share of CFS periods throttled over the last interval at and above which the limit holds it back,
whatever its average use (bursty threads hit the quota while averaging under it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
    """What the runtime measured of one container over the last interval (None: not measured)."""

    cpu_share: float | None
    """CPU used, fraction of the node."""
    throttled_ratio: float | None = None
    """Share of its CFS periods in which it was throttled."""


def may_raise(limit: float | None, measured: Measured | None, spare: float | None) -> bool:
    """Whether a raise of `limit` (fraction of the node) can help the container, as measured.

    False only when its use was measured, its throttling was not measured or under THROTTLED_MIN, it
    used less than USE_MIN of its limit, and the node's `spare` CPU over the same interval (fraction
    of the node left unused by every container; None: not known) would have let it reach that."""
    if limit is None or measured is None or measured.cpu_share is None or spare is None:
        return True
    throttled = measured.throttled_ratio
    if throttled is not None and throttled >= THROTTLED_MIN:
        return True
    short = USE_MIN * limit - measured.cpu_share
    return short <= 0.0 or spare < short


def throttled_share(before: tuple[int, int] | None, now: tuple[int, int] | None) -> float | None:
    """Share of CFS periods throttled between two readings of (periods, throttled periods).

    None when either reading is missing or a counter went back (a new group under the same name).
    """
    if before is None or now is None:
        return None
    periods, throttled = now[0] - before[0], now[1] - before[1]
    if periods < 0 or throttled < 0:
        return None
    return 0.0 if periods == 0 else min(1.0, throttled / periods)


def is_raise(old: float | None, new: float | None) -> bool:
    """More CPU than before (None: no limit, the whole node)."""
    if old is None:
        return False
    return new is None or new > old


def cap_raises(decision: Decision, measured: Mapping[str, Measured], spare: float | None) -> Decision:
    """The decision with every raise that cannot help (`may_raise`) held at the limit in force.

    The containers it holds keep their old limit, with the reason saying why; the rest is unchanged
    (the same object when nothing is held)."""
    held: dict[int, ContainerDecision] = {}
    for i, c in enumerate(decision.containers):
        if is_raise(c.old_limit, c.new_limit) and not may_raise(c.old_limit, measured.get(c.name), spare):
            m = measured[c.name]
            used = m.cpu_share or 0.0
            held[i] = msgspec.structs.replace(
                c, new_limit=c.old_limit, planned_limit=None,
                reason=f"raise held: used {used:.3f} of its {c.old_limit or 0.0:.3f} limit, not throttled, "
                       f"with {spare or 0.0:.3f} of the node spare ({c.reason})")
    if not held:
        return decision
    containers = tuple(held.get(i, c) for i, c in enumerate(decision.containers))
    return msgspec.structs.replace(decision, containers=containers)
