"""Every policy on many random clusters: met, in band and CPU, each against the oracle.

Why: a policy is judged on scenarios it was not tuned on, over many seeds,
by what a client counts (met), by the paper's figure (in band) and by what it
costs (CPU), side by side and always as means over seeds. This module runs
the simulator for each (scenario, seed, policy), optionally telling the
learned allocator a calibrated profile that is off by a known factor per
model (to show what a wrong prior costs), and sums the runs up.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from shared.core.policy import PolicyContext
from shared.scenarios.builtin import load
from shared.scenarios.spec import Scenario
from shared.sim.engine import SimResult, policy_context, simulate

POLICIES = ("default", "dqoes", "learned", "oracle")


@dataclass(frozen=True, slots=True)
class Run:
    """One (scenario, seed, policy) run's figures."""

    scenario: str
    seed: int
    policy: str
    met: int
    in_band: int
    oracle_met: int
    oracle_in_band: int
    cpu_cores: float
    cores: float
    limit_changes: int
    changes_per_container_round: float
    changes_per_container: float
    settle_rounds_max: int
    settle_rounds_mean: float
    settle_s_max: float
    container_settle_max: int
    container_settle_mean: float
    rounds: int
    ceiling_met: float = 0.0
    ceiling_in_band: float = 0.0
    noise_oracle_met: float = 0.0
    noise_oracle_in_band: float = 0.0
    noise_oracle_met_median: int = 0
    noise_oracle_in_band_median: int = 0
    change_settle_mean: float = 0.0
    """Rounds moving a limit after each change on a node, before its next (mean over changes)."""
    changes_settled_within_3: float = 1.0
    container_plan_settle_mean: float = 0.0
    """As container_settle_mean, on the plan's limits (a move laid over a plan for one batch left out)."""
    change_plan_settle_mean: float = 0.0
    plan_changes_settled_within_3: float = 1.0
    expected_met: float = 0.0
    """Its final allocation's expected met (SimResult.expected_met_final): no draw of the last batches."""
    expected_in_band: float = 0.0

    @classmethod
    def of(cls, r: SimResult, label: str) -> Run:
        return cls(r.scenario, r.seed, label, r.met_final, r.satisfied_final, r.oracle_met, r.oracle_satisfied,
                   r.cpu_cores_final, r.cores_total, r.limit_changes, r.changes_per_container_round,
                   r.limit_changes / max(1, r.containers), int(r.settle.get("rounds_max", 0)),
                   float(r.settle.get("rounds_mean", 0.0)), float(r.settle.get("seconds_max", 0.0)),
                   int(r.settle.get("container_rounds_max", 0)), float(r.settle.get("container_rounds_mean", 0.0)),
                   r.rounds, r.ceiling_met, r.ceiling_in_band, r.oracle_noise_met, r.oracle_noise_in_band,
                   r.oracle_noise_met_median, r.oracle_noise_in_band_median,
                   float(r.settle.get("change_rounds_mean", 0.0)), float(r.settle.get("changes_settled_within_3", 1.0)),
                   float(r.settle.get("plan_container_rounds_mean", 0.0)),
                   float(r.settle.get("plan_change_rounds_mean", 0.0)),
                   float(r.settle.get("plan_changes_settled_within_3", 1.0)), r.expected_met_final,
                   r.expected_in_band_final)


def skewed_prior(scenario: Scenario, error: float, seed: int) -> PolicyContext:
    """Each model's curve with its work per batch off by a factor of 1 +- `error` (drawn per model)."""
    rng = random.Random(f"prior:{seed}")
    factors = {m: rng.choice((1 - error, 1 + error)) for m in sorted(scenario.profiles)}
    model = {c.name: c.model for c in scenario.containers}
    return policy_context(scenario, lambda name: factors[model[name]])


def run_all(
    scenario: str,
    seeds: Sequence[int],
    *,
    prior_error: float | None = None,
    progress: Callable[[str], None] | None = None,
    workers: int = 1,
) -> list[Run]:
    """Every policy on every seed; with `prior_error`, also the learned allocator with a wrong prior.

    With `workers` > 1 the seeds run in that many processes (each run is deterministic in its seed, so
    the runs are the same); `progress` then hears of a seed's runs when the seed is done."""
    if workers > 1 and len(seeds) > 1:
        out: list[Run] = []
        with ProcessPoolExecutor(min(workers, len(seeds))) as pool:
            for runs in pool.map(_one_seed, [(scenario, seed, prior_error) for seed in seeds]):
                for r in runs:
                    if progress:
                        progress(f"{scenario} seed {r.seed} {r.policy}")
                out.extend(runs)
        return out
    out = []
    for seed in seeds:
        out.extend(_one_seed((scenario, seed, prior_error), progress))
    return out


def _one_seed(job: tuple[str, int, float | None], progress: Callable[[str], None] | None = None) -> list[Run]:
    scenario, seed, prior_error = job
    sc = load(scenario, seed)
    out = []
    for policy in POLICIES:
        if progress:
            progress(f"{scenario} seed {seed} {policy}")
        out.append(Run.of(simulate(sc, policy, seed), policy))
    if prior_error is not None:
        with_prior = dataclasses.replace(sc, settings={**sc.settings, "use_prior": 1.0})
        label = f"learned+prior±{prior_error:.0%}"
        if progress:
            progress(f"{scenario} seed {seed} {label}")
        out.append(Run.of(simulate(with_prior, "learned", seed, context=skewed_prior(sc, prior_error, seed)),
                          label))
    return out


def summarize(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """Means over seeds per policy, and each count's ratio to the oracle's noise-free bound and to the
    oracle under the run's noise (ratios of sums over seeds)."""
    out: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(r.policy for r in runs):
        rs = [r for r in runs if r.policy == label]
        met, band = sum(r.met for r in rs), sum(r.in_band for r in rs)
        o_met, o_band = sum(r.oracle_met for r in rs), sum(r.oracle_in_band for r in rs)
        # The same statistic as the policy's count: per node, the lower median of the count.
        n_met, n_band = sum(r.noise_oracle_met_median for r in rs), sum(r.noise_oracle_in_band_median for r in rs)
        out[label] = {
            "seeds": len(rs),
            "met_mean": statistics.mean(r.met for r in rs),
            "met_se": _se([r.met for r in rs]),
            "in_band_mean": statistics.mean(r.in_band for r in rs),
            "in_band_se": _se([r.in_band for r in rs]),
            "met_to_oracle": met / o_met if o_met else None,
            "in_band_to_oracle": band / o_band if o_band else None,
            "oracle_met_mean": statistics.mean(r.oracle_met for r in rs),
            "oracle_in_band_mean": statistics.mean(r.oracle_in_band for r in rs),
            "met_to_noise_oracle": met / n_met if n_met else None,
            "in_band_to_noise_oracle": band / n_band if n_band else None,
            "noise_oracle_met_mean": statistics.mean(r.noise_oracle_met for r in rs),
            "noise_oracle_in_band_mean": statistics.mean(r.noise_oracle_in_band for r in rs),
            "noise_oracle_met_median_mean": statistics.mean(r.noise_oracle_met_median for r in rs),
            "noise_oracle_in_band_median_mean": statistics.mean(r.noise_oracle_in_band_median for r in rs),
            "ceiling_met_mean": statistics.mean(r.ceiling_met for r in rs),
            "ceiling_in_band_mean": statistics.mean(r.ceiling_in_band for r in rs),
            "expected_met_mean": statistics.mean(r.expected_met for r in rs),
            "expected_in_band_mean": statistics.mean(r.expected_in_band for r in rs),
            "cpu_cores_mean": statistics.mean(r.cpu_cores for r in rs),
            "cpu_cores_se": _se([r.cpu_cores for r in rs]),
            "cpu_idle_cores_mean": statistics.mean(max(0.0, r.cores - r.cpu_cores) for r in rs),  # no float dust below 0
            "settle_rounds_max_mean": statistics.mean(r.settle_rounds_max for r in rs),
            "settle_rounds_max_worst": max(r.settle_rounds_max for r in rs),
            "settle_rounds_mean": statistics.mean(r.settle_rounds_mean for r in rs),
            "settle_s_max_mean": statistics.mean(r.settle_s_max for r in rs),
            "container_settle_max_mean": statistics.mean(r.container_settle_max for r in rs),
            "container_settle_mean": statistics.mean(r.container_settle_mean for r in rs),
            "change_settle_mean": statistics.mean(r.change_settle_mean for r in rs),
            "changes_settled_within_3": statistics.mean(r.changes_settled_within_3 for r in rs),
            "container_plan_settle_mean": statistics.mean(r.container_plan_settle_mean for r in rs),
            "change_plan_settle_mean": statistics.mean(r.change_plan_settle_mean for r in rs),
            "plan_changes_settled_within_3": statistics.mean(r.plan_changes_settled_within_3 for r in rs),
            "changes_per_container_round": statistics.mean(r.changes_per_container_round for r in rs),
            "changes_per_container": statistics.mean(r.changes_per_container for r in rs),
            "rounds_mean": statistics.mean(r.rounds for r in rs),
        }
    return out


def _se(xs: Sequence[float]) -> float | None:
    """The standard error of the mean over seeds (None below two)."""
    return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None


def paired_ratio(runs: Sequence[Run], label: str, ref: str, count: str) -> tuple[float | None, float | None]:
    """`label`'s mean `count` over `ref`'s in the same (scenario, seed) runs, and its standard error.

    The ratio of means R = sum x / sum y; its standard error by the delta method over the paired
    seeds, sd(x - R y) / (sqrt(n) mean(y)): the seeds' spread in difficulty, common to both
    policies, cancels. (None, None) when `ref` counts nothing; the error is None below two pairs."""
    ours = {(r.scenario, r.seed): getattr(r, count) for r in runs if r.policy == label}
    theirs = {(r.scenario, r.seed): getattr(r, count) for r in runs if r.policy == ref}
    keys = sorted(ours.keys() & theirs.keys())
    xs, ys = [ours[k] for k in keys], [theirs[k] for k in keys]
    if not keys or sum(ys) <= 0:
        return None, None
    ratio = sum(xs) / sum(ys)
    if len(keys) < 2:
        return ratio, None
    residuals = [x - ratio * y for x, y in zip(xs, ys, strict=True)]
    return ratio, statistics.stdev(residuals) / (math.sqrt(len(keys)) * statistics.mean(ys))


def table(summary: dict[str, dict[str, Any]]) -> str:
    """The summary as a Markdown table."""
    def ratio(x: float | None) -> str:
        return "n/a (oracle 0)" if x is None else f"{x:.3f}"

    lines = [
        "| policy | met (mean) | met / oracle bound | met / oracle under noise | in band (mean) | in band / oracle bound "
        "| in band / oracle under noise | CPU spent (cores) | idle (cores) "
        "| rounds moving a node's limits after the last change anywhere (mean of per-run max; worst) "
        "| rounds moving a container's limit after its own arrival or change (mean; mean of per-run max) "
        "| rounds moving a node's limits after each change there (mean; share of changes within 3) "
        "| limit changes per container per round | limit changes per container |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, s in summary.items():
        lines.append(
            f"| {label} | {s['met_mean']:.1f} | {ratio(s['met_to_oracle'])} | {ratio(s['met_to_noise_oracle'])} | "
            f"{s['in_band_mean']:.1f} | {ratio(s['in_band_to_oracle'])} | {ratio(s['in_band_to_noise_oracle'])} | "
            f"{s['cpu_cores_mean']:.2f} | {s['cpu_idle_cores_mean']:.2f} | "
            f"{s['settle_rounds_max_mean']:.1f}; {s['settle_rounds_max_worst']} | "
            f"{s['container_settle_mean']:.2f}; {s['container_settle_max_mean']:.1f} | "
            f"{s['change_settle_mean']:.2f}; {s['changes_settled_within_3']:.2f} | "
            f"{s['changes_per_container_round']:.3f} | {s['changes_per_container']:.1f} |"
        )
    return "\n".join(lines)
