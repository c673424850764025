"""The lab's training tools: the loss-curve fit of `python -m lab calibrate-training` and the report of
`python -m lab training-real`, regenerated from its stored record."""

from __future__ import annotations

import pytest


def test_the_exponential_fit_recovers_a_known_curve():
    import math

    from lab.training_calibrate import fit_exponential

    losses = [0.3 + 2.0 * math.exp(-0.25 * e) for e in range(30)]
    f = fit_exponential(losses)
    assert f.e_floor == pytest.approx(0.3, rel=0.02) and f.e_start == pytest.approx(2.3, rel=0.02)
    assert f.rate_per_epoch == pytest.approx(0.25, rel=0.03) and f.rms < 0.01


def test_the_real_run_report_regenerates_from_its_record(tmp_path):
    from pathlib import Path

    from lab import training_real

    repo = Path(__file__).resolve().parents[2]
    md_file = tmp_path / "r.md"
    s, md = training_real.run(training_real.TrainingRealOptions(
        from_file=str(repo / "docs" / "data" / "training-real.json"), update=str(md_file)), lambda m: None)
    assert md_file.read_text().strip() == md.strip()
    # docs/results.md's real training row is rendered from this record (tests/lab/test_results_page.py).
    assert "| real: cgroup runtime, 2 cores, 3 training processes | 2 |" in (repo / "docs" / "results.md").read_text()
    assert len(s["policies"]) >= 2 and all(p["finished"] == p["jobs"] >= 3 for p in s["policies"].values())


def test_cpu_split_samples_the_last_round_before_each_mark():
    from lab.training_real import cpu_split

    rows = [{"t": 3.0, "job": "a", "cpu_cores": 0.5, "limit": 1.0, "stage": "NL"},
            {"t": 9.0, "job": "a", "cpu_cores": 0.7, "limit": 0.5, "stage": "CL"},
            {"t": 9.5, "job": "b", "cpu_cores": 0.3, "limit": 1.0, "stage": "NL"},
            {"t": 30.0, "job": "b", "cpu_cores": 0.9, "limit": 1.0, "stage": "NL"}]
    out = cpu_split(rows)
    assert out[0] == {"t": 10.0, "jobs": {"a": {"cpu_cores": 0.7, "limit": 0.5, "stage": "CL"},
                                          "b": {"cpu_cores": 0.3, "limit": 1.0, "stage": "NL"}}}
    assert [r["t"] for r in out] == [10.0, 30.0]  # nothing reported near 20 s
