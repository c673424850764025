"""Default Docker Swarm for training jobs: no limits, spread placement.

The baseline FlowCon is compared with (the paper's "DS"): Swarm sets no CPU
limits, so the kernel's fair share divides a node among its jobs, and it
places each new job on the node with the fewest running ones. The policy
still measures every job's growth efficiency with the same tracker, so the
dashboard and the reports show both policies with one ruler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.core.policy import PolicySpec, check_interval
from shared.core.training import (
    JobDecision,
    JobReport,
    TrainingDecision,
    TrainingView,
    WorkerReport,
)


@dataclass(frozen=True, slots=True)
class TrainingDefaultParams:
    """Only how often it observes: Swarm itself has no knobs here."""

    initial_interval_s: float = 10.0
    """Seconds between observations (it never changes a limit)."""

    def __post_init__(self) -> None:
        check_interval(self.initial_interval_s)


class TrainingDefaultPolicy:
    name = "default"

    def __init__(self, params: TrainingDefaultParams | None = None) -> None:
        self.params = params or TrainingDefaultParams()
        self.cores = 0.0
        self.last_growth: dict[str, float] = {}

    @property
    def initial_interval_s(self) -> float:
        return float(self.params.initial_interval_s)

    def set_params(self, params: TrainingDefaultParams) -> None:
        self.params = params

    def decide(self, view: TrainingView) -> TrainingDecision:
        self.cores = view.cores
        for gone in set(self.last_growth) - {j.name for j in view.jobs}:
            del self.last_growth[gone]
        self.last_growth.update({j.name: j.growth for j in view.jobs if j.growth is not None})
        jobs = tuple(JobDecision(name=j.name, stage="-", growth=j.growth, progress=j.progress, cpu_cores=j.cpu_cores,
                                 old_limit=j.limit, new_limit=j.limit, reason="default: no limits")
                     for j in view.jobs)
        return TrainingDecision(node=view.node, now_s=view.now_s, policy=self.name, jobs=jobs,
                                interval_s=self.initial_interval_s)

    def report(self, decision: TrainingDecision) -> WorkerReport:
        return WorkerReport(node=decision.node, now_s=decision.now_s, cores=self.cores,
                            jobs=tuple(JobReport(name=j.name, stage="-", growth=self.last_growth.get(j.name))
                                       for j in decision.jobs))


def spread(reports: Mapping[str, WorkerReport], pending: Mapping[str, int] | None = None) -> tuple[str, str]:
    """Swarm's spread: the worker with the fewest jobs (reported plus placed since), ties by name."""
    if not reports:
        raise ValueError("no workers to place on")
    pend = pending or {}
    count = {n: len(r.jobs) + pend.get(n, 0) for n, r in reports.items()}
    best = min(count, key=lambda n: (count[n], n))
    return best, f"spread: fewest jobs ({count[best]})"


SPEC = PolicySpec(
    name="default",
    label="default Swarm",
    summary="default Docker Swarm for training jobs: no CPU limits (fair share), spread placement (the baseline)",
    params_type=TrainingDefaultParams,
    factory=lambda params, context: TrainingDefaultPolicy(params),
    kind="training",
    placement=spread,
)
