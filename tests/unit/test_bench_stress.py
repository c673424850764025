"""`make bench-stress`'s runner: every policy on a variant, figures printed, JSON and the doc's section written."""

from __future__ import annotations

import orjson

from bench import bench_stress
from bench.bench_policies import run_sets


def test_a_stress_run_writes_its_figures_and_its_section(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "results.md"
    doc.write_text(f"# before\n\n{bench_stress.BEGIN}\nold text\n{bench_stress.END}\n\n# after\n")
    monkeypatch.setenv("DQOES_BENCH_UPDATE", str(doc))
    out = tmp_path / "stress.json"
    figures = run_sets([("random-cluster-crowded", (2,))], None, out, bench_stress.BEGIN, bench_stress.END)

    key = "random-cluster-crowded, seeds 2-2"
    assert set(figures) == {key}
    met = figures[key]["learned_met_to_oracle_policy"]
    assert met["goal"] == 0.97 and met["value"] > 0
    saved = orjson.loads(out.read_bytes())[key]
    # Every policy ran the seed once; no run with a prior was asked for.
    assert sorted(r["policy"] for r in saved["runs"]) == ["default", "dqoes", "learned", "oracle"]
    text = doc.read_text()
    assert "old text" not in text and text.startswith("# before") and text.rstrip().endswith("# after")
    assert "#### random-cluster-crowded, seeds 2-2" in text and "| learned |" in text
    printed = capsys.readouterr().out
    # The printed figures carry the name the JSON and the section use.
    assert f"{key}: learned met / oracle policy (same runs)" in printed


def test_the_stress_suite_runs_every_variant_on_the_held_out_seeds(monkeypatch):
    seen = {}

    def fake(sets, prior_error, out, begin, end):
        seen.update(sets=sets, prior_error=prior_error, out=out, begin=begin, end=end)
        return {}

    monkeypatch.setattr(bench_stress, "run_sets", fake)
    bench_stress.run()
    from shared.scenarios.builtin import STRESS

    assert [name for name, _ in seen["sets"]] == list(STRESS)
    assert all(seeds == tuple(range(1001, 1021)) for _, seeds in seen["sets"])
    assert seen["prior_error"] is None and seen["begin"] != seen["end"]
