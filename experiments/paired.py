"""Two policies, or one policy under two settings, run on the same seeds: what the difference is worth.

Why: a run's plateau counts a few last batches, one draw of the noise each for long ones, so one
policy ahead of another on a handful of seeds says little. Run on the same seeds (paired), the
seeds' spread in difficulty cancels, and each figure's mean difference with its standard error
says whether a change is worth making before anyone turns it on with `dqoes control`. Beside the
counted met and in band it reads the chances of each run's final allocation
(`SimResult.expected_met_final`, `expected_in_band_final`): the same allocations, read with a
fraction of the counts' error (docs/design/oracle.md, "The oracle under noise"). Every trial that
docs/decisions/ reports as "paired" is of this shape.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from experiments.common import ExperimentError, checked_entry
from experiments.policies import Run
from shared.core import registry
from shared.core.profiles import ModelProfile
from shared.scenarios.builtin import load
from shared.settings import policy_entry
from shared.sim.engine import simulate

FIGURES: tuple[tuple[str, str], ...] = (
    ("met", "met"),
    ("in_band", "in band"),
    ("expected_met", "met, as chances at the final limits"),
    ("expected_in_band", "in band, as chances at the final limits"),
    ("cpu_cores", "CPU spent (cores)"),
    ("changes_per_container", "limit changes per container"),
    ("container_settle_mean", "rounds moving a container's limit after its own arrival or change"),
)
"""The figures compared (a `Run` field each) and how they are named for people."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One side of the comparison: a policy and the settings it runs under (over the scenario's)."""

    policy: str
    settings: Mapping[str, float]

    @property
    def label(self) -> str:
        return policy_entry(self.policy, dict(self.settings))


def parse_entry(text: str) -> Entry:
    """`POLICY[:NAME=VALUE...]` as an Entry; ExperimentError naming what is wrong (an unknown policy, a
    parameter the policy does not have, a value it refuses)."""
    name, settings = checked_entry(text, registry.names(), "is not a policy of inference scenarios")
    return Entry(name, settings)


def run_pairs(
    scenario: str,
    seeds: Sequence[int],
    first: Entry,
    second: Entry,
    *,
    profiles: dict[str, ModelProfile] | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[Run, Run]]:
    """Both entries on every seed, in seed order; `progress(done, total)` hears of each seed done.

    Each run is deterministic in its seed, so the pairs are the same in any number of processes."""
    if first == second:
        raise ExperimentError(f"both sides are {first.label}: nothing to compare")
    if len(seeds) < 2:
        raise ExperimentError("at least two seeds: a difference over one seed has no standard error")
    load(scenario, seeds[0], profiles)  # a scenario that cannot load says so before anything runs
    jobs = [(scenario, seed, first, second, profiles) for seed in seeds]
    out: list[tuple[Run, Run]] = []
    if workers > 1:
        with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
            for pair in pool.map(_pair, jobs):
                out.append(pair)
                if progress:
                    progress(len(out), len(jobs))
        return out
    for job in jobs:
        out.append(_pair(job))
        if progress:
            progress(len(out), len(jobs))
    return out


def _pair(job: tuple[str, int, Entry, Entry, dict[str, ModelProfile] | None]) -> tuple[Run, Run]:
    scenario, seed, first, second, profiles = job
    sc = load(scenario, seed, profiles)
    runs = []
    for entry in (first, second):
        with_settings = dataclasses.replace(sc, settings={**sc.settings, **entry.settings})
        runs.append(Run.of(simulate(with_settings, entry.policy, seed), entry.label))
    return runs[0], runs[1]


def compare(pairs: Sequence[tuple[Run, Run]]) -> dict[str, Any]:
    """Each figure's mean on either side and the second side's less the first's, paired by seed, with
    that difference's standard error (the sd of the per-seed differences over sqrt(seeds))."""
    if not pairs:
        raise ExperimentError("no runs to compare")
    figures: dict[str, Any] = {}
    for key, name in FIGURES:
        xs = [getattr(a, key) for a, _ in pairs]
        ys = [getattr(b, key) for _, b in pairs]
        diffs = [y - x for x, y in zip(xs, ys, strict=True)]
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
        figures[key] = {"name": name, "first_mean": statistics.mean(xs), "second_mean": statistics.mean(ys),
                        "difference": statistics.mean(diffs), "difference_se": se}
    a, b = pairs[0]
    return {"scenario": a.scenario, "seeds": [p.seed for p, _ in pairs], "first": a.policy, "second": b.policy,
            "figures": figures}


def sentence(summary: dict[str, Any]) -> str:
    """What the comparison says about met and in band, in one line: a difference under two standard
    errors is not told apart from the noise of the seeds."""
    parts = []
    for key in ("expected_met", "expected_in_band"):
        f = summary["figures"][key]
        se = f["difference_se"]
        if se is None:
            parts.append(f"{f['name']}: {f['difference']:+.3f} (one seed)")
            continue
        verdict = ("the same on every seed" if se == 0 and f["difference"] == 0
                   else "not told apart from the seeds' noise" if abs(f["difference"]) < 2 * se
                   else "ahead" if f["difference"] > 0 else "behind")
        parts.append(f"{f['name']}: {f['difference']:+.3f} (se {se:.3f}), {verdict}")
    return f"{summary['second']} against {summary['first']} over {len(summary['seeds'])} seeds; " + "; ".join(parts)
