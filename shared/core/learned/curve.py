"""One container's curve: the sums its fit is solved from, its priors, and what it knows of itself.

A `Curve` holds its state in named parts: `Sums` (two memories of its observations, a half-life in
batches and a longer one in seconds), `Switch` (which memory the fit uses), `Prior` (its own priors
on slope and height), `NodeShare` (what the node's other containers say of it), `DriftWatch` (held-out
batches, and the curve before a restart, kept a few batches in case the move was a passing spell) and
`Timing`; besides them its ceiling (`sat_cores`), whether its threads follow its limit (`steps`) and,
for a server of requests, the CPU its request stream keeps busy (`Load`): an open-loop server's
latency follows the cores left over that load, not the limit itself (its requests queue as the
limit nears the load), so its line is fitted in the log of those spare cores.
It answers: the fit (`solve`, a `Fit`), the predicted log latency at a limit, and the least limit for
a latency. What observations it takes, and how, is `observe`'s; when it restarts is `guards`'.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from shared.core.learned.fit import K_PRIOR_SD, NOISE_PRIOR, Fit, exp_or_inf, solve_sums
from shared.core.profiles import whole_threads

BACK_SD = 2.0
"""After a restart, a batch within this many sd of the curve before it counts towards restoring it."""
RESTART_KEEP_N = 3
"""A curve restarted after at least this many observations keeps its slope as a prior, and itself as
the curve before the restart."""
RESTART_K_SD_MIN = 0.1
"""The narrowest prior sd on k a restarted curve keeps from its slope."""
RESTART_WATCH = 6
"""Batches after a restart during which the curve before it may be restored."""
STABLE_UTILISATION = 0.9
"""A request server is never left a limit its load would fill beyond this: under its load its queue
grows without end (requests time out, and its windows tell nothing more), met or not."""


class Suspect(NamedTuple):
    """A batch held out of the fit, beyond OUTLIER_SD, until the next says whether the curve moved."""

    resid: float
    """Its log latency less the curve's prediction."""
    x: float
    """log cores it ran at."""
    y: float
    """Its log latency."""
    w: float
    """Its weight."""
    start_s: float
    """When it started (NaN: not known)."""


class Deviation(NamedTuple):
    """How far one clean batch lay off its curve before the curve took it (for the node's spell check)."""

    start_s: float
    end_s: float
    z: float
    """Its deviation, in the sd a batch has about the curve's prediction."""


class Foresight(NamedTuple):
    """What each memory expected of the batches under the limit set last."""

    cores: float
    """The limit set last, in cores."""
    short: float
    """Mean log latency there by the memory in batches."""
    long: float
    """The same by the memory in seconds."""
    at_s: float
    """When it was foreseen."""


@dataclass(slots=True)
class Timing:
    """When a container's batches can next change a decision, and whether they are off their curve."""

    changed_at_s: float | None = None
    """When its limit was last changed."""
    last_clean_s: float | None = None
    """When the latest clean batch finished (verifies the latest change once after it)."""
    expect_at_s: float | None = None
    """When the next batch that tells something about the limit set last is due."""
    expected: tuple[float, float] | None = None
    """(mean log latency, tolerance) the curve gives at the limit set last: batches beyond it are strikes."""
    strikes: int = 0
    """Batches in a row beyond `expected`: two call a round at once."""
    batch_s: float | None = None
    """Its latest batch's latency: how soon the next one tells something."""


@dataclass(slots=True)
class Sums:
    """Decayed weighted sums over a curve's observations (x = log cores, y = log latency), in its two
    memories: the short one in batches (the fields) and the long one in seconds (`long`)."""

    sw: float = 0.0
    sw2: float = 0.0
    """Decayed sum of squared weights: with sw, how many observations the weights amount to."""
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0
    n: int = 0
    """Observations taken (not weighted)."""
    long: list[float] = field(default_factory=lambda: [0.0] * 7)
    """The same sums (sw, sw2, sx, sy, sxx, sxy, syy) over the longer memory (`half_life_s`)."""

    def add(self, x: float, y: float, w: float, decay: tuple[float, float]) -> None:
        """One observation into both memories; `decay` is what each keeps of its past."""
        d, dl = decay
        ls = self.long
        for i, v in enumerate((w, w * w, w * x, w * y, w * x * x, w * x * y, w * y * y)):
            ls[i] = ls[i] * (dl * dl if i == 1 else dl) + v
        self.sw = self.sw * d + w
        self.sw2 = self.sw2 * d * d + w * w
        self.sx = self.sx * d + w * x
        self.sy = self.sy * d + w * y
        self.sxx = self.sxx * d + w * x * x
        self.sxy = self.sxy * d + w * x * y
        self.syy = self.syy * d + w * y * y
        self.n += 1

    @property
    def short(self) -> list[float]:
        """The sums over the memory in batches, in the order of `long`."""
        return [self.sw, self.sw2, self.sx, self.sy, self.sxx, self.sxy, self.syy]

    def copy(self) -> Sums:
        """An independent copy (the long sums are a list)."""
        return dataclasses.replace(self, long=list(self.long))


@dataclass(slots=True)
class Switch:
    """Which memory the fit uses, and the evidence for the other (docs/design/learned.md, "Two memories")."""

    long_active: bool = False
    """The fit uses the longer memory: it foresaw this container's batches better."""
    foresight: Foresight | None = None
    """(limit set last, in cores; mean log latency there by the short memory; by the long one; when)."""
    evidence: float = 0.0
    """Decayed sum, over batches under the limit set last, of the short memory's squared error less
    the long one's: above SWITCH_EVIDENCE x `spread`, the long one foresaw them better."""
    spread: float = 0.0
    """Decayed sum of both memories' squared errors (the scale of `evidence`)."""


@dataclass(slots=True)
class Prior:
    """The curve's own priors on its line: from a calibrated profile, or kept from before a restart."""

    theta_mean: float = 0.0
    theta_sd: float = math.inf
    """Prior on theta0 (log CPU-seconds at one core); infinite: none."""
    k_mean: float = 1.0
    k_sd: float = K_PRIOR_SD
    """Prior on the slope k (a restart keeps what the curve had learnt of it)."""


@dataclass(slots=True)
class NodeShare:
    """What the node's other containers say of this curve, and whether they may."""

    k: tuple[float, float] | None = None
    """(mean, sd) of the slope the node's other containers show (docs/design/learned.md, "Slopes shared
    on a node"): the prior on k in place of the curve's own where it is narrower."""
    height: tuple[float, float, float] | None = None
    """(x0, mean, variance) of its log latency at log cores x0 as its replicas on the node show it (same
    model and batch; docs/design/learned.md, "Work shared by replicas"): a prior on its curve's height."""
    workload: str | None = None
    """What it runs (model and images per batch), as its batches report it; None: not known."""
    solo: bool = False
    """Its curve moved on its own (a drift restart): its replicas' curves no longer speak for it."""


@dataclass(slots=True)
class DriftWatch:
    """What the drift watch holds: batches held out, recent deviations, and the curve before a restart."""

    suspects: list[Suspect] = field(default_factory=list)
    """The latest batch beyond OUTLIER_SD, held out of the fit until the next one tells whether the
    curve moved: (residual, x, y, weight, when it started)."""
    recent: list[Deviation] = field(default_factory=list)
    """Its latest clean batches as its curve saw them before taking them: (start, end, deviation in
    sd), SPELL_RECENT at most; what its neighbours read to tell a node's spell from their own drift."""
    spell_held: int = 0
    """Restarts in a row not made because the node's other containers were off alike."""
    before: Curve | None = None
    """The curve as it was before the latest restart, while batches may still show it was right."""
    since_restart: int = 0
    """Batches since the latest restart (the curve before it is dropped after RESTART_WATCH)."""
    back: int = 0
    """Consecutive batches since the restart that the curve before it explains."""


@dataclass(slots=True)
class Load:
    """A request server's load: the CPU a request costs and the cores its request stream keeps busy."""

    cpu_per_request_s: float | None = None
    """CPU-seconds a request costs, averaged over windows its limit did not bind (None: not yet seen)."""
    cores: float = 0.0
    """The cores its current request rate keeps busy; 0 for a batch workload (its line is in the
    limit's own cores)."""


@dataclass(slots=True)
class Curve:
    """One container's fitted log-latency line and what it knows about its saturation."""

    sums: Sums = field(default_factory=Sums)
    """Its observations, in both memories."""
    switch: Switch = field(default_factory=Switch)
    """Which memory its fit uses."""
    prior: Prior = field(default_factory=Prior)
    """Its own priors on theta0 and k."""
    node: NodeShare = field(default_factory=NodeShare)
    """What the node's containers share with it (slope, replicas' height)."""
    sat_cores: float | None = None
    """Most cores the container has been seen able to use; None: no sign of a ceiling."""
    steps: bool = False
    """Its threads follow its limit and the policy reads them so: above one core, a limit gives only its
    whole cores (`at_limit`), and a need there is met by the next whole core (`limit_for`)."""
    watch: DriftWatch = field(default_factory=DriftWatch)
    """The drift watch's state (`guards`)."""
    fit: Fit | None = None
    """The last fit (cleared whenever its sums or priors change)."""
    timing: Timing = field(default_factory=Timing)
    """When its batches can next change a decision: the policy's reading, not the model's."""
    load: Load = field(default_factory=Load)
    """A request server's load (`observe.take_load`); none for a batch workload."""

    @property
    def n(self) -> int:
        """Observations taken since the latest restart (not weighted)."""
        return self.sums.n

    @property
    def noise(self) -> float:
        """The batch-to-batch noise (sd of log latency): the fit's own, over its decayed window."""
        f = self.solve()
        return f.noise_sd if f is not None else NOISE_PRIOR

    def add(self, x: float, y: float, w: float, decay: tuple[float, float]) -> None:
        """One observation into both memories; `decay` is what each keeps of its past."""
        self.sums.add(x, y, w, decay)
        self.fit = None

    def restart(self) -> None:
        """Forget every observation (the curve moved); keep what was learnt of k as a prior, and the
        curve itself for a few batches, in case the move was a passing slow spell."""
        f = self.solve()
        watch, prior = self.watch, self.prior
        watch.before = (dataclasses.replace(self, sums=self.sums.copy(), switch=dataclasses.replace(self.switch),
                                            prior=dataclasses.replace(prior), node=dataclasses.replace(self.node),
                                            watch=DriftWatch(), timing=Timing())
                        if f is not None and self.sums.n >= RESTART_KEEP_N else None)
        watch.since_restart = watch.back = watch.spell_held = 0
        if f is not None and self.sums.n >= RESTART_KEEP_N:
            prior.k_mean, prior.k_sd = f.k, max(RESTART_K_SD_MIN, math.sqrt(f.var_k))
        self.sums = Sums()
        self.switch.foresight = None
        prior.theta_sd = math.inf
        self.node.solo, self.node.height = True, None
        watch.suspects.clear()
        self.fit = None

    def check_back(self, x: float, y: float) -> None:
        """After a restart: restore the curve before it once two batches in a row land where it put
        them (the slow spell that set the restart off has passed)."""
        watch = self.watch
        old = watch.before
        if old is None:
            return
        watch.since_restart += 1
        pred, fit = old.predict_x(x), old.solve()
        if pred is not None and fit is not None and abs(y - pred[0]) <= BACK_SD * max(fit.noise_sd, NOISE_PRIOR):
            watch.back += 1
        else:
            watch.back = 0
        if watch.back >= 2:
            # Its sums and own priors, and whether it stands alone; not what the node gives it now.
            self.sums, self.prior, self.node.solo = old.sums, old.prior, old.node.solo
            watch.before, self.fit = None, None
        elif watch.since_restart >= RESTART_WATCH:
            watch.before = None

    def solve(self) -> Fit | None:
        """Posterior of (theta0, k) and the noise sd, or None with no observation at all."""
        if self.fit is None:
            self.fit = self.solve_memory(self.switch.long_active)
        return self.fit

    def k_prior(self) -> tuple[float, float]:
        """(mean, sd) of the prior on k in use: the node's where it is narrower than the curve's own."""
        prior, node_k = self.prior, self.node.k
        if node_k is not None and node_k[1] < prior.k_sd:
            return node_k
        return prior.k_mean, prior.k_sd

    def solve_memory(self, long: bool, own: bool = False) -> Fit | None:
        """The fit over the short memory (half-life in batches) or the long one (`half_life_s`); with
        `own`, its own data under its own prior on k alone (what it says by itself, for the node's pools).
        A curve with no data of its own but a height from its replicas is fitted on that alone."""
        prior = self.prior
        return solve_sums(self.sums.long if long else self.sums.short,
                          (prior.k_mean, prior.k_sd) if own else self.k_prior(),
                          (prior.theta_mean, prior.theta_sd), None if own else self.node.height)

    def at_limit(self, limit_cores: float) -> float:
        """The cores a batch can use under this limit: the limit, or with threads that follow it, the
        whole cores of a limit above one (a limit of 1.6 runs one thread)."""
        if self.steps and limit_cores > 1.0:
            return float(whole_threads(limit_cores))
        return limit_cores

    def limit_for(self, cores: float) -> float:
        """The least limit (cores) under which a batch can use `cores`: itself, or with threads that
        follow the limit, the next whole core above one."""
        if self.steps and cores > 1.0 + 1e-9 and math.isfinite(cores):
            return float(math.ceil(cores - 1e-9))
        return cores

    def snap(self, limit: float, cores: float, floor: float) -> float:
        """A limit (fraction of a node of `cores`) cut to the whole cores its threads can use above one
        (never below `floor`); unchanged where threads do not follow the limit."""
        if not self.steps:
            return limit
        return max(floor, min(limit, self.at_limit(limit * cores) / cores))

    def predict_limit(self, limit_cores: float, fit: Fit | None = None) -> tuple[float, float] | None:
        """`predict` under a limit of `limit_cores` (what its threads can use of it)."""
        return self.predict(self.at_limit(limit_cores), fit)

    def predict(self, cores: float, fit: Fit | None = None) -> tuple[float, float] | None:
        """(mean, model sd) of log latency with `cores` (by `fit`, else the curve's own), or None before
        any observation."""
        f = fit or self.solve()
        if f is None:
            return None
        c = min(cores, self.sat_cores) if self.sat_cores is not None else cores
        if self.load.cores:
            c -= self.load.cores  # the spare cores over its load; none: its queue grows without end
        return f.mean_sd(math.log(max(c, 1e-6)))

    def least_limit(self, cores: float) -> float:
        """The least limit (fraction of a node of `cores`) a request server's queue drains under: its
        load at STABLE_UTILISATION; 0 for a batch workload."""
        return self.load.cores / STABLE_UTILISATION / cores if self.load.cores else 0.0

    def predict_x(self, x: float, fit: Fit | None = None) -> tuple[float, float] | None:
        """`predict` at a point of the line itself (an observation's x: log cores, or for a request
        server log of the cores spare over its load)."""
        if not self.load.cores:
            return self.predict(math.exp(x), fit)
        f = fit or self.solve()
        return None if f is None else f.mean_sd(x)

    def cores_for(self, latency_s: float, z: float) -> float | None:
        """Least limit (cores) whose latency, with z model sds of margin, is at most `latency_s`.

        math.inf when even the saturation point is too slow, or when the fit asks for more cores
        than a float holds (a wild first fit); None before any observation. With threads that
        follow the limit, a need above one core is the next whole core.
        """
        f = self.solve()
        if f is None:
            return None
        theta, k = f.theta, f.k
        target = math.log(latency_s)
        load = self.load.cores  # a request server needs its load and the spare cores on top
        c = load + exp_or_inf((theta - target) / k)
        for _ in range(3):  # the margin depends (weakly) on where it is evaluated
            if not math.isfinite(c):
                return math.inf
            pred = self.predict(c)
            assert pred is not None
            c = load + exp_or_inf((theta + z * pred[1] - target) / k)
        if self.sat_cores is not None and c > self.sat_cores * 1.02:
            return math.inf
        return self.limit_for(c)


