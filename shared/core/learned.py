"""`learned`: learn each container's latency curve online, then solve for the best allocation.

Why: DQoES moves CPU a fixed fraction at a time on one batch's latency, so it
settles in tens of rounds, freezes when every container is late (R_G = 0)
and counts throttling fast containers into their band as a success. This
policy keeps a model of each container's batch latency as a function of the
CPU it gets, learned from what the worker already observes (each batch's
latency, the CPU it used, the limit it ran under), and every round chooses
the limits that make the most containers meet their objective, then the
most land in their band, then spend the least CPU, within the node.

The model (docs/design/learned.md):

- below the container's saturation, log L = theta0 - k log c: a power law in
  the cores c it gets (k = 1 is "work / cores"; real quotas cost extra CPU at
  small limits, k > 1). Fitted by weighted Bayesian linear regression in
  (log c, log L) with a prior k ~ N(1, 0.35^2), narrowed to the slope the node's other
  containers show where theirs are pinned down and agree (`pool_slopes`), a prior on the curve's
  height from its replicas on the node (same model and batch; `pool_work`), which places a newcomer
  before its first batch, and, only when asked (`use_prior`), a prior on theta0 from a calibrated
  profile;
- c for a batch is its limit when the limit bound it (the batch used at least
  BINDING of it), else the CPU it actually got (CPU-seconds / latency);
- a container that got less than its limit while the node had idle CPU is
  saturated (threads, I/O): more CPU beyond what it used does not help;
- a container whose threads follow its limit (its batches say so) runs floor(limit)
  of them above one core: it is read at, predicted at and given whole cores there;
- a batch that straddled a limit change is read as the batch it would have
  been under the new limit (or dropped when a limit did not hold it), the first batch (warm-up)
  counts a little, older batches fade (half-life in batches; a second memory
  of at least `half_life_s` seconds is used instead while it foresees the
  container's batches better), outliers are
  down-weighted, and two consecutive batches far off the curve on the same
  side mean the curve moved (drift): the model restarts from them.

The solver, each round: a container's cheapest limit to be met is where its
fitted curve reaches the band's slow edge less 1.5 noise sd (with the fit's
uncertainty as a margin), or its aim if that is cheaper; its aim is the limit
where its next batch is most often met plus in band, given the measured
noise and what the fit does not know yet (so a container whose noise is as
wide as its band is aimed inside the band, not past its fast edge).
Containers faster than their band even at the floor get the floor (met, not
in band). The rest are taken cheapest first while the node has room (one
unit of value each: this maximises the count for the model), and room left
moves them to their aims. What is still left goes whole to one container
left out for room when that is worth more, in expected met + in band, than
an equal split; the others left out and those that cannot meet their
objective even alone get a fair best effort from what remains, never less
than the floor. Limits move only past a dead band; the next round comes when
the next informative batch is due, backing off when nothing is.
(`expected_aim = 0` gives the earlier aim: the slow-edge margin, then the
band's centre.) With `late_rescue` (off by default), a running batch that,
by how long it has run, is likely to end past its band's slow edge gets more
CPU for the rest of it, from what no limit holds and from containers that
cannot be met; the raise is laid over the plan and undone when the batch
ends, and aims count on the share of late batches the node's rescues have
brought into their band.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from shared.core.classification import classify_views
from shared.core.dqoes import floor_limit
from shared.core.measures import band_chances, normal_cdf
from shared.core.policy import (
    BaseParams,
    CurveLookup,
    PolicyBase,
    PolicySpec,
    build_decision,
    check_interval,
    check_total_resource,
    no_curves,
)
from shared.core.profiles import ModelProfile, whole_threads
from shared.core.types import (
    WORKLOAD_SEP,
    BatchObs,
    ContainerView,
    Decision,
    NodeView,
    is_met,
    is_satisfied,
)

BINDING = 0.85
"""A batch that used at least this share of its limit was held by it."""
K_PRIOR_SD = 0.35
K_RANGE = (0.3, 3.0)
NOISE_PRIOR = 0.05
"""Prior standard deviation of log latency between batches (weight NOISE_PSEUDO batches)."""
NOISE_PSEUDO = 2.0
OUTLIER_SD = 3.0
"""A batch further than this many standard deviations from the curve is suspect."""
WARMUP_WEIGHT = 0.3
PRIOR_THETA_SD = 0.35
"""How far (log) a calibrated profile's work per batch may be off when used as a prior."""
MAX_STEP_UNCERTAIN = 2.0
"""While the fit is uncertain a limit moves at most by this factor a round."""
UNCERTAIN_SD = 0.25
BEST_EFFORT_DEAD_BAND = 0.25
"""A container that cannot be met keeps its share unless it would move by more than this."""
BACK_SD = 2.0
"""After a restart, a batch within this many sd of the curve before it counts towards restoring it."""
RESTART_WATCH = 6
"""Batches after a restart during which the curve before it may be restored."""
SPELL_SD = 2.0
"""The node's other containers, whose batches over a time lie this many standard errors off their
curves together, on one side, were slow (or fast) alike then."""
SPELL_RECENT = 64
"""How many of its latest batches' deviations a curve keeps for its neighbours' spell checks."""
FEW_BATCHES = 4
"""A curve with fewer observations than this is still being learnt: rounds follow its batches."""
TARGET_GRID = 48
"""Limits tried between the floor and the cap when aiming a container (geometric)."""
TARGET_FINE = 17
"""Limits tried between the two grid neighbours of the best, to place the aim within about 1 %."""
VALUE_DEAD_BAND = 0.05
"""A move of an aimed container that raises its P(met) + P(in band) by less than this is not made."""
CHANCE_MARGIN = 0.1
"""How much more (in P(met) + P(in band)) than an equal split a new holder of what is left must gain."""
_NORMAL = NormalDist()
LATE_CHANCE = 0.3
"""A running batch of an aimed container is late once, given how long it has run, it ends past its
band's slow edge with at least this chance (`late_rescue`)."""
RESCUE_STEP = 4.0
"""A late batch's limit is raised at most this many times for the rest of it."""
RESCUE_MIN_S = 1.0
"""The least time before the band's slow edge a rescue acts in: a limit takes effect within a CFS
period (0.1 s) and a `docker update` in about as long; an order above both, so a round that comes
too late to bring a short batch in does not move limits for nothing."""
RESCUE_PRIOR = (1.0, 2.0)
"""With `late_rescue`, what an aim counts on before any rescue is seen: of the aimed containers'
batches that turn late, the share brought into their band, as (in band + 1) / (late + 2) of a uniform
prior: one half. Each node then counts its own (`LearnedPolicy.rescued`)."""
SAT_PROBE = 1.5
"""A container that cannot be met may get this many times its seen ceiling (room to show more);
above 1 / (1 - BEST_EFFORT_DEAD_BAND), so the probe is never held back by the dead band."""
TOO_FAST_SLACK = 3.0
"""A container faster than its band at the floor, once set or kept at a limit as such, keeps it while
it is at most this many floors: the floor falls as a node fills (1/(2|C|)), and one that chased it was
trimmed at each arrival. What it holds over its plan is taken back (largest holdings first) before
any plan is cut."""
TOO_FAST_FIRST = 1.5
"""The same before it is held as too fast: a newcomer's share past this many floors is trimmed."""
POOL_MIN = 3
"""Containers of a node whose slopes the data pins down before their slopes inform the others."""
POOL_PINNED = 0.5
"""A slope is pinned down when its posterior sd is at most this share of its prior's."""
HEIGHT_SPREAD_MIN = 0.05
"""Replicas' curves are never taken as closer than this (sd of log latency at one limit): work per
batch that replicas measured on one node differed by about this much (docs/design/learned.md)."""
HEIGHT_SPREAD_UNKNOWN = 0.2
"""How far apart replicas' curves are taken to be until two replicas of one workload have been seen."""
SWITCH_EVIDENCE = 0.02
"""A container's fit changes memory once the other foresaw its batches better by this share of both
memories' squared errors (about 4 % of the mean squared error)."""


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
    confidence_z: float = 1.0
    """Margin, in standard deviations of the fitted curve, added to every container's need."""
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
    expected_aim: float = 1.0
    """1: aim each container where its next batch is most often met and in band under the measured
    noise, and give what is left to one left out for room where that is worth more than an equal split;
    0: the slow edge less 1.5 noise sd, then the band's centre as room allows (the earlier aim)."""
    spell_guard: float = 1.0
    """1: two batches off a curve on the side the node's other containers' batches then lie off too,
    taken together (a slow spell of the host, not a drift of one curve), do not restart it; it is
    waited out for as many batches as a restart is watched (docs/design/learned.md, "Spells shared by a
    node"); 0: they do."""
    late_rescue: float = 0.0
    """1: a running batch of a container aimed at its band that, by how long it has run, is likely to
    end past the band's slow edge gets more CPU for the rest of it, from what no limit holds and from
    containers that cannot be met, and its limit returns once the batch ends; aims count on it
    (docs/design/learned.md, "Late batches"); 0: limits follow the plan only."""
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
                             ("confidence_z", 0.0, 5.0),
                             ("dead_band", 0.0, 0.5), ("best_effort_share", 0.0, 10.0), ("use_prior", 0.0, 1.0), ("pool_slopes", 0.0, 1.0),
                             ("pool_work", 0.0, 1.0),
                             ("expected_aim", 0.0, 1.0), ("thread_steps", 0.0, 1.0), ("spell_guard", 0.0, 1.0),
                             ("late_rescue", 0.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and lo <= v <= hi):
                raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], got {v!r}")


@dataclass(slots=True)
class Curve:
    """One container's fitted log-latency line and what it knows about its saturation."""

    # Decayed weighted sums over observations (x = log cores, y = log latency).
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
    long_sums: list[float] = field(default_factory=lambda: [0.0] * 7)
    """The same sums (sw, sw2, sx, sy, sxx, sxy, syy) over the longer memory (`half_life_s`)."""
    long_active: bool = False
    """The fit uses the longer memory: it foresaw this container's batches better."""
    foresight: tuple[float, float, float, float] | None = None
    """(limit set last, in cores; mean log latency there by the short memory; by the long one; when)."""
    evidence: float = 0.0
    """Decayed sum, over batches under the limit set last, of the short memory's squared error less
    the long one's: above SWITCH_EVIDENCE x `spread`, the long one foresaw them better."""
    spread: float = 0.0
    """Decayed sum of both memories' squared errors (the scale of `evidence`)."""
    theta_mean: float = 0.0
    theta_sd: float = math.inf
    """Prior on theta0 (log CPU-seconds at one core); infinite: none."""
    k_mean: float = 1.0
    k_sd: float = K_PRIOR_SD
    k_node: tuple[float, float] | None = None
    """(mean, sd) of the slope the node's other containers show (docs/design/learned.md, "Slopes shared
    on a node"): the prior on k in place of (k_mean, k_sd) where it is narrower."""
    height_node: tuple[float, float, float] | None = None
    """(x0, mean, variance) of its log latency at log cores x0 as its replicas on the node show it (same
    model and batch; docs/design/learned.md, "Work shared by replicas"): a prior on its curve's height."""
    workload: str | None = None
    """What it runs (model and images per batch), as its batches report it; None: not known."""
    solo: bool = False
    """Its curve moved on its own (a drift restart): its replicas' curves no longer speak for it."""
    sat_cores: float | None = None
    """Most cores the container has been seen able to use; None: no sign of a ceiling."""
    steps: bool = False
    """Its threads follow its limit and the policy reads them so: above one core, a limit gives only its
    whole cores (`at_limit`), and a need there is met by the next whole core (`limit_for`)."""
    suspects: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    """The latest batch beyond OUTLIER_SD, held out of the fit until the next one tells whether the
    curve moved (drift watch): (residual, x, y, weight, when it started)."""
    recent: list[tuple[float, float, float]] = field(default_factory=list)
    """Its latest clean batches as its curve saw them before taking them: (start, end, deviation in
    sd), SPELL_RECENT at most; what its neighbours read to tell a node's spell from their own drift."""
    spell_held: int = 0
    """Restarts in a row not made because the node's other containers were off alike."""
    fit: tuple[float, float, float, float, float, float] | None = None
    """(theta0, k, var theta0, cov, var k, noise sd) of the last fit."""
    changed_at_s: float | None = None
    last_clean_s: float | None = None
    """When the latest clean batch finished (verifies the latest change once after it)."""
    expect_at_s: float | None = None
    """When the next batch that tells something about the limit set last is due."""
    expected: tuple[float, float] | None = None
    """(mean log latency, tolerance) the curve gives at the limit set last: batches beyond it are strikes."""
    strikes: int = 0
    batch_s: float | None = None
    """Its latest batch's latency: how soon the next one tells something."""
    before: Curve | None = None
    """The curve as it was before the latest restart, while batches may still show it was right."""
    since_restart: int = 0
    back: int = 0
    """Consecutive batches since the restart that the curve before it explains."""
    last_end_s: float | None = None
    """When its latest batch (clean or not) finished: when the batch running now started."""

    @property
    def noise(self) -> float:
        """The batch-to-batch noise (sd of log latency): the fit's own, over its decayed window."""
        f = self.solve()
        return f[5] if f is not None else NOISE_PRIOR

    def add(self, x: float, y: float, w: float, decay: tuple[float, float]) -> None:
        """One observation into both memories; `decay` is what each keeps of its past."""
        d, dl = decay
        ls = self.long_sums
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
        self.fit = None

    def restart(self) -> None:
        """Forget every observation (the curve moved); keep what was learnt of k as a prior, and the
        curve itself for a few batches, in case the move was a passing slow spell."""
        f = self.solve()
        self.before = (dataclasses.replace(self, suspects=[], recent=[], before=None, long_sums=list(self.long_sums))
                       if f is not None and self.n >= 3 else None)
        self.since_restart = self.back = self.spell_held = 0
        if f is not None and self.n >= 3:
            self.k_mean, self.k_sd = f[1], max(0.1, math.sqrt(f[4]))
        self.sw = self.sw2 = self.sx = self.sy = self.sxx = self.sxy = self.syy = 0.0
        self.long_sums = [0.0] * 7
        self.foresight = None
        self.n = 0
        self.theta_sd = math.inf
        self.solo, self.height_node = True, None
        self.suspects.clear()
        self.fit = None

    def check_back(self, x: float, y: float) -> None:
        """After a restart: restore the curve before it once two batches in a row land where it put
        them (the slow spell that set the restart off has passed)."""
        old = self.before
        if old is None:
            return
        self.since_restart += 1
        pred, fit = old.predict(math.exp(x)), old.solve()
        if pred is not None and fit is not None and abs(y - pred[0]) <= BACK_SD * max(fit[5], NOISE_PRIOR):
            self.back += 1
        else:
            self.back = 0
        if self.back >= 2:
            for name in ("sw", "sw2", "sx", "sy", "sxx", "sxy", "syy", "n", "theta_mean", "theta_sd", "k_mean", "k_sd",
                         "long_sums", "solo"):
                setattr(self, name, getattr(old, name))
            self.before, self.fit = None, None
        elif self.since_restart >= RESTART_WATCH:
            self.before = None

    def solve(self) -> tuple[float, float, float, float, float, float] | None:
        """Posterior of (theta0, k) and the noise sd, or None with no observation at all."""
        if self.fit is None:
            self.fit = self.solve_memory(self.long_active)
        return self.fit

    @property
    def short_sums(self) -> list[float]:
        """The sums over the memory in batches, in the order of `long_sums`."""
        return [self.sw, self.sw2, self.sx, self.sy, self.sxx, self.sxy, self.syy]

    def k_prior(self) -> tuple[float, float]:
        """(mean, sd) of the prior on k in use: the node's where it is narrower than the curve's own."""
        if self.k_node is not None and self.k_node[1] < self.k_sd:
            return self.k_node
        return self.k_mean, self.k_sd

    def solve_memory(self, long: bool, own: bool = False) -> tuple[float, float, float, float, float, float] | None:
        """The fit over the short memory (half-life in batches) or the long one (`half_life_s`); with
        `own`, its own data under its own prior on k alone (what it says by itself, for the node's pools).
        A curve with no data of its own but a height from its replicas is fitted on that alone."""
        sw, sw2, sx, sy, sxx, sxy, syy = self.long_sums if long else self.short_sums
        k_mean, k_sd = (self.k_mean, self.k_sd) if own else self.k_prior()
        height = None if own else self.height_node
        if sw <= 0 and height is None:
            return None
        # y = theta0 - k x: design row (1, -x).
        a11, a12, a22 = sw, -sx, sxx
        b1, b2 = sy, -sxy
        # Priors as precisions: on theta0 (a profile), on k, and on the height at x0 (the replicas').
        t_prec = 0.0 if math.isinf(self.theta_sd) else 1 / self.theta_sd**2
        q11, q12, q22 = t_prec, 0.0, 1 / k_sd**2
        s1, s2 = t_prec * self.theta_mean, k_mean / k_sd**2
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
        return (theta, k, p22 / det, -p12 / det, p11 / det, math.sqrt(sigma2))

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

    def predict_limit(self, limit_cores: float, fit: tuple[float, ...] | None = None) -> tuple[float, float] | None:
        """`predict` under a limit of `limit_cores` (what its threads can use of it)."""
        return self.predict(self.at_limit(limit_cores), fit)

    def predict(self, cores: float, fit: tuple[float, ...] | None = None) -> tuple[float, float] | None:
        """(mean, model sd) of log latency with `cores` (by `fit`, else the curve's own), or None before
        any observation."""
        f = fit or self.solve()
        if f is None:
            return None
        theta, k, v11, v12, v22, _ = f
        c = min(cores, self.sat_cores) if self.sat_cores is not None else cores
        x = math.log(max(c, 1e-6))
        var = v11 - 2 * x * v12 + x * x * v22  # h = (1, -x): var = h V h
        return theta - k * x, math.sqrt(max(0.0, var))

    def cores_for(self, latency_s: float, z: float) -> float | None:
        """Least limit (cores) whose latency, with z model sds of margin, is at most `latency_s`.

        math.inf when even the saturation point is too slow, or when the fit asks for more cores
        than a float holds (a wild first fit); None before any observation. With threads that
        follow the limit, a need above one core is the next whole core.
        """
        f = self.solve()
        if f is None:
            return None
        theta, k, *_ = f
        target = math.log(latency_s)
        c = _exp_or_inf((theta - target) / k)
        for _ in range(3):  # the margin depends (weakly) on where it is evaluated
            if not math.isfinite(c):
                return math.inf
            pred = self.predict(c)
            assert pred is not None
            c = _exp_or_inf((theta + z * pred[1] - target) / k)
        if self.sat_cores is not None and c > self.sat_cores * 1.02:
            return math.inf
        return self.limit_for(c)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the solver decided for one container this round."""

    limit: float
    kind: str
    """in band | too fast | best effort | unachievable | learning"""
    need: float | None = None


class LearnedPolicy(PolicyBase):
    """Learned latency curves, a count-maximising solve each round, event-driven rounds."""

    name = "learned"

    def __init__(self, params: LearnedParams | None = None, curve_of: CurveLookup = no_curves) -> None:
        self.params = params or LearnedParams()
        self.curve_of = curve_of
        self.curves: dict[str, Curve] = {}
        self.chosen: set[str] = set()
        """Containers the last round gave what they need to be met."""
        self._interval_s = self.params.initial_interval_s
        self.chances: set[str] = set()
        """Containers not met for sure (left out for room, or at their edge) that were given what
        was left last round for a chance at their band."""
        self.fast_held: dict[str, float] = {}
        """Containers too fast at the floor, and the limit they were last set or kept at as such."""
        self.rescues: dict[str, tuple[float, float]] = {}
        """Containers whose running batch was late and got more CPU: (when that batch started, its limit)."""
        self.before_rescue: dict[str, float] = {}
        """Limits a rescue moved (the late container's and those it took from), as the plan had them."""
        self._late_at: list[float] = []
        """When aimed containers' running batches turn late if they have not ended by then."""
        self.rescued = list(RESCUE_PRIOR)
        """(rescued batches that ended in their band, batches that turned late) on this node, from the
        prior: aimed containers' batches rescued, and those that ended past the slow edge unrescued."""

    def set_params(self, params: LearnedParams) -> None:
        self.params = params
        self._interval_s = params.initial_interval_s

    def wants_round(self, name: str, latency_s: float, now_s: float) -> bool:
        """Two batches in a row far off the curve at their limit: the curve moved, decide now."""
        if name in self.rescues:
            return True  # its late batch (or a later one) ended: its limit returns to the plan now
        c = self.curves.get(name)
        if c is None or c.expected is None:
            return False
        mean, tol = c.expected
        c.strikes = c.strikes + 1 if abs(math.log(latency_s) - mean) > tol else 0
        if c.strikes >= 2:
            c.strikes = 0
            c.expected = None  # once per change: the round that follows re-fits
            return True
        return False

    # -- learning ------------------------------------------------------------------------

    def _curve(self, name: str) -> Curve:
        c = self.curves.get(name)
        if c is None:
            c = Curve()
            prior = self.curve_of(name) if self.params.use_prior >= 0.5 else None
            if prior is not None:
                c.theta_mean, c.theta_sd = _prior_theta(prior), PRIOR_THETA_SD
                c.sat_cores = float(prior.threads)
            self.curves[name] = c
        return c

    def _observe(self, v: ContainerView, curve: Curve, cores: float, node_busy: float) -> None:
        guard = self.params.spell_guard >= 0.5
        for b in v.batches:
            self._tally_rescue(v, b)
            curve.last_end_s = max(curve.last_end_s or -math.inf, b.finished_at_s)
            decay = self._decay(b.latency_s)
            spell = None
            if guard:
                def spell(start_s: float, side: float, end_s: float = b.finished_at_s, me: str = v.name) -> bool:
                    return self._node_spell(me, start_s, end_s, side)
            if not b.clean:
                self._observe_straddled(b, curve, cores, decay, spell)
                continue
            _weigh_memories(curve, b, cores, decay[1], self.params.initial_interval_s)
            curve.last_clean_s = b.finished_at_s
            curve.batch_s = b.latency_s
            got, held, rate = _got(b, v, curve, cores)
            if got is None:
                continue
            if held:
                if rate is not None and curve.sat_cores is not None and rate > curve.sat_cores:
                    curve.sat_cores = None  # it used more than its ceiling: the ceiling was wrong
            elif rate is not None and b.index > 0:
                limit_cores = _limit_cores(b, curve, cores)
                if _may_show_ceiling(limit_cores) and _had_room(node_busy, cores, limit_cores, rate):
                    # It left CPU it could have had unused: a ceiling of its own (a warm-up
                    # batch, which loads the model, says nothing about it).
                    curve.sat_cores = max(curve.sat_cores or 0.0, rate * 1.05)
            _take(curve, math.log(got), math.log(b.latency_s), WARMUP_WEIGHT if b.index == 0 else 1.0, decay,
                  b.finished_at_s - b.latency_s, spell)

    def _note_recent(self, v: ContainerView, curve: Curve, cores: float) -> None:
        """Before any curve takes this round's batches: how far each clean batch lies off its curve."""
        fit = curve.solve()
        if fit is None or curve.n < 3:
            return
        for b in v.batches:
            got = _got(b, v, curve, cores)[0] if b.clean else None
            pred = curve.predict(got) if got is not None else None
            if pred is None:
                continue
            z = (math.log(b.latency_s) - pred[0]) / _batch_sd(fit, pred)
            curve.recent.append((b.finished_at_s - b.latency_s, b.finished_at_s, z))
        del curve.recent[:-SPELL_RECENT]

    def _node_spell(self, name: str, start_s: float, end_s: float, side: float) -> bool:
        """Whether the node's other containers ran off their curves on `side` (+1 slow, -1 fast) too
        between start_s and end_s: each one's batches then, taken together, lie that far off in
        standard errors (the sum of their deviations over its square root: as rare by chance however
        many batches it ran); over those, at least two, they lie SPELL_SD standard errors off."""
        evidence = []
        for other, c in self.curves.items():
            if other == name:
                continue
            during = [z for b0, b1, z in c.recent if b1 > start_s and b0 < end_s]
            if during:
                # Its batches then, taken together, in standard errors; none counts for more than an
                # outlier, so that one neighbour's own drift does not pass for the node's.
                evidence.append(min(OUTLIER_SD, sum(during) * side / math.sqrt(len(during))))
        return len(evidence) >= 2 and sum(evidence) >= SPELL_SD * math.sqrt(len(evidence))

    def _decay(self, latency_s: float) -> tuple[float, float]:
        """What each memory (in batches; in seconds) keeps of its past as one more batch of `latency_s`
        comes in."""
        p = self.params
        per_batch = 1.0 / p.half_life_batches
        return 0.5**per_batch, 0.5 ** (min(per_batch, latency_s / p.half_life_s) if p.half_life_s > 0 else per_batch)

    @staticmethod
    def _observe_straddled(b: BatchObs, curve: Curve, cores: float, decay: tuple[float, float],
                           spell: Callable[[float, float], bool] | None = None) -> None:
        """A batch that ran partly under the previous limit, read as the batch it would have been.

        With t1 seconds under c1 cores and t2 under c2, its work would have taken
        t1 (c1/c2)^k + t2 under c2 alone; c1 is the cores the batch used before the
        change (its CPU-seconds less c2 t2, over t1), not the limit then. Used only when both
        limits held the batch (it used at least BINDING of what it was allowed), weighted by the
        share it spent under the new limit: one batch sooner to see a change. `spell`: as for `_take`.
        """
        if b.limit is None or b.prev_limit is None or b.cpu_s is None:
            return
        start = b.finished_at_s - b.latency_s
        t1, t2 = b.since_s - start, b.finished_at_s - b.since_s
        if t1 <= 0 or t2 <= 0:
            return
        c1, c2 = curve.at_limit(b.prev_limit * cores), curve.at_limit(b.limit * cores)
        if b.cpu_s < BINDING * (c1 * t1 + c2 * t2):
            return
        # The first part may itself have run under several limits (a newcomer's share halved twice
        # within one long batch): what it used there, net of the second part, says how many cores it
        # had on average, where the last limit before the change alone would misread it.
        used_before = (b.cpu_s - c2 * t2) / t1
        if used_before <= 0:
            return
        fit = curve.solve()
        k = fit[1] if fit is not None else curve.k_mean
        equiv = t1 * (used_before / c2) ** k + t2
        _take(curve, math.log(c2), math.log(equiv), 0.5 * t2 / b.latency_s, decay, start, spell)

    # -- deciding ------------------------------------------------------------------------

    def decide(self, view: NodeView) -> Decision:
        p = self.params
        cl = classify_views(view.containers)
        cores = view.cores
        present = {v.name for v in view.containers}
        for gone in [n for n in self.curves if n not in present]:
            del self.curves[gone]
        busy = sum(v.cpu_share or 0.0 for v in view.containers)
        for v in view.containers:
            curve = self._curve(v.name)
            curve.workload = v.workload or curve.workload
            curve.steps = v.follows_limit and p.thread_steps >= 0.5
            if p.spell_guard >= 0.5:
                self._note_recent(v, curve, cores)
        for v in view.containers:
            self._observe(v, self.curves[v.name], cores, busy)
        own = _own_fits(self.curves)
        if p.pool_slopes >= 0.5:
            _pool_slopes(self.curves, own)
        else:  # turned off at runtime: no curve keeps the node's prior it had
            for c in self.curves.values():
                if c.k_node is not None:
                    c.k_node, c.fit = None, None
        if p.pool_work >= 0.5:
            _pool_heights(self.curves, own)
        else:
            for c in self.curves.values():
                if c.height_node is not None:
                    c.height_node, c.fit = None, None
        for name, (start, _) in list(self.rescues.items()):
            rescued = self.curves.get(name)
            if rescued is None or rescued.last_end_s is None or rescued.last_end_s > start:
                del self.rescues[name]
        plans = self._solve(view.containers, cores)
        floor = floor_limit(len(view.containers))
        proposal: dict[str, float] = {}
        for v in view.containers:
            # A rescue is laid over the plan: the plan's rules see the limit the plan had.
            plan, old = plans[v.name], self.before_rescue.get(v.name, v.limit)
            new = plan.limit
            if old is not None:
                if plan.kind == "too fast":
                    # Once trimmed as too fast, it is not trimmed again each time the floor falls.
                    held = math.isclose(self.fast_held.get(v.name, -1.0), old, rel_tol=1e-3)
                    keep = floor <= old <= new * (TOO_FAST_SLACK if held else TOO_FAST_FIRST)
                elif plan.kind in ("in band", "learning"):
                    # A move smaller than what the fit can tell apart from noise is not made.
                    at_old = self.curves[v.name].predict_limit(old * cores)
                    tell = 2 * at_old[1] if at_old is not None else 0.0
                    keep = abs(math.log(new / old)) <= max(math.log1p(p.dead_band), tell)
                    if not keep and p.expected_aim >= 0.5 and plan.kind == "in band":
                        # Nor one that adds little to its chances: the value is flat near its best.
                        curve = self.curves[v.name]
                        credit = self._credit(v)
                        gain = sum(_chances(curve, v, new * cores, credit)) - sum(_chances(curve, v, old * cores, credit))
                        # Nor trimming, unless the curve puts it faster than its band where it is.
                        keep = gain < VALUE_DEAD_BAND and (new > old or not _faster_than_band(at_old, v))
                else:  # cannot be met: a share, not a target
                    keep = abs(new - old) <= BEST_EFFORT_DEAD_BAND * max(old, new)
                if keep:
                    # Kept, less any part of a core above one that adds no thread.
                    new = self.curves[v.name].snap(old, cores, floor)
                elif plan.kind == "in band":
                    curve = self.curves[v.name]
                    pred = curve.predict_limit(new * cores)
                    if pred is None or pred[1] > UNCERTAIN_SD:
                        # An uncertain fit moves a limit only so far a round.
                        new = curve.snap(min(max(new, old / MAX_STEP_UNCERTAIN), old * MAX_STEP_UNCERTAIN), cores,
                                         floor)
            proposal[v.name] = new
        # Staying put must not overcommit the node. What is left was split as if every container
        # moved to its plan; those kept where they are hold some of it, so the best-effort rises
        # it paid for give way first (no one moves for it), then the largest overshoots, then (only
        # if the node is still overcommitted) the largest limits, down to the floor.
        excess = sum(proposal.values()) - 1.0
        olds = {v.name: v.limit for v in view.containers}
        rises = [(proposal[n] - old, n) for n in proposal
                 if plans[n].kind in ("no room", "unachievable") and (old := olds[n]) is not None
                 and proposal[n] > old and n not in self.chances]
        excess = _give_back(proposal, sorted(rises, reverse=True), excess)
        overs = sorted(((proposal[n] - plans[n].limit, n) for n in proposal), reverse=True)
        excess = _give_back(proposal, [(over, n) for over, n in overs if over > 0], excess)
        _give_back(proposal, [(proposal[n] - floor, n) for n in sorted(proposal, key=lambda n: -proposal[n])], excess)
        self.fast_held = {n: proposal[n] for n in proposal if plans[n].kind == "too fast"}
        planned = dict(proposal)
        self._late_at = []
        if p.late_rescue >= 0.5:
            self._rescue(view, plans, proposal, cores, floor)
        else:
            self.rescues.clear()
        self.before_rescue = {n: planned[n] for n in proposal if not math.isclose(proposal[n], planned[n])}
        ups: dict[str, tuple[float | None, str]] = {}
        for v in view.containers:
            new, old, curve = proposal[v.name], v.limit, self.curves[v.name]
            fit, at = curve.solve(), curve.predict_limit(new * cores)
            curve.expected = None if fit is None or at is None else (at[0], OUTLIER_SD * max(fit[5], NOISE_PRIOR) + at[1])
            curve.strikes = 0
            curve.foresight = _foresee(curve, new * cores, view.now_s) if new is not None else None
            if new != old:
                curve.changed_at_s = view.now_s
                lat = curve.predict_limit(new * cores)
                step = _exp_or_inf(lat[0]) if lat is not None else math.inf
                if not math.isfinite(step):  # no fit yet, or one that foresees past a float's range
                    step = v.latency_s or v.last_latency_s or 0.0
                # The batch running now straddles the change and already tells something.
                curve.expect_at_s = view.now_s + step
            reason = _reason(plans[v.name], curve, v.name in self.chances)
            if v.name in self.before_rescue:
                reason += (", its late batch given more for the rest of it" if v.name in self.rescues
                           else ", lending to a late batch")
            ups[v.name] = (new, reason)
        interval = self._next_interval(view.now_s)
        return build_decision(self.name, view, cl, ups, interval_s=interval,
                              listener=f"next informative batch in {interval:.3g} s",
                              planned={n: planned[n] for n in self.before_rescue})

    def _solve(self, views: Sequence[ContainerView], cores: float) -> dict[str, _Plan]:
        """Limits (fractions of the node) for every container: most met, then in band, then least CPU."""
        p = self.params
        n = len(views)
        floor = floor_limit(n)
        cap = p.total_resource
        z = p.confidence_z
        plans: dict[str, _Plan] = {}
        candidates: list[tuple[float, str]] = []
        centre: dict[str, float] = {}
        margin: dict[str, float] = {}
        best_effort: list[str] = []
        learning: list[ContainerView] = []
        best_limit: dict[str, float] = {}
        for v in views:
            curve = self.curves[v.name]
            fit = curve.solve()
            if fit is None:
                learning.append(v)
                continue
            noise = curve.noise
            # Cheapest met: the band's slow edge on the fitted curve; room permitting, a margin
            # for the batch-to-batch noise and the fit's uncertainty comes on top (below).
            edge_s = v.objective_s * (1 + v.alpha) * math.exp(-1.5 * noise)
            edge = curve.cores_for(edge_s, 0.0)
            # Where its next batch is most often met and in band (the measured noise and what the fit
            # does not know yet), the least CPU on ties.
            credit = self._credit(v)
            best = expected_best_limit(curve, v, cores, floor, cap, credit) if p.expected_aim >= 0.5 else None
            if best is not None and edge is not None and not (math.isfinite(edge) and edge <= cap * cores):
                # Not with the margin, but where it does best (its ceiling, a thread's worth) it may still
                # be met more often than not: then that is its need, not a fair share that leaves it late.
                if _chances(curve, v, best * cores, credit)[0] >= 0.5:
                    edge = best * cores
            if edge is None or not math.isfinite(edge) or edge > cap * cores:
                best_effort.append(v.name)
                plans[v.name] = _Plan(floor, "unachievable")
                if best is not None:  # at its edge, what is left may still give it a chance
                    best_limit[v.name] = best
                continue
            need = edge / cores
            safe = curve.cores_for(edge_s, z)
            safe = need if safe is None or not math.isfinite(safe) else safe / cores
            # Where to go if there is room: the band's centre, never past its fast edge.
            mid = curve.cores_for(v.objective_s * math.exp(-0.5 * noise), z) or edge
            fast_edge = curve.cores_for((1 - v.alpha) * v.objective_s * math.exp(noise), 0.0) or math.inf
            margin[v.name] = min(max(need, safe), cap)
            centre[v.name] = min(max(margin[v.name], min(mid, fast_edge) / cores), cap)
            if best is not None:
                # Aimed there; never priced above the margin.
                best_limit[v.name] = best
                need = min(need, best)
                margin[v.name] = centre[v.name] = max(best, need)
            if v.limit is not None and need * (1 - p.dead_band) <= v.limit <= min(cap, fast_edge / cores) and _in_band(v):
                at = curve.predict_limit(v.limit * cores)
                if at is not None and at[0] <= math.log(edge_s):
                    # In band where it is and the curve agrees: leave it there (no trimming).
                    margin[v.name] = centre[v.name] = v.limit
            if need <= floor and _faster_than_band(curve.predict_limit(floor * cores), v):
                plans[v.name] = _Plan(floor, "too fast", need)
                continue
            # Met at the floor is free to choose; room may still move it to its aim above the floor.
            plans[v.name] = _Plan(max(need, floor), "candidate", need)
            candidates.append((max(0.0, need - floor), v.name))
        budget = 1.0 - floor * n
        # Containers still learning keep what they have; a newcomer starts at an equal part of the
        # CPU no limit holds, never more than the node can spare once the others have their floor.
        free = 1.0 - sum(v.limit for v in views if v.limit is not None)
        newcomers = sum(1 for v in learning if v.limit is None)
        for v in learning:
            share = v.limit if v.limit is not None else max(floor, min(cap, free / max(1, newcomers)))
            plans[v.name] = _Plan(share, "learning")
            budget -= share - floor
        for v in learning:
            if v.limit is None and budget < 0:
                back = min(plans[v.name].limit - floor, -budget)
                plans[v.name] = _Plan(plans[v.name].limit - back, "learning")
                budget += back
        chosen = _choose(candidates, budget, self.chosen)
        for extra, name in candidates:
            if name in chosen:
                budget -= extra
                plans[name] = _Plan(plans[name].limit, "in band", plans[name].need)
            else:
                best_effort.append(name)
                plans[name] = _Plan(floor, "no room", plans[name].need)
        self.chosen = set(chosen)
        # Room left: first the fit's uncertainty as a margin, then towards the band's centre,
        # cheapest step first.
        for goal in (margin, centre):
            for step, name in sorted((goal[n] - plans[n].limit, n) for n in chosen):
                if step <= 0 or budget <= 1e-12:
                    continue
                # Threads that follow the limit use only its whole cores above one: no part of a core.
                new = self.curves[name].snap(plans[name].limit + min(step, budget), cores, plans[name].limit)
                budget -= new - plans[name].limit
                plans[name] = _Plan(new, "in band", plans[name].need)
        if p.expected_aim >= 0.5 and budget > 1e-9:
            budget = self._one_more_chance(views, plans, best_effort, best_limit, cores, budget)
        # Then an equal part to each container that cannot be met, up to its fair share.
        limit_each = self._fair_share(n)
        want = {}
        for name in best_effort:
            curve = self.curves[name]
            top = limit_each
            if curve.sat_cores is not None:
                # Up to its ceiling and a little past it: a ceiling seen once may have been a
                # slow spell, and a container held at it could never show that it is not.
                top = min(top, max(floor, SAT_PROBE * curve.sat_cores / cores))
            want[name] = curve.snap(top, cores, floor)
        while budget > 1e-9 and want:
            share = budget / len(want)
            for name in list(want):
                give = min(share, want[name] - plans[name].limit)
                plans[name] = _Plan(plans[name].limit + give, plans[name].kind, plans[name].need)
                budget -= give
                if plans[name].limit >= want[name] - 1e-12:
                    del want[name]
        for name in best_effort:  # a share short of a whole core above one adds no thread: left idle
            plans[name] = _Plan(self.curves[name].snap(plans[name].limit, cores, floor), plans[name].kind,
                                plans[name].need)
        return plans

    def _rescuable(self, v: ContainerView) -> bool:
        """Rescues are on and the band's slow half lasts at least RESCUE_MIN_S."""
        return self.params.late_rescue >= 0.5 and v.alpha * v.objective_s >= RESCUE_MIN_S

    def _credit(self, v: ContainerView) -> float:
        """The share of late batches its aim counts on a rescue to bring into the band (what this node's
        rescues have done so far); 0 where no batch of it is rescued."""
        return self.rescued[0] / self.rescued[1] if self._rescuable(v) else 0.0

    def _tally_rescue(self, v: ContainerView, b: BatchObs) -> None:
        """Count a finished batch of an aimed container towards `rescued`: a rescued one (in band or
        not), or one that ended past its slow edge without a rescue."""
        if v.name not in self.chosen or not self._rescuable(v):
            return
        rescue = self.rescues.get(v.name)
        start_s = b.finished_at_s - b.latency_s
        if rescue is not None and abs(rescue[0] - start_s) <= 0.05 * b.latency_s:
            self.rescued[0] += is_satisfied(v.objective_s, b.latency_s, v.alpha)
            self.rescued[1] += 1
        elif not is_met(v.objective_s, b.latency_s, v.alpha):
            self.rescued[1] += 1

    def _rescue(self, view: NodeView, plans: dict[str, _Plan], proposal: dict[str, float], cores: float,
                floor: float) -> None:
        """More CPU for the rest of a running batch that is likely to end past its band's slow edge.

        Nothing but how long the batch has run is known of it: if it has not ended by the time its
        curve (noise and fit) gives it a LATE_CHANCE of ending past the slow edge, it is raised so that
        its likely remainder ends inside the band, taking from what no limit holds, then from
        containers that cannot be met (largest first, never below the floor). Rescues already under
        way keep their limit while their batch runs. Changes `proposal` in place."""
        now = view.now_s
        spare = max(0.0, 1.0 - sum(proposal.values()))
        donors = sorted((n for n in proposal if plans[n].kind in ("no room", "unachievable")
                         and n not in self.chances and n not in self.rescues), key=lambda n: -proposal[n])

        def take(amount: float) -> float:
            nonlocal spare
            got = min(amount, spare)
            spare -= got
            for d in donors:
                if got >= amount - 1e-12:
                    break
                t = min(amount - got, proposal[d] - floor)
                if t > 0:
                    proposal[d] -= t
                    got += t
            return got

        for v in view.containers:
            name = v.name
            if name in self.rescues:
                start, limit = self.rescues[name]
                if limit > proposal[name]:
                    proposal[name] += take(limit - proposal[name])
                continue
            curve = self.curves[name]
            fit = curve.solve()
            if (plans[name].kind != "in band" or v.limit is None or fit is None or curve.last_end_s is None
                    or not self._rescuable(v) or not math.isclose(proposal[name], v.limit, rel_tol=1e-9)):
                continue
            pred = curve.predict_limit(proposal[name] * cores)
            if pred is None:
                continue
            start, mean, k = curve.last_end_s, pred[0], max(fit[1], K_RANGE[0])
            sd = max(1e-3, math.hypot(fit[5], pred[1]))
            if curve.changed_at_s is not None and curve.changed_at_s - start > 0.05 * _exp_or_inf(mean):
                continue  # this batch ran under another limit for a while: its curve does not tell
            slow_s = v.objective_s * (1 + v.alpha)
            beyond = 1 - normal_cdf((math.log(slow_s) - mean) / sd)
            if 1e-9 < beyond < LATE_CHANCE:  # (a batch with next to no chance of being late: no round)
                late_s = start + _exp_or_inf(mean + sd * _NORMAL.inv_cdf(1 - beyond / LATE_CHANCE))
                if now < late_s < math.inf:
                    self._late_at.append(late_s)
            ran_s = now - start
            if ran_s <= 0 or slow_s - ran_s < RESCUE_MIN_S:
                continue
            still = 1 - normal_cdf((math.log(ran_s) - mean) / sd)
            if still <= 0 or beyond / still < LATE_CHANCE:
                continue
            # Its likely end given it has run this long (the upper quartile of what is left), moved
            # to the band's centre, or part way to the slow edge once past it.
            end_s = _exp_or_inf(mean + sd * _NORMAL.inv_cdf(min(1 - 1e-9, 1 - still / 4)))
            left_s = end_s - ran_s
            if not math.isfinite(left_s):
                continue
            by_s = v.objective_s if ran_s < v.objective_s else ran_s + (slow_s - ran_s) / 3
            top = self.params.total_resource
            if curve.steps:  # its threads were set when the batch began: more than they use is idle
                top = min(top, max(1.0, whole_threads(v.limit * cores)) / cores)
            if curve.sat_cores is not None:
                top = min(top, curve.sat_cores / cores)
            want = min(proposal[name] * min(RESCUE_STEP, (left_s / (by_s - ran_s)) ** (1 / k)), top)
            if want <= proposal[name]:
                continue
            avail = spare + sum(max(0.0, proposal[d] - floor) for d in donors)
            limit = proposal[name] + min(want - proposal[name], avail)
            if ran_s + left_s * (proposal[name] / limit) ** k >= slow_s:
                continue  # what can be given would not bring it in
            limit = proposal[name] + take(limit - proposal[name])
            self.rescues[name] = (start, limit)
            proposal[name] = limit

    def _fair_share(self, n: int) -> float:
        """The most a container that cannot be met gets from an equal split (never below the floor)."""
        p = self.params
        return max(floor_limit(n), min(p.total_resource, p.best_effort_share / max(1, n)))

    def _one_more_chance(self, views: Sequence[ContainerView], plans: dict[str, _Plan], best_effort: list[str],
                         best_limit: dict[str, float], cores: float, budget: float) -> float:
        """What is left to the containers not met for sure, one at a time, where that is worth more than
        the fair split.

        A container met alone but left out for room gets nothing from an equal split that reaches its
        band; all of what is left may give it a fair chance. So does one at the edge of what it can
        do (met about every other batch at its ceiling, judged unachievable by a hair): held at its
        ceiling it is met that often, dropped to a fair share never, and a verdict that flips with
        each batch moves its limit each time. Compared in expected met + in band of the next batches:
        the fair split (below) against the one container, among those left, that the rest lifts
        furthest; repeated while what is left lifts one further. Returns the budget left."""
        by_name = {v.name: v for v in views}
        n = len(views)
        limit_each = self._fair_share(n)

        def value(name: str, limit: float) -> float:
            met, in_band = _chances(self.curves[name], by_name[name], limit * cores, self._credit(by_name[name]))
            return met + in_band

        held: set[str] = set()
        while budget > 1e-9 and best_effort:
            split = budget / len(best_effort)
            spread = sum(value(k, min(limit_each, plans[k].limit + split)) - value(k, plans[k].limit)
                         for k in best_effort)
            best = None
            for k in best_effort:
                if k not in best_limit or plans[k].kind not in ("no room", "unachievable"):
                    continue
                top = self.curves[k].snap(min(best_limit[k], plans[k].limit + budget), cores, plans[k].limit)
                gain = value(k, top) - value(k, plans[k].limit)
                # Hysteresis: a new holder must be worth clearly more than the split; last round's
                # holders keep it while they are worth no less, and before any other.
                kept = k in self.chances
                if gain > spread + (1e-9 if kept else CHANCE_MARGIN):
                    key = (kept, gain)
                    if best is None or key > best[0]:
                        best = (key, k, top)
            if best is None:
                break
            _, k, top = best
            held.add(k)
            budget -= top - plans[k].limit
            plans[k] = _Plan(top, plans[k].kind, plans[k].need)
            best_effort.remove(k)
        self.chances = held
        return budget

    def _next_interval(self, now_s: float) -> float:
        """The wait until a batch is due that can change a decision; doubling while none is."""
        p = self.params
        due = []
        for c in self.curves.values():
            if c.n == 0:
                due.append(now_s + p.initial_interval_s)
            elif c.changed_at_s is not None and (c.last_clean_s is None or c.last_clean_s <= c.changed_at_s):
                if c.expect_at_s is not None and c.expect_at_s > now_s:
                    due.append(c.expect_at_s)
                else:  # late: look again at a fraction of its batch time
                    step = (c.expect_at_s or now_s) - (c.changed_at_s or now_s)
                    due.append(now_s + max(p.initial_interval_s, step / 4))
            elif c.n < FEW_BATCHES and c.batch_s is not None:
                # A curve seen a few times (a newcomer, or one that restarted after a drift) is still
                # being learnt: its next batch can change the decision.
                due.append(now_s + c.batch_s)
        due += [t for t in self._late_at if t > now_s]
        if due:
            self._interval_s = min(p.max_interval_s, max(p.initial_interval_s, min(due) - now_s))
        else:
            self._interval_s = min(p.max_interval_s, self._interval_s * 2)
        return self._interval_s


def _limit_cores(b: BatchObs, curve: Curve, cores: float) -> float | None:
    """A batch's limit in the cores it can use: threads that follow it use only its whole cores above one."""
    return None if b.limit is None else curve.at_limit(b.limit * cores)


def _got(b: BatchObs, v: ContainerView, curve: Curve, cores: float) -> tuple[float | None, bool, float | None]:
    """(the cores a clean batch ran at, whether its limit held it, the CPU rate it used): the limit
    where it held the batch (it used at least BINDING of it), else the rate; None where neither is known."""
    limit_cores = _limit_cores(b, curve, cores)
    rate = None
    if b.cpu_s is not None:
        rate = b.cpu_s / b.latency_s
    elif v.cpu_share is not None:
        rate = v.cpu_share * cores
    if limit_cores is not None and (rate is None or rate >= BINDING * limit_cores):
        return limit_cores, True, rate
    if rate is not None and rate > 0:
        return rate, False, rate
    return None, False, rate


def _may_show_ceiling(limit_cores: float | None) -> bool:
    """Whether a batch that used less than this limit may show a ceiling of the container's own.

    Not under a limit of one core or less: every workload runs at least one thread, which can use a
    whole core, so what it left of such a limit the node held (on a 16-core host at 0.94 busy, a
    ResNet-50 on one thread used 0.94 of a 0.85-core limit in the median batch and under 0.85 of it in
    up to one batch in seven, and read as a ceiling, that judged it unable to reach a band it was in)."""
    return limit_cores is None or limit_cores > 1.0 + 1e-9


def _had_room(node_busy: float, cores: float, limit_cores: float | None, rate: float) -> bool:
    """Whether a container that used less than its limit could have had more: the node's managed
    containers (`node_busy`, a fraction of it) were clearly below full, or left idle at least half
    of what it left unused.

    Under limits that sum to at most the node, CFS only starves a container below its quota when
    other work overcommits the node, and then little is idle. A full node (every core handed out)
    with one container held by its own threads below its limit is the case a fixed threshold on
    `node_busy` missed (a 16-core host's run: 0.94 busy, a ResNet-50 on one thread at 1.55 cores of
    limit, never seen as at its ceiling)."""
    if node_busy < 0.9:
        return True
    return limit_cores is not None and (1.0 - node_busy) * cores >= 0.5 * (limit_cores - rate)


def _weigh_memories(curve: Curve, b: BatchObs, cores: float, decay: float, horizon_s: float) -> None:
    """Score both memories on a clean batch under the limit set last, against what each foresaw at
    most `horizon_s` before; the fit follows the one that foresees better, with a margin either way."""
    seen = curve.foresight
    if seen is None or b.limit is None or not math.isclose(b.limit * cores, seen[0], rel_tol=1e-4):
        return
    if b.finished_at_s - seen[3] > horizon_s:
        curve.foresight = _foresee(curve, seen[0], b.finished_at_s)
    y = math.log(b.latency_s)
    short, long = (y - seen[1]) ** 2, (y - seen[2]) ** 2
    curve.evidence = curve.evidence * decay + short - long
    curve.spread = curve.spread * decay + short + long
    if curve.long_active != (curve.evidence > 0) and abs(curve.evidence) > SWITCH_EVIDENCE * curve.spread:
        curve.long_active = not curve.long_active
        curve.fit = None


def _batch_sd(fit: tuple[float, ...], pred: tuple[float, float]) -> float:
    """The sd of a batch's log latency about its curve's prediction `pred` (mean, model sd): the spread
    of a batch where the curve is known, and what the fit does not know yet where it is not (two
    batches may put a third limit far off). What both the drift watch and the spell notes measure by."""
    return math.hypot(max(fit[5], NOISE_PRIOR), pred[1])


def _take(curve: Curve, x: float, y: float, w: float, decay: tuple[float, float], start_s: float = math.nan,
          spell: Callable[[float, float], bool] | None = None) -> None:
    """One observation (log cores, log latency) of weight w. A batch far off the curve is held out
    until the next: two in a row on the same side mean the curve moved (it restarts from both);
    otherwise it joins the fit at a weight that makes it count little. Held out meanwhile, one odd
    batch never inflates the noise, which would hide the drift it may be the start of.

    `spell(start, side)`: whether the node's other containers were off their curves on the same
    side since `start` (the held batch's); if so the curve is kept, the older batch dropped and the
    newer held in its place, for at most RESTART_WATCH such batches in a row."""
    curve.check_back(x, y)
    pred = curve.predict(math.exp(x))
    fit = curve.solve()
    if pred is not None and fit is not None and curve.n >= 2:
        resid = y - pred[0]
        sd = _batch_sd(fit, pred)
        if abs(resid) > OUTLIER_SD * sd:
            held = curve.suspects[-1] if curve.suspects else None
            if held is not None and held[0] * resid > 0:
                if (spell is not None and curve.spell_held < RESTART_WATCH
                        and spell(held[4] if math.isfinite(held[4]) else start_s, math.copysign(1.0, resid))):
                    # A spell of the host: both batches say more of it than of this curve.
                    curve.spell_held += 1
                    curve.suspects[-1] = (resid, x, y, w, start_s)
                    return
                curve.restart()
                curve.add(held[1], held[2], held[3], decay)
                curve.add(x, y, w, decay)
                return
            # A new suspect (none held, or one on the other side) breaks any chain of slow batches.
            _release(curve, decay)
            curve.spell_held = 0
            curve.suspects.append((resid, x, y, w, start_s))
            return
    _release(curve, decay)
    curve.spell_held = 0
    curve.add(x, y, w, decay)


def _pool_slopes(curves: dict[str, Curve], own: Mapping[str, tuple[float, ...] | None] | None = None) -> None:
    """Set each curve's node prior on its slope from the others' pinned-down slopes.

    A random-effects pool: each pinned slope (its own data's posterior mean and variance) counts by
    1 / (its variance + the spread between containers); the prior is the pooled mean, as wide as the
    spread plus the mean's own variance. The spread is measured over every pinned slope, a curve's
    own included (one that differs widens everyone's prior, its own too); the mean leaves the curve's
    own slope out, so that it never informs its own prior. Fewer than POOL_MIN others: no node prior.
    """
    fits: Mapping[str, tuple[float, ...] | None] = own if own is not None else _own_fits(curves)
    pinned: dict[str, tuple[float, float]] = {}
    for name, c in curves.items():
        f = fits[name]
        if f is not None and math.sqrt(f[4]) <= POOL_PINNED * c.k_sd:
            pinned[name] = (f[1], f[4])
    tau2 = (_between_variance([list(pinned.values())]) or 0.0) if len(pinned) >= 2 else 0.0
    others_of = _leave_one_out(pinned, tau2)
    for name, c in curves.items():
        pooled = others_of(name)
        prior = None
        if pooled is not None and pooled[2] >= POOL_MIN:
            prior = (pooled[0], math.sqrt(tau2 + pooled[1]))
        if prior != c.k_node:
            c.k_node = prior
            c.fit = None


def _own_fits(curves: dict[str, Curve]) -> dict[str, tuple[float, float, float, float, float, float] | None]:
    """Each curve's fit on its own data under its own prior on k: what it says by itself."""
    return {n: c.solve_memory(c.long_active, own=True) for n, c in curves.items()}


def _pool_heights(curves: dict[str, Curve], own: Mapping[str, tuple[float, ...] | None] | None = None) -> None:
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
    own_fits: Mapping[str, tuple[float, ...] | None] = own if own is not None else _own_fits(curves)
    members: dict[str, dict[str, tuple[tuple[float, ...], Curve]]] = {}
    for n, c in curves.items():
        f = own_fits[n]
        if c.workload is not None and not c.solo and f is not None:
            members.setdefault(c.workload, {})[n] = (f, c)
    groups: dict[str, dict[str, tuple[float, float]]] = {}
    at: dict[str, float] = {}
    for workload in sorted(members):  # a fixed order: the same sums, to the last bit, every time
        fits = members[workload]
        xs = []
        for f, c in fits.values():
            sums = c.long_sums if c.long_active else c.short_sums
            if sums[0] > 0:
                xs.append((sums[2] / sums[0], 1.0 / max(f[2], 1e-12)))
        if not xs:
            continue
        x0 = sum(x * w for x, w in xs) / sum(w for _, w in xs)
        at[workload] = x0
        heights = {}
        for n, (f, c) in fits.items():
            pred = c.predict(math.exp(x0), f)
            if pred is not None:
                heights[n] = (pred[0], max(pred[1] ** 2, 1e-12))
        groups[workload] = heights
    tau2 = _between_variance([list(h.values()) for h in groups.values() if len(h) >= 2])
    if tau2 is None:
        tau2 = HEIGHT_SPREAD_UNKNOWN**2
    tau2 = max(tau2, HEIGHT_SPREAD_MIN**2)
    others_in = {key: _leave_one_out(heights, tau2) for key, heights in groups.items()}
    for name, c in curves.items():
        prior = None
        key = None if c.solo else _group_of(c.workload, groups)
        pooled = others_in[key](name) if key is not None else None
        if key is not None and pooled is not None:
            prior = (at[key], pooled[0], tau2 + pooled[1])
        if prior != c.height_node:
            c.height_node = prior
            c.fit = None


def _group_of(workload: str | None, groups: dict[str, dict[str, tuple[float, float]]]) -> str | None:
    """The replicas' group of a workload: its own; for a model known only by its label (no batch
    reported yet), the one group of that model's replicas, if they all run one batch size."""
    if workload is None:
        return None
    if workload in groups or WORKLOAD_SEP in workload:
        return workload if workload in groups else None
    same = [g for g in groups if g.rpartition(WORKLOAD_SEP)[0] == workload]
    return same[0] if len(same) == 1 else None


def _between_variance(groups: Sequence[Sequence[tuple[float, float]]]) -> float | None:
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


def _leave_one_out(est: dict[str, tuple[float, float]],
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


def _release(curve: Curve, decay: tuple[float, float]) -> None:
    """A batch held out as a suspect that the next batch did not confirm joins the fit, down-weighted."""
    for resid, x, y, w, _ in curve.suspects:
        fit = curve.solve()
        sd = max(fit[5], NOISE_PRIOR) if fit is not None else NOISE_PRIOR
        curve.add(x, y, w * min(1.0, OUTLIER_SD * sd / abs(resid)), decay)
    curve.suspects.clear()


def _foresee(curve: Curve, cores: float, now_s: float) -> tuple[float, float, float, float] | None:
    """What each memory expects of the batches at `cores` (None while both are the same memory, or
    either has no fit). The one in use is the curve's own fit, solved once a round already."""
    if curve.long_sums == curve.short_sums:
        return None
    active, other = curve.solve(), curve.solve_memory(not curve.long_active)
    if active is None or other is None:
        return None
    short, long = (other, active) if curve.long_active else (active, other)
    a, b = curve.predict_limit(cores, short), curve.predict_limit(cores, long)
    return None if a is None or b is None else (cores, a[0], b[0], now_s)


def _exp_or_inf(x: float) -> float:
    return math.exp(x) if x < 700.0 else math.inf


def _give_back(proposal: dict[str, float], order: Sequence[tuple[float, str]], excess: float) -> float:
    """Take up to each (amount, name) from its proposed limit, in order, until `excess` is gone;
    returns what is still over."""
    for amount, name in order:
        if excess <= 1e-9:
            break
        back = min(amount, excess)
        proposal[name] -= back
        excess -= back
    return excess


def _choose(candidates: Sequence[tuple[float, str]], budget: float, incumbents: set[str]) -> list[str]:
    """The most containers whose extra CPU fits the budget, keeping last round's where that costs no count.

    Cheapest first gives the largest count (one unit of value each). Taking
    last round's chosen first, then the others cheapest first, is kept when it
    reaches the same count: the set does not change for a tie.
    """
    def greedy(order: Sequence[tuple[float, str]]) -> list[str]:
        left, out = budget, []
        for extra, name in order:
            if extra <= left + 1e-12:
                left -= extra
                out.append(name)
        return out

    best = greedy(sorted(candidates))
    stable = greedy(sorted(candidates, key=lambda c: (c[1] not in incumbents, c[0], c[1])))
    return stable if len(stable) >= len(best) else best


def expected_best_limit(curve: Curve, v: ContainerView, cores: float, lo: float, hi: float,
                        credit: float = 0.0) -> float:
    """The limit in [lo, hi] with the most P(met) + P(in band) for the next batch, least CPU on ties.

    The next batch's log latency is the curve's prediction, spread by sqrt(noise^2 + model var):
    the measured batch-to-batch noise and what the fit does not know yet. `credit`: the share of
    batches past the slow edge taken as rescued into the band (`_chances`)."""
    if curve.solve() is None:
        return hi
    ratio = (hi / lo) ** (1.0 / (TARGET_GRID - 1)) if hi > lo else 1.0
    best = _best_on_grid(curve, v, cores, lo, ratio, TARGET_GRID, hi, credit)
    if ratio > 1.0:
        # A grid step (about 6 % of a limit) is more than the dead band: between two steps of nearly
        # equal value the aim would flip with every small change of the fit. Refine around the best.
        fine = ratio ** (2.0 / (TARGET_FINE - 1))
        best = _best_on_grid(curve, v, cores, max(lo, best / ratio), fine, TARGET_FINE, min(hi, best * ratio), credit)
    # The same value for less: a limit above one core cut to its whole cores when threads follow it.
    return curve.snap(best, cores, lo)


def _best_on_grid(curve: Curve, v: ContainerView, cores: float, start: float, ratio: float, steps: int,
                  hi: float, credit: float = 0.0) -> float:
    """The limit among start * ratio**i (i < steps, at most hi) with the most P(met) + P(in band),
    the least CPU on ties."""
    best, best_value = hi, -1.0
    for i in range(steps):
        limit = min(hi, start * ratio**i)
        met, in_band = _chances(curve, v, limit * cores, credit)
        if met + in_band > best_value + 1e-6:
            best, best_value = limit, met + in_band
    return best


def _chances(curve: Curve, v: ContainerView, cores: float, credit: float = 0.0) -> tuple[float, float]:
    """(P(met), P(in band)) of the next batch under a limit of this many cores, per the fit and the noise;
    `credit` of the batches that would end past the slow edge counted as rescued into the band."""
    pred = curve.predict_limit(cores)
    if pred is None:
        return 0.0, 0.0
    met, in_band = band_chances(pred[0], math.sqrt(curve.noise**2 + pred[1] ** 2),
                                math.log((1 + v.alpha) * v.objective_s), math.log((1 - v.alpha) * v.objective_s))
    return met + credit * (1 - met), in_band + credit * (1 - met)


def _faster_than_band(pred: tuple[float, float] | None, v: ContainerView) -> bool:
    """Whether a predicted (mean log latency, sd) puts the container faster than its band."""
    return pred is not None and _exp_or_inf(pred[0]) < (1 - v.alpha) * v.objective_s


def _in_band(v: ContainerView) -> bool:
    lat = v.latency_s if v.latency_s is not None else v.last_latency_s
    return lat is not None and abs(v.objective_s - lat) <= v.alpha * v.objective_s


def _prior_theta(profile: ModelProfile) -> float:
    """log latency at one core per a calibrated profile: its CPU work per batch (one thread or more)."""
    return math.log(profile.latency_s(1.0, max(1.0, float(profile.threads))))


def _reason(plan: _Plan, curve: Curve, chance: bool = False) -> str:
    kind = f"{plan.kind}, given what is left for a chance" if chance else plan.kind
    f = curve.solve()
    if f is None:
        return f"learned: {kind} (no clean batch yet)"
    pooled = f", its replicas' curve ±{math.sqrt(curve.height_node[2]):.2f}" if curve.height_node is not None else ""
    steps = ", whole cores above one: its threads follow the limit" if curve.steps else ""
    return f"learned: {kind} (k {f[1]:.2f}, noise {f[5]:.2f}, {curve.n} batches{pooled}{steps})"


SPEC = PolicySpec(
    name="learned",
    label="learned curves",
    summary="our allocator: learns each container's latency curve online and solves for the most met, "
    "then in band, then the least CPU",
    params_type=LearnedParams,
    factory=lambda params, context: LearnedPolicy(params, context.curve_of),
)
