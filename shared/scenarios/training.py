"""Training-job workloads: job profiles and the FlowCon paper's experiments as built-in scenarios.

Why here: a training scenario describes a workload (which jobs, which
profiles, when they are submitted, which workers), not how it runs; the
simulator (`shared.sim.training`) runs it in virtual time.

A profile is a job's measured shape: its evaluation value against epochs
done, E(e) = floor + (start - floor) * exp(-rate * e) (fitted to the real
workloads' curves by `python -m lab calibrate-training`), the CPU-seconds
one epoch costs, how many cores it can use alone (its threads), the
per-report noise of E, and how many epochs a job of this kind runs in the
paper-scale scenarios. The numbers, and which were measured on this machine
and which are assumed, are in docs/guide/training.md.
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class TrainingProfile:
    """How one kind of training job behaves (see the module docstring)."""

    name: str
    eval_fn: str
    """What E is: "reconstruction loss", "cross entropy", "squared loss"."""
    e_start: float
    e_floor: float
    rate_per_epoch: float
    cpu_s_per_epoch: float
    """CPU-seconds (one core for one second) one epoch costs."""
    demand_cores: float
    """Cores the job uses when alone on a large node (its threads x how busy they keep)."""
    epochs: int
    """Epochs a job of this kind runs in the built-in (paper-scale) scenarios."""
    noise_frac: float = 0.01
    """Standard deviation of one reported E, as a fraction of E (mini-batch noise)."""
    delay_epochs: float = 0.0
    """Epochs of plateau before the loss starts to fall (a CNN's first epochs)."""
    source: str = "assumed"
    """Where the curve came from ("measured <date> <machine>" or "assumed")."""

    def __post_init__(self) -> None:
        for f in ("e_start", "e_floor", "rate_per_epoch", "cpu_s_per_epoch", "demand_cores", "noise_frac",
                  "delay_epochs"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ValueError(f"profile {self.name}: {f} must be a finite number >= 0, got {v!r}")
        if self.cpu_s_per_epoch <= 0 or self.demand_cores <= 0 or self.epochs < 1:
            raise ValueError(f"profile {self.name}: cpu_s_per_epoch, demand_cores and epochs must be > 0")

    def value(self, epochs_done: float) -> float:
        x = max(0.0, epochs_done - self.delay_epochs)
        return self.e_floor + (self.e_start - self.e_floor) * math.exp(-self.rate_per_epoch * x)

    @property
    def work_cpu_s(self) -> float:
        return self.cpu_s_per_epoch * self.epochs


@dataclass(frozen=True, slots=True)
class TrainingJobSpec:
    name: str
    profile: str
    submit_s: float
    epochs: int | None = None
    """Overrides the profile's epochs."""


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    name: str
    cores: float


@dataclass(frozen=True, slots=True)
class PaperResult:
    """What the FlowCon paper reports for this experiment (FlowCon vs Docker Swarm)."""

    makespan_flowcon_s: float | None = None
    makespan_default_s: float | None = None
    mean_completion_flowcon_s: float | None = None
    mean_completion_default_s: float | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class TrainingScenario:
    name: str
    description: str
    workers: tuple[WorkerSpec, ...]
    jobs: tuple[TrainingJobSpec, ...]
    profiles: Mapping[str, TrainingProfile]
    seed: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Policy settings by field name (e.g. initial_interval_s)."""
    paper: PaperResult | None = None

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError(f"{self.name}: no workers")
        for j in self.jobs:
            if j.profile not in self.profiles:
                raise ValueError(f"{self.name}: job {j.name} has unknown profile {j.profile!r}")
        if len({j.name for j in self.jobs}) != len(self.jobs):
            raise ValueError(f"{self.name}: job names must be unique")

    def epochs_of(self, job: TrainingJobSpec) -> int:
        return job.epochs if job.epochs is not None else self.profiles[job.profile].epochs


# Built-in profiles: docs/calibration/training-profiles.toml, written by
# `python -m lab calibrate-training` from the real workloads (services/training) measured on this
# project's 2-core machine (docs/data/training-calibration.json): the curve (start, floor, rate, delay)
# and the noise are fitted; the CPU per epoch is the measured one x 51.7, so the mean job costs 500
# CPU-seconds (a few minutes alone on a 4-core worker, the paper's scale); the demands are assumed
# (the paper: jobs alone use 65-75% of a 4-vCPU worker). tests/unit/test_training_sim.py checks the
# two agree. docs/guide/training.md has the table.
_FIT = "fitted to 30 measured epochs (2026-11-23, vm, 1 thread); CPU x51.7"
BUILTIN_TRAINING_PROFILES: dict[str, TrainingProfile] = {
    p.name: p
    for p in (
        TrainingProfile("vae", "reconstruction loss", 172.254, 169.728, 1.4367, 7.493, 2.6, 60, 0.0005, 0, _FIT),
        TrainingProfile("cnn", "cross entropy", 2.2687, 1.1043, 0.1522, 6.167, 3.0, 60, 0.0152, 11, _FIT),
        TrainingProfile("mlp", "cross entropy", 2.2474, 0.7731, 0.2724, 6.145, 2.2, 60, 0.0245, 1, _FIT),
        TrainingProfile("lstm", "squared loss", 0.5456, 0.014, 0.8369, 6.766, 1.8, 60, 0.0149, 0, _FIT),
        TrainingProfile("gru", "squared loss", 0.4158, 0.0121, 0.9481, 15.095, 1.8, 60, 0.011, 0, _FIT),
    )
}
POOL = ("vae", "cnn", "mlp", "lstm", "gru")
"""The job pool random scenarios pick from (the paper's Table 1, in our own workloads)."""


def load_profiles(path: str | Path) -> dict[str, TrainingProfile]:
    """Profiles from a TOML file ([profiles.<name>] tables with the fields above); ValueError if bad."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None
    out = {}
    for name, fields in (data.get("profiles") or {}).items():
        try:
            out[name] = TrainingProfile(name=name, **fields)
        except TypeError as e:
            raise ValueError(f"{path}: profile {name}: {e}") from None
    return out


def profiles_toml(profiles: Mapping[str, TrainingProfile]) -> str:
    lines = []
    for p in profiles.values():
        lines.append(f"[profiles.{p.name}]")
        for f in ("eval_fn", "e_start", "e_floor", "rate_per_epoch", "cpu_s_per_epoch", "demand_cores", "epochs",
                  "noise_frac", "delay_epochs", "source"):
            v = getattr(p, f)
            lines.append(f"{f} = " + (f'"{v}"' if isinstance(v, str) else (f"{v}" if isinstance(v, int) else f"{v:.6g}")))
        lines.append("")
    return "\n".join(lines)


def _random_jobs(rng: random.Random, n: int, window_s: float) -> tuple[TrainingJobSpec, ...]:
    submits = sorted(rng.uniform(0, window_s) for _ in range(n))
    submits[0] = 0.0
    return tuple(TrainingJobSpec(f"job-{i + 1:02d}", rng.choice(POOL), round(s, 1)) for i, s in enumerate(submits))


def _scenario(name: str, desc: str, workers: list[WorkerSpec], jobs: tuple[TrainingJobSpec, ...], seed: int | None,
              profiles: Mapping[str, TrainingProfile] | None, paper: PaperResult | None) -> TrainingScenario:
    return TrainingScenario(name=name, description=desc, workers=tuple(workers), jobs=jobs,
                            profiles=dict(profiles or BUILTIN_TRAINING_PROFILES), seed=seed, paper=paper)


PAPER_WORKER_CORES = 4.0
"""The paper's Google Cloud workers: 4 vCPUs (its single worker, a CloudLab R320, we give the same)."""


def three_jobs(seed: int | None = None, profiles: Mapping[str, TrainingProfile] | None = None) -> TrainingScenario:
    jobs = (TrainingJobSpec("job-1-vae", "vae", 0.0), TrainingJobSpec("job-2-cnn", "cnn", 40.0),
            TrainingJobSpec("job-3-mlp", "mlp", 80.0))
    return _scenario("flowcon-3jobs", "Figs. 3-4: one worker, VAE at 0 s, a CNN classifier at 40 s, an MLP at 80 s",
                     [WorkerSpec("worker-1", PAPER_WORKER_CORES)], jobs, seed, profiles,
                     PaperResult(note="CPU shares only (VAE ~25%, MNIST ~75% after 40 s); no times given"))


def _single(n: int, makespans: tuple[float, float]) -> Callable[..., TrainingScenario]:
    def make(seed: int | None = None, profiles: Mapping[str, TrainingProfile] | None = None) -> TrainingScenario:
        rng = random.Random(f"flowcon-{n}jobs-{seed}")
        return _scenario(f"flowcon-{n}jobs", f"Fig. {5 if n == 10 else 8}: one worker, {n} random jobs within [0, 200 s]",
                         [WorkerSpec("worker-1", PAPER_WORKER_CORES)], _random_jobs(rng, n, 200.0), seed, profiles,
                         PaperResult(*makespans))
    return make


def _multi(name: str, desc: str, cores: list[float], n: int, window_s: float, paper: PaperResult
           ) -> Callable[..., TrainingScenario]:
    def make(seed: int | None = None, profiles: Mapping[str, TrainingProfile] | None = None) -> TrainingScenario:
        rng = random.Random(f"{name}-{seed}")
        workers = [WorkerSpec(f"worker-{i + 1}", c) for i, c in enumerate(cores)]
        return _scenario(name, desc, workers, _random_jobs(rng, n, window_s), seed, profiles, paper)
    return make


TRAINING_BUILTINS: dict[str, Callable[..., TrainingScenario]] = {
    "flowcon-3jobs": three_jobs,
    "flowcon-10jobs": _single(10, (1350.7, 1384.9)),
    "flowcon-15jobs": _single(15, (1950.9, 1980.1)),
    "flowcon-4w-20jobs": _multi("flowcon-4w-20jobs", "Fig. 13: 4 workers of 4 cores, 20 random jobs within [0, 600 s]",
                                [4.0] * 4, 20, 600.0, PaperResult(1089.9, 1330.0, 431.9, 532.8)),
    "flowcon-4w-40jobs": _multi("flowcon-4w-40jobs", "Fig. 14: 4 workers of 4 cores, 40 random jobs within [0, 600 s]",
                                [4.0] * 4, 40, 600.0,
                                PaperResult(2490.8, 2860.2, note="mean completion -8.9% (times not given)")),
    "flowcon-8w-60jobs-homogeneous": _multi(
        "flowcon-8w-60jobs-homogeneous", "Fig. 15: 8 workers of 4 cores, 60 random jobs within [0, 1000 s]",
        [4.0] * 8, 60, 1000.0, PaperResult(3851.5, 4151.7, note="mean completion -1.2% (times not given)")),
    "flowcon-8w-60jobs-heterogeneous": _multi(
        "flowcon-8w-60jobs-heterogeneous",
        "Fig. 16: 8 workers, two each of 2, 4, 8 and 16 cores, 60 random jobs within [0, 1000 s]",
        [2.0, 2.0, 4.0, 4.0, 8.0, 8.0, 16.0, 16.0], 60, 1000.0,
        PaperResult(1600.3, 1770.4, note="mean completion -0.8% (times not given)")),
}


def load_training(name: str, seed: int | None = None,
                  profiles: Mapping[str, TrainingProfile] | None = None) -> TrainingScenario:
    """A built-in training scenario; `profiles` replace built-ins of the same names."""
    try:
        make = TRAINING_BUILTINS[name]
    except KeyError:
        raise ValueError(f"unknown training scenario {name!r} (choose from {', '.join(TRAINING_BUILTINS)})") from None
    merged = {**BUILTIN_TRAINING_PROFILES, **(profiles or {})}
    return make(seed, merged)


def with_epochs(profile: TrainingProfile, epochs: int) -> TrainingProfile:
    return replace(profile, epochs=epochs)
