"""The benchmark's headline ratio (a policy's mean count over the oracle's in the same runs) and its
standard error over paired seeds, written out by hand."""

from __future__ import annotations

import math
import statistics

import pytest

from experiments.policies import Run, paired_ratio


def run(seed: int, policy: str, met: int, in_band: int, scenario: str = "s") -> Run:
    return Run(scenario, seed, policy, met, in_band, 0, 0, 1.0, 4.0, 0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0, 0)


def test_the_ratio_is_of_means_and_its_error_is_the_paired_delta_method():
    runs = [run(1, "learned", 9, 4), run(1, "oracle", 10, 5),
            run(2, "learned", 18, 7), run(2, "oracle", 20, 8),
            run(3, "learned", 30, 12), run(3, "oracle", 29, 12)]
    ratio, se = paired_ratio(runs, "learned", "oracle", "in_band")
    assert ratio == pytest.approx(23 / 25)
    residuals = [4 - ratio * 5, 7 - ratio * 8, 12 - ratio * 12]
    assert se == pytest.approx(statistics.stdev(residuals) / (math.sqrt(3) * 25 / 3))


def test_seeds_that_differ_only_in_difficulty_leave_no_error():
    # Every seed at 0.9 x the oracle, the oracle itself from 10 to 40: the spread is the seeds', not
    # the policy's.
    runs = [r for i, y in enumerate((10, 20, 30, 40)) for r in (run(i, "learned", 9 * y // 10, 0),
                                                              run(i, "oracle", y, 0))]
    ratio, se = paired_ratio(runs, "learned", "oracle", "met")
    assert ratio == pytest.approx(0.9) and se == pytest.approx(0.0, abs=1e-12)


def test_only_seeds_both_ran_are_paired_and_a_zero_oracle_gives_no_ratio():
    runs = [run(1, "learned", 5, 0), run(1, "oracle", 10, 0), run(2, "learned", 100, 0),
            run(1, "learned", 1, 0, scenario="t"), run(1, "oracle", 2, 0, scenario="t")]
    ratio, se = paired_ratio(runs, "learned", "oracle", "met")
    assert ratio == pytest.approx(6 / 12) and se is not None
    assert paired_ratio([run(1, "learned", 3, 0), run(1, "oracle", 0, 0)], "learned", "oracle", "met") == (None, None)
    assert paired_ratio([run(1, "learned", 3, 0), run(1, "oracle", 4, 0)], "learned", "oracle", "met") == (0.75, None)


def test_seeds_run_in_several_processes_give_the_runs_one_process_gives():
    from experiments.policies import POLICIES, run_all

    heard: list[str] = []
    one = run_all("paper-varied", (3, 4), prior_error=0.3)
    two = run_all("paper-varied", (3, 4), prior_error=0.3, workers=2, progress=heard.append)
    assert sorted(two, key=lambda r: (r.seed, r.policy)) == sorted(one, key=lambda r: (r.seed, r.policy))
    assert len(heard) == 2 * (len(POLICIES) + 1)  # every run is heard of, once its seed is done


def test_idle_cpu_is_never_below_zero_when_every_core_is_spent():
    # Default spends the node to the last core; summed in floats it can come out a hair above it.
    import dataclasses

    from experiments.policies import summarize, table

    spent = dataclasses.replace(run(1, "default", 5, 1), cpu_cores=0.1 + 0.2 + 3.7 + 1e-12, cores=4.0)
    s = summarize([spent])["default"]
    assert s["cpu_idle_cores_mean"] == 0.0
    assert "-0.00" not in table(summarize([spent]))
