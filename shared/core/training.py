"""Training jobs as the control core sees them: evaluation values in, growth efficiency out.

Why a module of its own: FlowCon (and its baseline) decide from a different
signal than the inference policies. A training job reports the value of its
evaluation function E (a loss) after every step or epoch; the worker reads
its cumulative CPU seconds from the runtime. `TrainingTracker` turns those
two streams into one `JobView` per job per round: the progress
P = |E(t_i) - E(t_{i-1})| / (t_i - t_{i-1}) (FlowCon's Eq. 1), the average
CPU use R over the same interval and the growth efficiency G = P / R (Eq. 2).

It is pure (time is an argument, nothing is logged): bad input (NaN, an
infinity, a negative or missing value) is refused with a reason string the
caller logs once, and a job that stops reporting becomes `stale` after
`stale_after_s`, which the policies treat as "not measured" (it keeps its
list and limit) instead of as zero progress.

Units: CPU in cores (`cpu_cores`), limits as a fraction of the node
(1.0 = the whole node, as in the papers and in `shared.core.types`), times in
seconds, E in the job's own unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol


class Stage(StrEnum):
    """FlowCon's lists: new (fast growing), watching (near convergence), completing."""

    NL = "NL"
    WL = "WL"
    CL = "CL"


def progress_per_s(prev_value: float, value: float, dt_s: float) -> float | None:
    """Eq. 1: |E(t_i) - E(t_{i-1})| / (t_i - t_{i-1}); None when the interval is not positive."""
    if not (dt_s > 0) or not math.isfinite(dt_s):
        return None
    return abs(value - prev_value) / dt_s


def growth_efficiency(progress: float | None, cpu_cores: float | None, min_cpu_cores: float = 1e-3) -> float | None:
    """Eq. 2: G = P / R, R the job's average CPU use (cores) over the interval.

    A job that used (almost) no CPU has no meaningful G: None (not measured),
    so an idle or frozen job is never mistaken for an infinitely efficient one.
    """
    if progress is None or cpu_cores is None or not math.isfinite(cpu_cores) or cpu_cores < min_cpu_cores:
        return None
    return progress / cpu_cores


def check_value(value: Any) -> str | None:
    """Why an evaluation value is refused (None: it is fine). Losses are finite and >= 0."""
    if value is None:
        return "no value"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"value is not a number ({type(value).__name__})"
    if math.isnan(value):
        return "value is NaN"
    if math.isinf(value):
        return "value is infinite"
    if value < 0:
        return f"value is negative ({value:g})"
    return None


@dataclass(frozen=True, slots=True)
class JobView:
    """One training job at one round, as every training policy sees it."""

    name: str
    value: float | None
    """Latest evaluation value E (None: nothing reported yet)."""
    progress: float | None
    """P over the last interval (per second); None: not measured (first round, no new value, stale)."""
    cpu_cores: float | None
    """R: average CPU use over the last interval, cores; None before the first interval."""
    growth: float | None
    """G = P / R; None when either is unknown."""
    limit: float | None
    """Limit in force, fraction of the node (None: no limit)."""
    stale: bool = False
    """No value for `stale_after_s`: the job stopped reporting."""
    reports: int = 0
    """Values accepted so far."""
    first_value: float | None = None
    """The job's first accepted E (the scale a relative progress is measured in)."""


@dataclass(frozen=True, slots=True)
class TrainingView:
    """What a training policy sees at one round on one node."""

    node: str
    now_s: float
    cores: float
    jobs: tuple[JobView, ...]
    arrived: tuple[str, ...] = ()
    """Jobs that started since the last round (Algorithm 2's c > 0)."""
    departed: tuple[str, ...] = ()
    """Jobs that finished or vanished since the last round (c < 0)."""


@dataclass(frozen=True, slots=True)
class JobDecision:
    name: str
    stage: str
    """NL / WL / CL for FlowCon; "-" for policies without lists."""
    growth: float | None
    progress: float | None
    cpu_cores: float | None
    old_limit: float | None
    new_limit: float | None
    reason: str


@dataclass(frozen=True, slots=True)
class TrainingDecision:
    node: str
    now_s: float
    policy: str
    jobs: tuple[JobDecision, ...]
    interval_s: float
    alpha: float | None = None
    """FlowCon's threshold after this round (-1: every job completing, Algorithm 1 off)."""
    free_competition: bool = False
    """Every job in CL: all limits 1 and the interval doubled."""
    extra: dict[str, float] = field(default_factory=dict)

    def limits(self) -> dict[str, float | None]:
        return {j.name: j.new_limit for j in self.jobs}

    def stages(self) -> dict[str, str]:
        return {j.name: j.stage for j in self.jobs}


@dataclass(frozen=True, slots=True)
class JobReport:
    """One job in a worker's report to the manager (Algorithm 4's input)."""

    name: str
    stage: str
    growth: float | None


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """A worker's training state as the manager last heard it."""

    node: str
    now_s: float
    cores: float
    jobs: tuple[JobReport, ...]


class TrainingPolicy(Protocol):
    """What every training policy offers a node."""

    name: str

    @property
    def initial_interval_s(self) -> float: ...

    def decide(self, view: TrainingView) -> TrainingDecision: ...

    def report(self, decision: TrainingDecision) -> WorkerReport: ...


@dataclass(slots=True)
class _JobTrack:
    value: float | None = None
    first_value: float | None = None
    value_at_s: float | None = None
    prev_value: float | None = None
    prev_value_at_s: float | None = None
    reports: int = 0
    cpu_total_s: float | None = None
    cpu_at_s: float | None = None
    limit: float | None = None
    started_s: float = 0.0


class TrainingTracker:
    """Per-node bookkeeping between rounds: values, CPU counters, arrivals and departures.

    Feed it `record_value` as values arrive and `start`/`stop` as jobs come
    and go; `view(now_s, cpu_totals_s)` then builds the round's
    `TrainingView`. Progress is measured between the newest value seen at the
    previous round and the newest now, so a round with no new value has no P
    (not a zero P: the job may just be between epochs).
    """

    def __init__(self, node: str, cores: float, stale_after_s: float = 60.0) -> None:
        if not (math.isfinite(cores) and cores > 0):
            raise ValueError(f"cores must be > 0, got {cores!r}")
        self.node = node
        self.cores = float(cores)
        self.stale_after_s = float(stale_after_s)
        self._jobs: dict[str, _JobTrack] = {}
        self._arrived: list[str] = []
        self._departed: list[str] = []
        self._stale: set[str] = set()

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(self._jobs)

    def start(self, name: str, now_s: float, limit: float | None = None) -> bool:
        """A job appeared on the node; False if it was known already."""
        if name in self._jobs:
            return False
        self._jobs[name] = _JobTrack(limit=limit, started_s=now_s)
        self._arrived.append(name)
        return True

    def stop(self, name: str) -> bool:
        """A job finished or vanished; False if it was not known."""
        if self._jobs.pop(name, None) is None:
            return False
        self._stale.discard(name)
        if name in self._arrived:
            self._arrived.remove(name)
        else:
            self._departed.append(name)
        return True

    def record_value(self, name: str, value: Any, now_s: float) -> str | None:
        """Accept one evaluation value; the reason it was refused, or None.

        A value for an unknown job starts it (the job reported before the
        runtime's start event reached us).
        """
        why = check_value(value)
        if why is not None:
            return f"job {name}: {why}; ignored"
        if name not in self._jobs:
            self.start(name, now_s)
        t = self._jobs[name]
        if t.first_value is None:
            t.first_value = float(value)
        t.value = float(value)
        t.value_at_s = now_s
        t.reports += 1
        self._stale.discard(name)
        return None

    def set_limit(self, name: str, limit: float | None) -> None:
        if name in self._jobs:
            self._jobs[name].limit = limit

    def is_stale(self, name: str) -> bool:
        return name in self._stale

    def newly_stale(self, now_s: float) -> tuple[str, ...]:
        """Jobs that have just gone `stale_after_s` without a value (each reported once)."""
        out = []
        for name, t in self._jobs.items():
            last = t.value_at_s if t.value_at_s is not None else t.started_s
            if now_s - last > self.stale_after_s and name not in self._stale:
                self._stale.add(name)
                out.append(name)
        return tuple(out)

    def view(self, now_s: float, cpu_totals_s: Mapping[str, float]) -> TrainingView:
        """This round's view; advances the measurement window of every job."""
        self.newly_stale(now_s)
        jobs = []
        for name, t in self._jobs.items():
            cpu_cores = None
            total = cpu_totals_s.get(name)
            if total is not None and math.isfinite(total):
                if t.cpu_total_s is not None and t.cpu_at_s is not None and now_s > t.cpu_at_s:
                    cpu_cores = max(0.0, total - t.cpu_total_s) / (now_s - t.cpu_at_s)
                t.cpu_total_s, t.cpu_at_s = float(total), now_s
            progress = None
            stale = name in self._stale
            if (not stale and t.value is not None and t.prev_value is not None and t.value_at_s is not None
                    and t.prev_value_at_s is not None and t.value_at_s > t.prev_value_at_s):
                progress = progress_per_s(t.prev_value, t.value, t.value_at_s - t.prev_value_at_s)
            if t.value is not None:
                t.prev_value, t.prev_value_at_s = t.value, t.value_at_s
            jobs.append(JobView(name=name, value=t.value, progress=progress, cpu_cores=cpu_cores,
                                growth=growth_efficiency(progress, cpu_cores), limit=t.limit, stale=stale,
                                reports=t.reports, first_value=t.first_value))
        arrived, departed = tuple(self._arrived), tuple(self._departed)
        self._arrived.clear()
        self._departed.clear()
        return TrainingView(node=self.node, now_s=now_s, cores=self.cores, jobs=tuple(jobs),
                            arrived=arrived, departed=departed)

    def apply(self, decision: TrainingDecision) -> None:
        """Remember the limits a decision put in force."""
        for j in decision.jobs:
            self.set_limit(j.name, j.new_limit)
