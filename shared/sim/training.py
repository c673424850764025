"""Training jobs in virtual time: FlowCon against default Swarm on the same seed.

Why: the paper's multi-worker experiments (up to 60 jobs on 8 workers, over
an hour each) cannot run on a 2-core machine; the simulator runs them in
seconds with the same core a live worker would run (`TrainingTracker` and a
training policy from the registry on every worker, the registry's
placement on the manager).

Physics, per tick of `dt_s`: a worker's cores are shared like the kernel's
CFS does without weights: each job may use up to min(its own demand, its
limit x the node's cores) and the cores are water-filled equally among the
jobs up to those caps (a limit is a hard cap, as `docker update --cpus` sets
it; CPU a capped job cannot take goes to the others). A job's work advances
by the CPU it got; every tick it reports E at its epochs done (with the
profile's noise, seeded). It finishes after its epochs' CPU-seconds.

The manager sees each worker's report from that worker's last round (stale
between rounds) plus the jobs it placed there since: both policies place
with the same information.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from shared.core import registry
from shared.core.training import TrainingTracker, WorkerReport
from shared.scenarios.training import TrainingScenario


@dataclass
class _Job:
    name: str
    profile: str
    submit_s: float
    work_cpu_s: float
    cpu_s_per_epoch: float
    demand_cores: float
    node: str = ""
    done_cpu_s: float = 0.0
    limit: float | None = None
    finish_s: float | None = None


@dataclass
class _Worker:
    name: str
    cores: float
    tracker: TrainingTracker
    policy: Any
    next_round_s: float = 0.0
    due: bool = False
    report: WorkerReport | None = None
    pending: int = 0
    jobs: dict[str, _Job] = field(default_factory=dict)


@dataclass
class TrainingSimResult:
    scenario: str
    policy: str
    seed: int
    submit_s: dict[str, float]
    finish_s: dict[str, float]
    placement: dict[str, str]
    profile_of: dict[str, str]
    rounds: int
    limit_changes: int
    free_competition_s: float
    """Seconds of worker time spent with every job completing (FlowCon's free competition)."""
    timeline: list[dict[str, Any]]

    @property
    def completion_s(self) -> dict[str, float]:
        return {j: round(self.finish_s[j] - self.submit_s[j], 2) for j in self.finish_s}

    @property
    def makespan_s(self) -> float:
        return round(max(self.finish_s.values()) - min(self.submit_s.values()), 2) if self.finish_s else 0.0

    @property
    def mean_completion_s(self) -> float:
        return round(statistics.mean(self.completion_s.values()), 2) if self.finish_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "seed": self.seed,
            "jobs": len(self.submit_s),
            "finished": len(self.finish_s),
            "completion_s": self.completion_s,
            "makespan_s": self.makespan_s,
            "mean_completion_s": self.mean_completion_s,
            "placement": self.placement,
            "profile": self.profile_of,
            "rounds": self.rounds,
            "limit_changes": self.limit_changes,
            "free_competition_s": round(self.free_competition_s, 1),
        }


def water_fill(cores: float, caps: dict[str, float]) -> dict[str, float]:
    """Share `cores` equally among jobs, none above its cap; what a capped job leaves goes to the rest."""
    out = {n: 0.0 for n in caps}
    left = cores
    open_ = {n for n, c in caps.items() if c > 0}
    while open_ and left > 1e-12:
        each = left / len(open_)
        done = {n for n in open_ if caps[n] - out[n] <= each}
        if not done:
            for n in open_:
                out[n] += each
            break
        for n in done:
            left -= caps[n] - out[n]
            out[n] = caps[n]
        open_ -= done
    return out


def simulate_training(sc: TrainingScenario, policy: str, seed: int = 1, dt_s: float = 1.0, record: bool = False,
                      max_s: float = 50_000.0) -> TrainingSimResult:
    """Run `sc` under the training policy `policy` (a registry name) until every job has finished."""
    registry.training_spec(policy)  # ValueError naming the choices
    rng = random.Random(f"train-noise-{sc.name}-{seed}")
    workers = {
        w.name: _Worker(w.name, w.cores, TrainingTracker(w.name, w.cores, stale_after_s=1e9),
                        registry.build_training(policy, sc.settings))
        for w in sc.workers
    }
    queue = sorted(sc.jobs, key=lambda j: (j.submit_s, j.name))
    jobs: dict[str, _Job] = {}
    placement: dict[str, str] = {}
    timeline: list[dict[str, Any]] = []
    rounds = changes = 0
    free_s = 0.0
    t = 0.0
    qi = 0
    while (qi < len(queue) or any(j.finish_s is None for j in jobs.values())) and t < max_s:
        # Submissions: the manager places each with the policy's placement on the reports it has.
        while qi < len(queue) and queue[qi].submit_s <= t + 1e-9:
            spec = queue[qi]
            qi += 1
            prof = sc.profiles[spec.profile]
            reports = {n: w.report or WorkerReport(n, t, w.cores, ()) for n, w in workers.items()}
            pending = {n: w.pending for n, w in workers.items()}
            node, why = registry.place_training(policy, reports, pending)
            w = workers[node]
            w.pending += 1
            job = _Job(spec.name, spec.profile, spec.submit_s, prof.cpu_s_per_epoch * sc.epochs_of(spec),
                       prof.cpu_s_per_epoch, prof.demand_cores, node=node)
            jobs[spec.name] = job
            w.jobs[spec.name] = job
            w.tracker.start(spec.name, t)
            w.tracker.record_value(spec.name, prof.value(0.0), t)
            w.due = True
            placement[spec.name] = node
            if record:
                timeline.append({"kind": "place", "t": t, "job": spec.name, "node": node, "why": why})
        # Rounds: on the interval, or at once after an arrival or departure (Algorithm 2's listener).
        for w in workers.values():
            if not w.jobs and not w.due:
                continue
            if w.due or t >= w.next_round_s - 1e-9:
                totals = {n: j.done_cpu_s for n, j in w.jobs.items()}
                view = w.tracker.view(t, totals)
                dec = w.policy.decide(view)
                w.tracker.apply(dec)
                rounds += 1
                for jd in dec.jobs:
                    job = w.jobs[jd.name]
                    if jd.new_limit != job.limit:
                        changes += 1
                    job.limit = jd.new_limit
                    if record:
                        timeline.append({"kind": "job", "t": t, "node": w.name, "job": jd.name, "stage": jd.stage,
                                         "growth": jd.growth, "progress": jd.progress, "cpu_cores": jd.cpu_cores,
                                         "limit": jd.new_limit, "cpu_share": (jd.cpu_cores or 0.0) / w.cores})
                w.report = w.policy.report(dec)
                w.pending = 0
                w.due = False
                w.next_round_s = t + dec.interval_s
        # Physics over [t, t + dt).
        for w in workers.values():
            if not w.jobs:
                continue
            caps = {n: min(j.demand_cores, j.limit * w.cores if j.limit is not None else math.inf)
                    for n, j in w.jobs.items()}
            share = water_fill(w.cores, caps)
            if isinstance(w.report, WorkerReport) and w.report.jobs and all(j.stage == "CL" for j in w.report.jobs):
                free_s += dt_s
            for n, job in list(w.jobs.items()):
                got = share[n] * dt_s
                left = job.work_cpu_s - job.done_cpu_s
                if share[n] > 0 and got >= left:
                    job.finish_s = t + left / share[n]
                    job.done_cpu_s = job.work_cpu_s
                    del w.jobs[n]
                    w.tracker.stop(n)
                    w.due = True
                    continue
                job.done_cpu_s += got
                prof = sc.profiles[job.profile]
                e = prof.value(job.done_cpu_s / job.cpu_s_per_epoch)
                w.tracker.record_value(n, max(0.0, e * (1 + prof.noise_frac * rng.gauss(0, 1))), t + dt_s)
        t += dt_s
    return TrainingSimResult(
        scenario=sc.name, policy=policy, seed=seed,
        submit_s={j.name: j.submit_s for j in jobs.values()},
        finish_s={j.name: j.finish_s for j in jobs.values() if j.finish_s is not None},
        placement=placement, profile_of={j.name: j.profile for j in jobs.values()},
        rounds=rounds, limit_changes=changes, free_competition_s=free_s, timeline=timeline,
    )
