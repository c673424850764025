"""`dqoes experiment paired`: two policies, or one under two settings, on the same seeds.

The differences must be the runs' own (each side as `simulate` gives it on its own, the settings
reaching the policy and nothing else), the standard errors those of the per-seed differences, the
same in one process or two, and bad input one clear line that runs nothing."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest

from experiments import paired
from experiments.common import ExperimentError
from services.cli.main import main
from shared.scenarios.builtin import load
from shared.sim.engine import simulate

SCENARIO = "paper-varied"  # one node of ten containers: a run takes about half a second
SEEDS = [1, 2, 3]


@pytest.fixture(scope="module")
def pairs():
    return paired.run_pairs(SCENARIO, SEEDS, paired.parse_entry("learned"), paired.parse_entry("learned:dead_band=0.3"))


def test_an_entry_is_a_policy_and_the_settings_it_has():
    assert paired.parse_entry("learned") == paired.Entry("learned", {})
    e = paired.parse_entry("learned:dead_band=0.1:pool_work=0")
    assert (e.policy, dict(e.settings)) == ("learned", {"dead_band": 0.1, "pool_work": 0.0})
    assert e.label == "learned:dead_band=0.1:pool_work=0"


@pytest.mark.parametrize("text, needle", [
    ("nope", "'nope' is not a policy of inference scenarios"),
    ("learned:no_such=1", "has no parameter no_such"),
    ("oracle:dead_band=0.1", "has no parameter dead_band"),
    ("learned:dead_band=-3", "dead_band must be"),
    ("learned:dead_band", "NAME=VALUE"),
])
def test_a_bad_entry_is_refused_with_what_is_wrong(text, needle):
    with pytest.raises(ExperimentError, match=needle):
        paired.parse_entry(text)


def test_each_side_is_the_run_simulate_gives_with_its_own_settings(pairs):
    assert [(a.seed, b.seed) for a, b in pairs] == [(s, s) for s in SEEDS]
    for (a, b), seed in zip(pairs, SEEDS, strict=True):
        sc = load(SCENARIO, seed)
        alone = simulate(sc, "learned", seed)
        wide = simulate(dataclasses.replace(sc, settings={**sc.settings, "dead_band": 0.3}), "learned", seed)
        assert (a.met, a.in_band, a.limit_changes, a.expected_in_band) == (
            alone.met_final, alone.satisfied_final, alone.limit_changes, alone.expected_in_band_final)
        assert (b.met, b.in_band, b.limit_changes, b.expected_in_band) == (
            wide.met_final, wide.satisfied_final, wide.limit_changes, wide.expected_in_band_final)
        assert (a.policy, b.policy) == ("learned", "learned:dead_band=0.3")
    # The wider dead band moves limits less: the setting reached the policy.
    assert sum(b.limit_changes for _, b in pairs) < sum(a.limit_changes for a, _ in pairs)


def test_the_difference_and_its_error_are_the_paired_seeds(pairs):
    s = paired.compare(pairs)
    assert s["seeds"] == SEEDS and (s["first"], s["second"]) == ("learned", "learned:dead_band=0.3")
    assert [k for k, _ in paired.FIGURES] == list(s["figures"])
    for key, _ in paired.FIGURES:
        diffs = [getattr(b, key) - getattr(a, key) for a, b in pairs]
        f = s["figures"][key]
        assert f["difference"] == pytest.approx(statistics.mean(diffs))
        assert f["difference"] == pytest.approx(f["second_mean"] - f["first_mean"])
        assert f["difference_se"] == pytest.approx(statistics.stdev(diffs) / math.sqrt(len(diffs)))


def test_two_processes_give_the_same_pairs(pairs):
    again = paired.run_pairs(SCENARIO, SEEDS, paired.parse_entry("learned"),
                             paired.parse_entry("learned:dead_band=0.3"), workers=2)
    assert again == pairs


def test_the_sentence_tells_a_difference_from_the_seeds_noise():
    def summary(diff: float, se: float) -> dict:
        f = {"name": "in band, as chances", "difference": diff, "difference_se": se}
        return {"first": "a", "second": "b", "seeds": [1, 2], "figures": {"expected_met": f, "expected_in_band": f}}

    assert "behind" in paired.sentence(summary(-0.5, 0.1))
    assert "ahead" in paired.sentence(summary(0.5, 0.1))
    assert "not told apart" in paired.sentence(summary(0.15, 0.1))
    # Two settings that change nothing: no seed differs, so neither is ahead nor behind.
    same = paired.sentence(summary(0.0, 0.0))
    assert "the same on every seed" in same and "behind" not in same and "ahead" not in same
    assert "behind" in paired.sentence(summary(-0.25, 0.0))  # the same loss on every seed


def test_cli_text_and_json(capsys):
    assert main(["experiment", "paired", SCENARIO, "learned", "oracle", "--seeds", "1-2"]) == 0
    out = capsys.readouterr().out
    assert "first:  learned" in out and "second: oracle" in out
    assert "in band, as chances at the final limits" in out and "oracle against learned over 2 seeds" in out
    assert main(["experiment", "paired", SCENARIO, "learned", "oracle", "--seeds", "1-2", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert obj["seeds"] == [1, 2] and obj["second"] == "oracle"
    assert set(obj["figures"]) == {k for k, _ in paired.FIGURES}


@pytest.mark.parametrize("argv, needle", [
    ([SCENARIO, "learned", "learned", "--seeds", "1-2"], "nothing to compare"),
    ([SCENARIO, "learned", "oracle", "--seeds", "3"], "at least two seeds"),
    ([SCENARIO, "learned", "learned:nope=1", "--seeds", "1-2"], "has no parameter nope"),
    (["flowcon-3jobs", "learned", "oracle"], "training scenario"),
    (["no-such-scenario", "learned", "oracle", "--seeds", "1-2"], "unknown scenario"),
])
def test_cli_bad_input_is_one_line(capsys, argv, needle):
    assert main(["experiment", "paired", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
