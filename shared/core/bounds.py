"""The sane range of every number an operator or a peer can hand DQoES.

Why: one control message with `initial_interval_s` = 5e-324 drove a worker to
about 500 rounds a second, and an objective of 5e-324 s was accepted (issue
11). Each bound here is checked where a value enters (public requests, wire
messages, container labels, policy parameters), so a value outside it is
refused with a reason and changes nothing. docs/reference/api.md lists them.

Pure: numbers and one check function, no I/O.
"""

from __future__ import annotations

import math
from typing import Any

MIN_OBJECTIVE_S = 0.001
"""Shortest objective: a millisecond a batch (below that no latency measure means much)."""

MAX_OBJECTIVE_S = 86400.0
"""Longest objective: a day per batch (more is surely a typo)."""

MIN_INTERVAL_S = 0.05
"""Shortest control interval any policy accepts: a round at most 20 times a second."""

MAX_INTERVAL_S = 86400.0
"""Longest control interval: a day."""

MAX_LATENCY_S = 7 * 86400.0
"""Longest batch latency a container may report: a week (anything longer is a broken clock)."""


def in_range(value: Any, lo: float, hi: float) -> bool:
    """A real number (not a bool) within [lo, hi]."""
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and lo <= value <= hi)


def objective_problem(value: Any) -> str | None:
    """Why `value` cannot be an objective (seconds per batch), or None."""
    if in_range(value, MIN_OBJECTIVE_S, MAX_OBJECTIVE_S):
        return None
    return f"must be between {MIN_OBJECTIVE_S:g} and {MAX_OBJECTIVE_S:g} seconds per batch, got {value!r}"

MAX_WINDOW_S = 3600.0
"""Longest window a percentile objective may be measured over (an hour); shorter than any: > 0."""
