"""`make bench-stress`'s runner: every policy on a variant, figures printed, JSON and the summary docs/results.md is
rendered from written."""

from __future__ import annotations

import orjson
import pytest

from bench import bench_stress
from bench.bench_policies import run_sets
from lab import results_page


def test_a_stress_run_writes_its_figures_and_its_summary(tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    monkeypatch.setenv("DQOES_BENCH_DATA", str(data))
    out = tmp_path / "stress.json"
    figures = run_sets([("random-cluster-crowded", (2,))], None, out, bench_stress.KEY)

    key = "random-cluster-crowded, seeds 2-2"
    assert set(figures) == {key}
    met = figures[key]["learned_met_to_oracle_policy"]
    assert met["goal"] == 0.97 and met["value"] > 0
    saved = orjson.loads(out.read_bytes())[key]
    # Every policy ran the seed once; no run with a prior was asked for.
    assert sorted(r["policy"] for r in saved["runs"]) == ["default", "dqoes", "learned", "oracle"]
    summary = orjson.loads((data / "bench-stress.json").read_bytes())
    assert summary["command"] == "make bench-stress"
    (one,) = summary["sets"]
    assert (one["scenario"], one["seeds"], one["n"]) == ("random-cluster-crowded", "2-2", 1)
    assert set(one["policies"]) == {"default", "dqoes", "learned", "oracle"}
    assert one["policies"]["learned"]["met"] == saved["summary"]["learned"]["met_mean"]
    assert one["to_oracle_policy"]["learned"]["met"][0] == met["value"]
    # The page renders a row per policy and the bound from it.
    assert "| random-cluster-crowded, 2-2 (1 seeds) | learned |" in "\n".join(results_page.bench_table(summary))
    printed = capsys.readouterr().out
    # The printed figures carry the name the JSON and the section use.
    assert f"{key}: learned met / oracle policy (same runs)" in printed


def test_the_stress_suite_runs_every_variant_on_the_held_out_seeds(monkeypatch):
    seen = {}

    def fake(sets, prior_error, out, key):
        seen.update(sets=sets, prior_error=prior_error, out=out, key=key)
        return {}

    monkeypatch.setattr(bench_stress, "run_sets", fake)
    bench_stress.run()
    from shared.scenarios.builtin import STRESS

    assert [name for name, _ in seen["sets"]] == list(STRESS)
    assert all(seeds == tuple(range(1001, 1021)) for _, seeds in seen["sets"])
    assert seen["prior_error"] is None and seen["key"] == "stress"


def test_sets_of_one_scenario_are_also_pooled_over_all_their_seeds(tmp_path, monkeypatch):
    monkeypatch.setenv("DQOES_BENCH_DATA", str(tmp_path))
    out = tmp_path / "two.json"
    sets = [("random-cluster-crowded", (2,)), ("random-cluster-crowded", (3,)), ("random-cluster-scarce", (2,))]
    figures = run_sets(sets, None, out, bench_stress.KEY)

    pooled = "random-cluster-crowded, every set above"
    # Only the scenario run in more than one set is pooled.
    assert set(figures) == {"random-cluster-crowded, seeds 2-2", "random-cluster-crowded, seeds 3-3",
                            "random-cluster-scarce, seeds 2-2", pooled}
    saved = orjson.loads(out.read_bytes())
    runs = saved["random-cluster-crowded, seeds 2-2"]["runs"] + saved["random-cluster-crowded, seeds 3-3"]["runs"]

    def total(policy, count):
        return sum(r[count] for r in runs if r["policy"] == policy)

    band = figures[pooled]["learned_in_band_to_oracle_policy"]
    # The ratio of sums over both sets' seeds, not a mean of the two sets' ratios.
    assert band["value"] == pytest.approx(total("learned", "in_band") / total("oracle", "in_band"))
    assert band["goal"] == 0.95 and band["se"] is not None
    met = figures[pooled]["learned_met_to_oracle_policy"]
    assert met["value"] == pytest.approx(total("learned", "met") / total("oracle", "met"))
    assert saved[pooled]["pooled"] == 2
    stored = orjson.loads((tmp_path / "bench-stress.json").read_bytes())["sets"]
    assert stored[-1] == {"scenario": "random-cluster-crowded", "seeds": "every held-out set above", "n": 2,
                          "to_oracle_policy": {"learned": {"met": [met["value"], met["se"]],
                                                           "in_band": [band["value"], band["se"]]}}}
    # Each set's means carry their standard error over its seeds (none for a set of one seed).
    assert all(p["met_se"] is None for s in stored[:-1] for p in s["policies"].values())


def test_a_quicker_look_at_a_few_seeds_keeps_the_held_out_results_as_they_are(tmp_path, monkeypatch, capsys):
    from bench import bench_policies

    seen = {}

    def fake(sets, prior_error, out, key, *, update=True):
        seen.update(sets=sets, out=out, update=update)
        return {}

    monkeypatch.setattr(bench_policies, "run_sets", fake)
    monkeypatch.setenv("DQOES_BENCH_SEEDS", "1001-1002")
    bench_policies.run()
    assert seen["out"].name == "policies-seeds-1001-1002.json" and seen["update"] is False
    assert [seeds for _, seeds in seen["sets"]] == [(1001, 1002)] * len(bench_policies.SCENARIOS)
    monkeypatch.delenv("DQOES_BENCH_SEEDS")
    bench_policies.run()
    assert seen["out"] == bench_policies.OUT and seen["update"] is True
    # And a run that is not to update the summary says so, leaving the file as it was.
    stored = tmp_path / "bench-stress.json"
    stored.write_text("old")
    monkeypatch.setenv("DQOES_BENCH_DATA", str(tmp_path))
    run_sets([("random-cluster-crowded", (2,))], None, tmp_path / "q.json", bench_stress.KEY, update=False)
    assert stored.read_text() == "old" and "is left as it was" in capsys.readouterr().out
