"""The curve fit: a weighted Bayesian line through (log cores, log latency), and what it yields.

Below a container's saturation its batch latency follows a power law in the cores c it gets,
log L = theta0 - k log c (k = 1 is "work / cores"; real quotas cost extra CPU at small limits,
k > 1). The fit is a weighted Bayesian linear regression over decayed sums of the observations,
with priors on k (the container's own, or the node's), on theta0 (a calibrated profile) and on the
height of the line at one point (its replicas'); the batch-to-batch noise is estimated from the
weighted residuals. Pure: sums and priors in, a `Fit` out.
"""

from __future__ import annotations

import math
from typing import NamedTuple

K_PRIOR_SD = 0.35
"""Prior standard deviation of the slope k about 1 (work / cores), before any batch is seen."""
K_RANGE = (0.3, 3.0)
"""The slopes a fit may report: one outside is clamped into this range."""
NOISE_PRIOR = 0.05
"""Prior standard deviation of log latency between batches (weight NOISE_PSEUDO batches)."""
NOISE_PSEUDO = 2.0
"""How many batches' weight the noise prior counts for."""


class Fit(NamedTuple):
    """The posterior of one curve's line and its noise."""

    theta: float
    """theta0: log latency (log CPU-seconds) at one core."""
    k: float
    """The slope: latency falls as cores**-k."""
    var_theta: float
    """Posterior variance of theta0."""
    cov: float
    """Posterior covariance of theta0 and k."""
    var_k: float
    """Posterior variance of k."""
    noise_sd: float
    """Batch-to-batch noise: standard deviation of log latency about the line."""

    def mean_sd(self, x: float) -> tuple[float, float]:
        """(mean, model sd) of log latency at log cores x: the line and what the fit does not know there."""
        var = self.var_theta - 2 * x * self.cov + x * x * self.var_k  # h = (1, -x): var = h V h
        return self.theta - self.k * x, math.sqrt(max(0.0, var))


Sums = tuple[float, float, float, float, float, float, float]
"""Decayed weighted sums over observations (x = log cores, y = log latency): (sw, sw2, sx, sy, sxx,
sxy, syy), sw2 being the sum of squared weights (with sw, how many observations the weights are)."""


def solve_sums(sums: Sums | list[float], k_prior: tuple[float, float],
               theta_prior: tuple[float, float] = (0.0, math.inf),
               height: tuple[float, float, float] | None = None) -> Fit | None:
    """The posterior of (theta0, k) and the noise sd from the sums, under a prior (mean, sd) on k, a
    prior (mean, sd) on theta0 (infinite sd: none) and a prior (x0, mean, variance) on the height of the
    line at x0. None when there is neither data nor a height prior, or the system is singular. A curve
    with no data of its own but a height is fitted on that alone."""
    sw, sw2, sx, sy, sxx, sxy, syy = sums
    k_mean, k_sd = k_prior
    theta_mean, theta_sd = theta_prior
    if sw <= 0 and height is None:
        return None
    # y = theta0 - k x: design row (1, -x).
    a11, a12, a22 = sw, -sx, sxx
    b1, b2 = sy, -sxy
    # Priors as precisions: on theta0 (a profile), on k, and on the height at x0 (the replicas').
    t_prec = 0.0 if math.isinf(theta_sd) else 1 / theta_sd**2
    q11, q12, q22 = t_prec, 0.0, 1 / k_sd**2
    s1, s2 = t_prec * theta_mean, k_mean / k_sd**2
    if height is not None:
        x0, y0, var0 = height
        q11, q12, q22 = q11 + 1 / var0, q12 - x0 / var0, q22 + x0 * x0 / var0
        s1, s2 = s1 + y0 / var0, s2 - x0 * y0 / var0
    # Noise from the weighted residuals of the plain fit (prior NOISE_PRIOR).
    sigma2 = NOISE_PRIOR**2
    for _ in range(2 if sw > 0 else 1):
        p11 = a11 / sigma2 + q11 + 1e-9
        p12 = a12 / sigma2 + q12
        p22 = a22 / sigma2 + q22
        r1 = b1 / sigma2 + s1
        r2 = b2 / sigma2 + s2
        det = p11 * p22 - p12 * p12
        if det <= 0:
            return None
        theta = (p22 * r1 - p12 * r2) / det
        k = (p11 * r2 - p12 * r1) / det
        if sw <= 0:
            break
        # Weighted residual sum of squares of y - (theta - k x).
        rss = syy - 2 * theta * sy + 2 * k * sxy + theta * theta * sw - 2 * theta * k * sx + k * k * sxx
        # The fit took some of the spread: divide by the weight left once its effective parameters
        # (2 less what the priors pin down: the trace of the posterior covariance times the
        # priors' precision) have taken their share of it, each sw2 / sw.
        dof = 2.0 - (p22 * q11 - 2 * p12 * q12 + p11 * q22) / det
        left = max(0.0, sw - dof * sw2 / sw)
        sigma2 = (max(0.0, rss) + NOISE_PSEUDO * NOISE_PRIOR**2) / (left + NOISE_PSEUDO)
    clamped = min(K_RANGE[1], max(K_RANGE[0], k))
    if clamped != k:
        # theta given the k kept, not the one the data asked for: the line still runs through
        # the data, where theta of the unclamped k put it off by (k - clamped) x.
        k, theta = clamped, (r1 - p12 * clamped) / p11
    return Fit(theta, k, p22 / det, -p12 / det, p11 / det, math.sqrt(sigma2))


def exp_or_inf(x: float) -> float:
    """exp(x), or infinity where it would overflow a float."""
    return math.exp(x) if x < 700.0 else math.inf
