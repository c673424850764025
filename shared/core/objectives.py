"""Which objective governs a container, and the percentile of its batches over a window.

Why here, pure: an objective may be set for one container or for a service
(every replica, present and future), and a container may carry its own
`dqoes.objective_s` label; the order in which they win (own > service >
label) is a rule of the controller, not of NATS or Docker, so it is decided
from plain values and tested without either. A percentile objective
("p95 over 30 s at most 0.2 s") turns a container's per-batch latencies into
one number per window, of the same shape the allocators already take.

A service is named by a selector: `api` matches a container whose Swarm
service (label com.docker.swarm.service.name) or compose service (label
com.docker.compose.service) is `api`; `app=api` matches a container whose
label `app` is `api`.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from shared.core.quantiles import exact_quantile

SERVICE_LABELS = ("com.docker.swarm.service.name", "com.docker.compose.service")
"""The labels that name a container's service (Swarm, then compose)."""

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}"
_LABEL_KEY = r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}"
_SELECTOR_RE = re.compile(rf"^(?:(?P<key>{_LABEL_KEY})=)?(?P<value>{_NAME})$")

Source = Literal["container", "service", "label"]


def parse_selector(text: str) -> tuple[str | None, str]:
    """(label key or None for a service name, value); ValueError with a one-line reason if malformed."""
    if not isinstance(text, str):
        raise ValueError(f"must be a service name or a label selector key=value, got {_short(text)}")
    m = _SELECTOR_RE.match(text)
    if m is None:
        raise ValueError(
            f"must be a service name (letters, digits, '_', '.', '-') or a label selector key=value, "
            f"got {_short(text)}"
        )
    return m.group("key"), m.group("value")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether a container with these labels belongs to the service the selector names."""
    try:
        key, value = parse_selector(selector)
    except ValueError:
        return False
    if key is None:
        return any(labels.get(k) == value for k in SERVICE_LABELS)
    return labels.get(key) == value


@dataclass(frozen=True, slots=True)
class Objective:
    """An objective in force: at most `objective_s` per batch, or at the `percentile` over `window_s`."""

    objective_s: float
    alpha: float | None = None
    percentile: float | None = None
    """None: every batch's latency is compared with the objective (the default)."""
    window_s: float | None = None
    """Window of the percentile; None: the latency source's (or the default)."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """The objective governing a container and where it comes from (`selector`: the service's)."""

    objective: Objective | None
    source: Source | None
    selector: str | None = None


def resolve(own: Objective | None, services: Mapping[str, Objective], labels: Mapping[str, str],
            label: Objective | None) -> Resolved:
    """Own (set for the container) > service (the first matching selector, in sorted order) > label."""
    if own is not None:
        return Resolved(own, "container")
    for selector in sorted(services):
        if matches(selector, labels):
            return Resolved(services[selector], "service", selector)
    if label is not None:
        return Resolved(label, "label")
    return Resolved(None, None)


class BatchWindow:
    """A container's recent batch latencies, for a percentile over the last `window_s` seconds.

    Times are the caller's clock (seconds); a batch older than the longest window asked for is
    dropped as the next one arrives, so memory stays bounded by the batches of one window.
    """

    __slots__ = ("batches",)

    def __init__(self) -> None:
        self.batches: deque[tuple[float, float]] = deque()

    def add(self, at_s: float, latency_s: float, window_s: float) -> None:
        self.batches.append((at_s, latency_s))
        horizon = at_s - window_s
        while self.batches and self.batches[0][0] < horizon:
            self.batches.popleft()

    def percentile(self, now_s: float, percentile: float, window_s: float) -> float | None:
        """The percentile of the batches finished within (now - window_s, now]; None: none did."""
        return batch_percentile(((t, x) for t, x in self.batches), now_s, percentile, window_s)


def batch_percentile(batches: Iterable[tuple[float, float]], now_s: float, percentile: float,
                     window_s: float) -> float | None:
    """The `percentile` (0-100, open) of the latencies of the (finished_at_s, latency_s) batches in the
    window (now_s - window_s, now_s]; None when no batch finished in it."""
    if not 0.0 < percentile < 100.0 or not window_s > 0.0:
        raise ValueError(f"percentile must be in (0, 100) and window_s > 0, got {percentile!r}, {window_s!r}")
    start = now_s - window_s
    values = [x for t, x in batches if start < t <= now_s]
    if not values:
        return None
    value = exact_quantile(percentile / 100.0, values)
    return None if math.isnan(value) else value
