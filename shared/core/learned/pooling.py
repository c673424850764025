"""What a node's containers share: replicas' curve heights, pooled slopes, the node's spells.

- Replicas (same model and batch) on one node run the same work: a curve's prior on its height is
  its replicas' (`pool_heights`), which places a newcomer before its first batch.
- A curve's prior on its slope is what the node's other containers show where their slopes are
  pinned down and agree (`pool_slopes`).
- Batches of several containers that lie off their curves together, on one side, are a spell of the
  host, not a drift of one curve (`node_spell`, read by the drift watch).
Both pools are random-effects means (DerSimonian-Laird spread), each curve's own estimate left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from shared.core.learned.curve import Curve, Deviation
from shared.core.learned.fit import Fit
from shared.core.learned.guards import OUTLIER_SD, batch_sd
from shared.core.learned.observe import cores_got
from shared.core.types import WORKLOAD_SEP, ContainerView

POOL_MIN = 3
"""Containers of a node whose slopes the data pins down before their slopes inform the others."""
POOL_PINNED = 0.5
"""A slope is pinned down when its posterior sd is at most this share of its prior's."""
HEIGHT_SPREAD_MIN = 0.05
"""Replicas' curves are never taken as closer than this (sd of log latency at one limit): work per
batch that replicas measured on one node differed by about this much (docs/design/learned.md)."""
HEIGHT_SPREAD_UNKNOWN = 0.2
"""How far apart replicas' curves are taken to be until two replicas of one workload have been seen."""
SPELL_SD = 2.0
"""The node's other containers, whose batches over a time lie this many standard errors off their
curves together, on one side, were slow (or fast) alike then."""
SPELL_RECENT = 64
"""How many of its latest batches' deviations a curve keeps for its neighbours' spell checks."""


def note_recent(v: ContainerView, curve: Curve, cores: float) -> None:
    """Before any curve takes this round's batches: how far each clean batch lies off its curve."""
    fit = curve.solve()
    if fit is None or curve.n < 3:
        return
    for b in v.batches:
        got = cores_got(b, v, curve, cores)[0] if b.clean else None
        pred = curve.predict(got) if got is not None else None
        if pred is None:
            continue
        z = (math.log(b.latency_s) - pred[0]) / batch_sd(fit, pred)
        curve.watch.recent.append(Deviation(b.finished_at_s - b.latency_s, b.finished_at_s, z))
    del curve.watch.recent[:-SPELL_RECENT]


def node_spell(curves: Mapping[str, Curve], name: str, start_s: float, end_s: float, side: float) -> bool:
    """Whether the node's other containers ran off their curves on `side` (+1 slow, -1 fast) too
    between start_s and end_s: each one's batches then, taken together, lie that far off in
    standard errors (the sum of their deviations over its square root: as rare by chance however
    many batches it ran); over those, at least two, they lie SPELL_SD standard errors off."""
    evidence = []
    for other, c in curves.items():
        if other == name:
            continue
        during = [z for b0, b1, z in c.watch.recent if b1 > start_s and b0 < end_s]
        if during:
            # Its batches then, taken together, in standard errors; none counts for more than an
            # outlier, so that one neighbour's own drift does not pass for the node's.
            evidence.append(min(OUTLIER_SD, sum(during) * side / math.sqrt(len(during))))
    return len(evidence) >= 2 and sum(evidence) >= SPELL_SD * math.sqrt(len(evidence))


def pool_slopes(curves: dict[str, Curve], own: Mapping[str, Fit | None] | None = None) -> None:
    """Set each curve's node prior on its slope from the others' pinned-down slopes.

    A random-effects pool: each pinned slope (its own data's posterior mean and variance) counts by
    1 / (its variance + the spread between containers); the prior is the pooled mean, as wide as the
    spread plus the mean's own variance. The spread is measured over every pinned slope, a curve's
    own included (one that differs widens everyone's prior, its own too); the mean leaves the curve's
    own slope out, so that it never informs its own prior. Fewer than POOL_MIN others: no node prior.
    """
    fits: Mapping[str, Fit | None] = own if own is not None else own_fits(curves)
    pinned: dict[str, tuple[float, float]] = {}
    for name, c in curves.items():
        f = fits[name]
        if f is not None and math.sqrt(f.var_k) <= POOL_PINNED * c.prior.k_sd:
            pinned[name] = (f.k, f.var_k)
    tau2 = (between_variance([list(pinned.values())]) or 0.0) if len(pinned) >= 2 else 0.0
    others_of = leave_one_out(pinned, tau2)
    for name, c in curves.items():
        pooled = others_of(name)
        prior = None
        if pooled is not None and pooled[2] >= POOL_MIN:
            prior = (pooled[0], math.sqrt(tau2 + pooled[1]))
        if prior != c.node.k:
            c.node.k = prior
            c.fit = None


def own_fits(curves: dict[str, Curve]) -> dict[str, Fit | None]:
    """Each curve's fit on its own data under its own prior on k: what it says by itself."""
    return {n: c.solve_memory(c.switch.long_active, own=True) for n, c in curves.items()}


def pool_heights(curves: dict[str, Curve], own: Mapping[str, Fit | None] | None = None) -> None:
    """Set each curve's prior on its height from its replicas on the node (same workload).

    Replicas run the same model on the same batch, kernel and CPUs, so where one has been seen the
    others' curves are known in part before they are seen at all. Per workload, every replica whose
    own data gives a fit (and whose curve never moved on its own) is read at x0, its group's
    precision-weighted mean log cores: (height, variance) there. A random-effects pool as for slopes:
    the spread of true heights between replicas (HEIGHT_SPREAD_MIN at least; HEIGHT_SPREAD_UNKNOWN
    until two replicas of some workload have been seen) is measured over every group, each curve's
    own height included; a curve's prior is the mean of the others in its group, as wide as that
    spread plus the mean's own variance. No replica seen: no prior.
    """
    alone: Mapping[str, Fit | None] = own if own is not None else own_fits(curves)
    members: dict[str, dict[str, tuple[Fit, Curve]]] = {}
    for n, c in curves.items():
        f = alone[n]
        if c.node.workload is not None and not c.node.solo and f is not None:
            members.setdefault(c.node.workload, {})[n] = (f, c)
    groups: dict[str, dict[str, tuple[float, float]]] = {}
    at: dict[str, float] = {}
    for workload in sorted(members):  # a fixed order: the same sums, to the last bit, every time
        fits = members[workload]
        xs = []
        for f, c in fits.values():
            sums = c.sums.long if c.switch.long_active else c.sums.short
            if sums[0] > 0:
                xs.append((sums[2] / sums[0], 1.0 / max(f.var_theta, 1e-12)))
        if not xs:
            continue
        x0 = sum(x * w for x, w in xs) / sum(w for _, w in xs)
        at[workload] = x0
        heights = {}
        for n, (f, c) in fits.items():
            pred = c.predict_x(x0, f)
            if pred is not None:
                heights[n] = (pred[0], max(pred[1] ** 2, 1e-12))
        groups[workload] = heights
    tau2 = between_variance([list(h.values()) for h in groups.values() if len(h) >= 2])
    if tau2 is None:
        tau2 = HEIGHT_SPREAD_UNKNOWN**2
    tau2 = max(tau2, HEIGHT_SPREAD_MIN**2)
    others_in = {key: leave_one_out(heights, tau2) for key, heights in groups.items()}
    for name, c in curves.items():
        prior = None
        key = None if c.node.solo else group_of(c.node.workload, groups)
        pooled = others_in[key](name) if key is not None else None
        if key is not None and pooled is not None:
            prior = (at[key], pooled[0], tau2 + pooled[1])
        if prior != c.node.height:
            c.node.height = prior
            c.fit = None


def group_of(workload: str | None, groups: dict[str, dict[str, tuple[float, float]]]) -> str | None:
    """The replicas' group of a workload: its own; for a model known only by its label (no batch
    reported yet), the one group of that model's replicas, if they all run one batch size."""
    if workload is None:
        return None
    if workload in groups or WORKLOAD_SEP in workload:
        return workload if workload in groups else None
    same = [g for g in groups if g.rpartition(WORKLOAD_SEP)[0] == workload]
    return same[0] if len(same) == 1 else None


def between_variance(groups: Sequence[Sequence[tuple[float, float]]]) -> float | None:
    """The variance of the true values between members, from (estimate, variance) pairs in groups, each
    group about its own mean: the DerSimonian-Laird moment estimate (what the estimates spread beyond
    their own variances), pooled over the groups. None: no group of two."""
    q = df = c = 0.0
    for est in groups:
        w = [1.0 / max(v, 1e-12) for _, v in est]
        sw = sum(w)
        mean = sum(wi * m for wi, (m, _) in zip(w, est, strict=True)) / sw
        q += sum(wi * (m - mean) ** 2 for wi, (m, _) in zip(w, est, strict=True))
        df += len(est) - 1
        c += sw - sum(wi * wi for wi in w) / sw
    if df == 0:
        return None
    return max(0.0, (q - df) / c) if c > 0 else 0.0


def leave_one_out(est: dict[str, tuple[float, float]],
                   tau2: float) -> Callable[[str], tuple[float, float, int] | None]:
    """For any curve: the random-effects mean of the (estimate, variance) pairs of `est` other than its
    own (each weighted by 1 / (variance + tau2)), that mean's variance, and how many others there are;
    None when there are none. The sums are taken once and each curve's own taken out again."""
    w = {n: 1.0 / (max(v, 1e-12) + tau2) for n, (_, v) in est.items()}
    sw = sum(w.values())
    swm = sum(w[n] * m for n, (m, _) in est.items())

    def others(name: str) -> tuple[float, float, int] | None:
        count = len(est) - (name in est)
        if count == 0:
            return None
        own_w, own_wm = (w[name], w[name] * est[name][0]) if name in est else (0.0, 0.0)
        rest = sw - own_w
        return (swm - own_wm) / rest, 1.0 / rest, count

    return others
