"""FlowCon (Zheng et al., TCC): growth-efficiency allocation for training jobs, Algorithms 1-4.

Why: training jobs have no latency objective; what matters is how fast each
one still learns. FlowCon sorts a node's jobs into three lists by growth
efficiency G = P / R (training.py): NL (new, fast growing), WL (watching),
CL (completing), and gives the whole node to NL jobs, caps CL jobs at their
share of the node's growth (never below 1/|c|) and leaves WL limits alone
(Algorithm 1). When every job is completing it lets them compete freely and
doubles its interval (exponential back-off); a job starting or finishing
resets the interval and decides at once (Algorithm 2, the listener). The
threshold alpha adapts to the jobs' own growth (Algorithm 3). On the manager,
Algorithm 4 places a new job on the worker whose jobs are all completing
(fewest first), else on the lowest score
S = (|NL| + 1) * D_NL + |WL| * D_WL + |CL| * D_CL, D_x the sum of G in list x.

The paper's pseudo-code is garbled in places; every reading we chose is in
docs/design/flowcon.md, and the unit tests pin each one with explicit
times (tests/unit/test_flowcon.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shared.core.policy import PolicySpec, check_interval
from shared.core.training import (
    JobDecision,
    JobReport,
    JobView,
    Stage,
    TrainingDecision,
    TrainingView,
    WorkerReport,
)

FREE = 1.0
"""A limit of 1: the whole node (the paper's "allowing for the maximum resource")."""
CL_FLOORS = ("one-core", "per-container")


@dataclass(frozen=True, slots=True)
class FlowConParams:
    """FlowCon's settings (the paper gives no values; ours are in docs/design/flowcon.md)."""

    initial_interval_s: float = 10.0
    """itval: seconds between rounds, and what every arrival or departure resets it to."""
    max_interval_s: float = 320.0
    """Cap on the doubled interval while every job is completing (the paper has none; a safety net)."""
    initial_alpha: float = 0.0
    """alpha before any job has been measured (0: every measured job counts as growing)."""
    cl_floor: str = "one-core"
    """Lower bound of a CL job's limit: "one-core" (one core of the node, our reading of the paper's
    Figs. 3 and 11a) or "per-container" (1/|c| of the node, the pseudo-code's literal floor, which
    never caps a job below its fair share). docs/design/flowcon.md."""
    threshold_from: str = "progress"
    """What Algorithm 3 averages: "progress" (per-second progress P, as its text and pseudo-code say,
    then compared with G = P / R, R in cores) or "growth" (G itself, the same unit as the comparison)."""
    relative_progress: bool = True
    """Measure progress in units of each job's first reported value (|dE| / E_0 per second), so a
    VAE's loss in the hundreds and a cross entropy near 1 compare; False: raw |dE| as Eq. 1 writes it."""

    def __post_init__(self) -> None:
        check_interval(self.initial_interval_s)
        check_interval(self.max_interval_s, "max_interval_s")
        if self.max_interval_s < self.initial_interval_s:
            raise ValueError("max_interval_s must be >= initial_interval_s")
        a = self.initial_alpha
        if isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a) or a < 0:
            raise ValueError(f"initial_alpha must be a number >= 0, got {a!r}")
        if self.cl_floor not in CL_FLOORS:
            raise ValueError(f"cl_floor must be one of {', '.join(CL_FLOORS)}, got {self.cl_floor!r}")
        if self.threshold_from not in ("progress", "growth"):
            raise ValueError(f"threshold_from must be progress or growth, got {self.threshold_from!r}")
        if not isinstance(self.relative_progress, bool):
            raise ValueError(f"relative_progress must be true or false, got {self.relative_progress!r}")


def threshold(stages: Mapping[str, Stage], values: Mapping[str, float], previous: Mapping[str, float],
              fallback: float | None) -> float | None:
    """Algorithm 3: the adaptive threshold from the lists as they stand and this round's values.

    `values` are each measured job's per-second progress P (or G, with
    threshold_from="growth"). -1 when every job is completing; with one job,
    half its previous value; else the mean of the NL and WL averages (a list
    with no measured job adds 0, so one list alone gives half its average:
    the text's "half of the average gain"). `fallback` when nothing needed
    is measured (None: no threshold this round, the lists stay as they are).
    """
    growth, previous_growth = values, previous
    if stages and all(s is Stage.CL for s in stages.values()):
        return -1.0
    if len(stages) == 1:
        (name,) = stages
        prev = previous_growth.get(name)
        return prev / 2 if prev is not None else fallback
    nl = [growth[n] for n, s in stages.items() if s is Stage.NL and n in growth]
    wl = [growth[n] for n, s in stages.items() if s is Stage.WL and n in growth]
    if not nl and not wl:
        return fallback
    avg_nl = sum(nl) / len(nl) if nl else 0.0
    avg_wl = sum(wl) / len(wl) if wl else 0.0
    return (avg_nl + avg_wl) / 2


def transition(stage: Stage, growth: float, alpha: float) -> Stage:
    """Algorithm 1, lines 4-13: one job's next list. A CL job below alpha stays in CL."""
    if growth >= alpha:
        return Stage.NL
    if stage is Stage.NL:
        return Stage.WL
    return Stage.CL


class FlowConPolicy:
    """Algorithms 1-3 on one node. State: each job's list and limit, alpha, the interval."""

    name = "flowcon"

    def __init__(self, params: FlowConParams | None = None) -> None:
        self.params = params or FlowConParams()
        self.stages: dict[str, Stage] = {}
        self.limits: dict[str, float] = {}
        self.alpha: float = self.params.initial_alpha
        self.interval_s: float = self.params.initial_interval_s
        self.last_growth: dict[str, float] = {}
        """Each job's latest measured G (Algorithm 3's "previous" progress, and the manager's report)."""
        self.last_basis: dict[str, float] = {}
        """Each job's latest value of what alpha is computed from (P or G)."""
        self.cores = 0.0

    @property
    def initial_interval_s(self) -> float:
        return float(self.params.initial_interval_s)

    def set_params(self, params: FlowConParams) -> None:
        self.params = params

    def decide(self, view: TrainingView) -> TrainingDecision:
        jobs = {j.name: j for j in view.jobs}
        self.cores = view.cores
        why: dict[str, str] = {}
        # Algorithm 2: the listener. New jobs go to NL with the whole node; finished ones are forgotten
        # (their CPU is released by leaving); either resets the interval.
        changed = bool(view.arrived or view.departed)
        for name in list(self.stages):
            if name not in jobs:
                del self.stages[name]
                self.limits.pop(name, None)
                self.last_growth.pop(name, None)
                self.last_basis.pop(name, None)
                changed = True
        for name in jobs:
            if name not in self.stages:
                self.stages[name] = Stage.NL
                self.limits[name] = FREE
                why[name] = "arrived: NL"
                changed = True
        if changed:
            self.interval_s = self.initial_interval_s
        ok = {n: j for n, j in jobs.items() if j.growth is not None and j.progress is not None and not j.stale}
        measured = {n: self._scaled(j.growth, j) for n, j in ok.items()}
        basis = measured if self.params.threshold_from == "growth" else {
            n: self._scaled(j.progress, j) for n, j in ok.items()}
        # Algorithm 3, then Algorithm 1's lists (lines 2-13), skipped while alpha is -1.
        # After free competition (alpha -1) a newcomer has no progress yet: keep the lists until it has.
        fallback = self.alpha if self.alpha >= 0 else None
        alpha = threshold(self.stages, basis, self.last_basis, fallback)
        self.last_basis.update(basis)
        if alpha is not None and alpha != -1:
            for name, g in measured.items():
                before = self.stages[name]
                after = transition(before, g, alpha)
                self.stages[name] = after
                if name not in why:
                    why[name] = (f"G {g:.3g} {'>=' if g >= alpha else '<'} alpha {alpha:.3g}: "
                                 + (f"{before} -> {after}" if after is not before else f"stays {after}"))
        for name, j in jobs.items():
            if name not in why:
                why[name] = "stale: no value lately, list and limit kept" if j.stale else "not measured: kept"
        self.last_growth.update(measured)
        free = bool(jobs) and all(s is Stage.CL for s in self.stages.values())
        if not jobs:
            self.alpha = self.params.initial_alpha
        elif free:
            # Lines 14-17: every job completing: free competition, back off.
            for name in jobs:
                self.limits[name] = FREE
                why[name] += "; all CL: free competition"
            self.interval_s = min(self.interval_s * 2, self.params.max_interval_s)
            self.alpha = -1.0
        else:
            total_g = sum(measured.values())
            floor = (1.0 / len(jobs) if self.params.cl_floor == "per-container"
                     else min(1.0, 1.0 / view.cores))
            for name, stage in self.stages.items():
                if stage is Stage.NL:
                    self.limits[name] = FREE
                elif stage is Stage.CL:
                    got = measured.get(name)
                    if got is not None and total_g > 0:
                        share = got / total_g
                        self.limits[name] = max(share, floor)
                        why[name] += f"; CL limit max(G/sum G {share:.3f}, floor {floor:.3f})"
                    else:
                        self.limits[name] = max(self.limits.get(name, floor), floor) if got is None else floor
                # WL: unchanged (line 24)
            self.alpha = alpha if alpha is not None and alpha != -1 else self.alpha
        out = tuple(
            JobDecision(name=name, stage=str(self.stages[name]), growth=measured.get(name), progress=j.progress,
                        cpu_cores=j.cpu_cores, old_limit=j.limit, new_limit=self.limits[name], reason=why[name])
            for name, j in jobs.items()
        )
        return TrainingDecision(node=view.node, now_s=view.now_s, policy=self.name, jobs=out,
                                interval_s=self.interval_s, alpha=self.alpha, free_competition=free)

    def _scaled(self, x: float | None, job: JobView) -> float:
        v = float(x or 0.0)
        if self.params.relative_progress and job.first_value:
            v /= job.first_value
        return v

    def report(self, decision: TrainingDecision) -> WorkerReport:
        """What the manager needs for Algorithm 4: each job's list and latest G."""
        return WorkerReport(
            node=decision.node, now_s=decision.now_s, cores=self.cores,
            jobs=tuple(JobReport(name=j.name, stage=j.stage, growth=self.last_growth.get(j.name))
                       for j in decision.jobs),
        )


def place(reports: Mapping[str, WorkerReport], pending: Mapping[str, int] | None = None) -> tuple[str, str]:
    """Algorithm 4: the worker for an incoming job, and why.

    `reports` is each worker's latest report, possibly stale; `pending`
    counts jobs the manager placed on a worker after that report. A pending
    job counts as one more NL job whose G is assumed to be the largest G the
    manager knows (the paper: "the NL is temporarily added 1", assuming a new
    job grows fast), so a burst of submissions between two reports spreads
    instead of piling onto one worker. A job with no measured G yet counts
    the same way.
    """
    if not reports:
        raise ValueError("no workers to place on")
    pend = pending or {}
    known = [j.growth for r in reports.values() for j in r.jobs if j.growth is not None]
    assumed = max(known) if known else 1.0
    all_cl = [n for n, r in reports.items()
              if pend.get(n, 0) == 0 and all(j.stage == Stage.CL for j in r.jobs)]
    if all_cl:
        best = min(all_cl, key=lambda n: (len(reports[n].jobs), n))
        return best, f"every job on {best} completing ({len(reports[best].jobs)} jobs, fewest such)"
    scores = {n: score(r, pend.get(n, 0), assumed) for n, r in reports.items()}
    best = min(scores, key=lambda n: (scores[n], len(reports[n].jobs) + pend.get(n, 0), n))
    return best, f"lowest score S {scores[best]:.4g} (" + ", ".join(f"{n} {s:.4g}" for n, s in scores.items()) + ")"


def score(report: WorkerReport, pending: int, assumed_growth: float) -> float:
    """Algorithm 4, lines 7-10: S = (|NL| + 1) * D_NL + |WL| * D_WL + |CL| * D_CL."""
    nl = [j.growth if j.growth is not None else assumed_growth for j in report.jobs if j.stage == Stage.NL]
    nl += [assumed_growth] * pending
    wl = [j.growth or 0.0 for j in report.jobs if j.stage == Stage.WL]
    cl = [j.growth or 0.0 for j in report.jobs if j.stage == Stage.CL]
    return (len(nl) + 1) * sum(nl) + len(wl) * sum(wl) + len(cl) * sum(cl)


SPEC = PolicySpec(
    name="flowcon",
    label="FlowCon",
    summary="FlowCon: training jobs by growth efficiency (NL/WL/CL lists, adaptive threshold, placement)",
    params_type=FlowConParams,
    factory=lambda params, context: FlowConPolicy(params),
    kind="training",
    placement=place,
)
