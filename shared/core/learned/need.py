"""What a container needs, and what it would see: the question placement and objectives ask.

From a container's curve, learned (`Curve`) or a calibrated profile used as a prior
(`shared.core.profiles.ModelProfile`), two answers:

- `cores_needed`: the least limit, in cores, on a node of a given size, under which its next batch
  meets a latency objective with at least a given probability (infinite when no limit there does);
- `latency_at`: what its next batch's latency would be under a given limit (median, mean, spread).

Both read a batch's log latency as normal about the curve: a learned curve's spread is its measured
noise and what its fit does not know yet (as the solver reads it); a profile's is the noise it is
given (`noise_sd`, NOISE_PRIOR unless told). Pure: no state, no time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from shared.core.learned.curve import Curve
from shared.core.learned.fit import NOISE_PRIOR
from shared.core.profiles import ModelProfile

SEARCH_FLOOR_CORES = 1e-3
"""The least limit the search tries (cores): a millicore, below any limit a runtime sets."""
SEARCH_STEPS = 400
"""Limits tried, geometrically, between SEARCH_FLOOR_CORES and the node's size before refining."""
SEARCH_REFINE = 40
"""Bisection steps between the first limit that does and the one below it that does not."""

Source = Curve | ModelProfile
"""A container's curve: learned from its batches, or a calibrated profile used as a prior."""


@dataclass(frozen=True, slots=True)
class Outlook:
    """A batch's latency under one limit: log-normal, log latency normal(log median_s, sd_log)."""

    median_s: float
    """Half its batches are faster than this (seconds)."""
    sd_log: float
    """Standard deviation of its log latency: noise and what the curve does not know yet."""

    @property
    def mean_s(self) -> float:
        """Its expected latency (seconds): the log-normal mean, median x exp(sd^2 / 2)."""
        return self.median_s * math.exp(self.sd_log**2 / 2)

    def chance_within(self, latency_s: float) -> float:
        """The probability that a batch takes at most `latency_s` seconds."""
        if self.sd_log <= 0:
            return 1.0 if self.median_s <= latency_s else 0.0
        return NormalDist().cdf((math.log(latency_s) - math.log(self.median_s)) / self.sd_log)

    def quantile_s(self, probability: float) -> float:
        """The latency (seconds) that this share of batches stays within."""
        return self.median_s * math.exp(NormalDist().inv_cdf(probability) * self.sd_log)


def latency_at(source: Source, limit_cores: float, node_cores: float, noise_sd: float | None = None) -> Outlook | None:
    """What a batch would take under a limit of `limit_cores` on a node of `node_cores`: None for a
    learned curve that has seen nothing yet. `noise_sd`: a profile's batch-to-batch noise (sd of log
    latency; NOISE_PRIOR if not given); a learned curve's own is used and this is ignored."""
    _check(limit_cores, node_cores)
    limit = min(limit_cores, node_cores)
    if isinstance(source, ModelProfile):
        sd = NOISE_PRIOR if noise_sd is None else noise_sd
        if not (math.isfinite(sd) and sd >= 0):
            raise ValueError(f"noise_sd must be a finite number >= 0, got {noise_sd!r}")
        return Outlook(source.latency_s(limit, node_cores), sd)
    pred = source.predict_limit(limit)
    if pred is None:
        return None
    return Outlook(math.exp(min(pred[0], 700.0)), math.sqrt(source.noise**2 + pred[1] ** 2))


def cores_needed(source: Source, objective_s: float, probability: float, node_cores: float,
                 noise_sd: float | None = None) -> float | None:
    """The least limit (cores, at most `node_cores`) under which a batch takes at most `objective_s`
    with at least `probability`; math.inf when no limit on this node does; None for a learned curve
    that has seen nothing yet. With threads that follow the limit, above one core it is a whole core.

    Found on a geometric grid of SEARCH_STEPS limits and refined by bisection between the first that
    does and the one below it (the chance need not be monotone in the limit where the fit is unsure
    far from its data: the least limit on the grid that does is the answer's neighbourhood)."""
    if not (math.isfinite(objective_s) and objective_s > 0):
        raise ValueError(f"objective_s must be a finite number > 0, got {objective_s!r}")
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability!r}")
    _check(node_cores, node_cores)

    def meets(limit: float) -> bool | None:
        out = latency_at(source, limit, node_cores, noise_sd)
        return None if out is None else out.chance_within(objective_s) >= probability

    top = meets(node_cores)
    if top is None:
        return None
    if not top:
        return math.inf
    lo = min(SEARCH_FLOOR_CORES, node_cores)
    if meets(lo):
        return lo
    ratio = (node_cores / lo) ** (1.0 / SEARCH_STEPS)
    below, above = lo, node_cores
    for i in range(1, SEARCH_STEPS + 1):
        limit = min(node_cores, lo * ratio**i)
        if meets(limit):
            below, above = lo * ratio ** (i - 1), limit
            break
    for _ in range(SEARCH_REFINE):
        mid = math.sqrt(below * above)
        if meets(mid):
            above = mid
        else:
            below = mid
    if isinstance(source, Curve):
        return min(node_cores, source.limit_for(above))
    return above


def _check(limit_cores: float, node_cores: float) -> None:
    if not (math.isfinite(node_cores) and node_cores > 0):
        raise ValueError(f"node_cores must be a finite number > 0, got {node_cores!r}")
    if not (math.isfinite(limit_cores) and limit_cores > 0):
        raise ValueError(f"limit_cores must be a finite number > 0, got {limit_cores!r}")
