"""The training simulator, its scenarios and `dqoes experiment` on them (virtual time, no network)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import training as training_exp
from shared.scenarios.training import (
    BUILTIN_TRAINING_PROFILES,
    TRAINING_BUILTINS,
    TrainingJobSpec,
    TrainingProfile,
    TrainingScenario,
    WorkerSpec,
    load_profiles,
    load_training,
    profiles_toml,
)
from shared.sim.training import simulate_training, water_fill


@settings(max_examples=200, deadline=None)
@given(st.floats(0.5, 32), st.dictionaries(st.sampled_from("abcdefgh"), st.floats(0, 20), min_size=1))
def test_water_fill_is_fair_capped_and_work_conserving(cores, caps):
    got = water_fill(cores, caps)
    assert all(-1e-9 <= got[n] <= caps[n] + 1e-9 for n in caps)
    assert sum(got.values()) == pytest.approx(min(cores, sum(caps.values())), abs=1e-6)
    # nobody below its cap gets less than anyone else
    unsat = [n for n in caps if got[n] < caps[n] - 1e-9]
    for n in unsat:
        assert all(got[n] >= got[m] - 1e-9 for m in caps)


def _one_worker(jobs, cores=4.0, profiles=None):
    return TrainingScenario("t", "test", (WorkerSpec("w1", cores),), tuple(jobs),
                            dict(profiles or BUILTIN_TRAINING_PROFILES))


def test_default_on_one_worker_is_work_conserving():
    prof = TrainingProfile("p", "squared loss", 1.0, 0.0, 0.5, 10.0, 4.0, 10, 0.0)
    sc = _one_worker([TrainingJobSpec("a", "p", 0.0), TrainingJobSpec("b", "p", 0.0)], profiles={"p": prof})
    r = simulate_training(sc, "default", 1)
    # 2 jobs x 100 CPU-s on 4 cores, each able to use all 4: both finish at 50 s
    assert r.completion_s == {"a": pytest.approx(50.0), "b": pytest.approx(50.0)}
    assert r.makespan_s == pytest.approx(50.0)


def test_flowcon_caps_a_completing_job_for_a_newcomer():
    fast = TrainingProfile("old", "cross entropy", 2.0, 0.1, 2.0, 4.0, 4.0, 60, 0.0)
    slow = TrainingProfile("new", "cross entropy", 2.0, 0.1, 0.03, 4.0, 4.0, 60, 0.0)
    sc = _one_worker([TrainingJobSpec("old", "old", 0.0), TrainingJobSpec("new", "new", 30.0)],
                     profiles={"old": fast, "new": slow})
    r = simulate_training(sc, "flowcon", 1, record=True)
    d = simulate_training(sc, "default", 1, record=True)

    def rows(res, name):
        return [row for row in res.timeline if row["kind"] == "job" and row["job"] == name and 30 < row["t"] <= 60]

    # the completing job is capped at one core of four, the newcomer gets more than its fair share (2 cores)
    assert min(row["limit"] for row in rows(r, "old")) == pytest.approx(0.25)
    assert max(row["cpu_cores"] for row in rows(r, "new")) == pytest.approx(3.0)
    assert max(row["cpu_cores"] for row in rows(d, "new")) == pytest.approx(2.0)


@pytest.mark.parametrize("name", list(TRAINING_BUILTINS))
def test_every_builtin_finishes_every_job_under_both_policies(name):
    sc = load_training(name, 1)
    for policy in ("flowcon", "default"):
        r = simulate_training(sc, policy, 1)
        assert len(r.finish_s) == len(sc.jobs)
        assert r.makespan_s > 0 and r.mean_completion_s > 0
        assert set(r.placement.values()) <= {w.name for w in sc.workers}


def test_builtin_shapes_match_the_paper():
    three = load_training("flowcon-3jobs", 1)
    assert [(j.profile, j.submit_s) for j in three.jobs] == [("vae", 0.0), ("cnn", 40.0), ("mlp", 80.0)]
    for name, n, workers, window in [("flowcon-10jobs", 10, 1, 200), ("flowcon-15jobs", 15, 1, 200),
                                     ("flowcon-4w-20jobs", 20, 4, 600), ("flowcon-4w-40jobs", 40, 4, 600),
                                     ("flowcon-8w-60jobs-homogeneous", 60, 8, 1000)]:
        sc = load_training(name, 3)
        assert len(sc.jobs) == n and len(sc.workers) == workers
        assert all(0 <= j.submit_s <= window for j in sc.jobs)
    het = load_training("flowcon-8w-60jobs-heterogeneous", 1)
    assert sorted(w.cores for w in het.workers) == [2, 2, 4, 4, 8, 8, 16, 16]
    assert load_training("flowcon-10jobs", 1).jobs != load_training("flowcon-10jobs", 2).jobs


def test_same_seed_same_result():
    a = simulate_training(load_training("flowcon-4w-20jobs", 4), "flowcon", 4)
    b = simulate_training(load_training("flowcon-4w-20jobs", 4), "flowcon", 4)
    assert a.summary() == b.summary()


def test_profiles_round_trip_through_toml(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text(profiles_toml(BUILTIN_TRAINING_PROFILES))
    back = load_profiles(f)
    assert set(back) == set(BUILTIN_TRAINING_PROFILES)
    for k, p in back.items():
        assert p.epochs == BUILTIN_TRAINING_PROFILES[k].epochs
        assert p.rate_per_epoch == pytest.approx(BUILTIN_TRAINING_PROFILES[k].rate_per_epoch, rel=1e-5)
    f.write_text("[profiles.x]\ne_start = -1\n")
    with pytest.raises(ValueError):
        load_profiles(f)


def test_report_has_every_scenario_and_the_papers_numbers():
    data = training_exp.report_data(["flowcon-3jobs", "flowcon-4w-20jobs"], [1])
    md = training_exp.render_report(data)
    assert md.startswith(training_exp.REPORT_BEGIN) and md.endswith(training_exp.REPORT_END)
    assert "1089.9 / 1330.0 (-18.1%)" in md and "431.9 / 532.8 (-18.9%)" in md
    assert data["flowcon-4w-20jobs"]["jobs"] == 20


def test_cli_run_reports_completion_makespan_and_mean():
    out = subprocess.run([sys.executable, "-m", "services.cli", "experiment", "run", "flowcon-3jobs", "--policy",
                          "default", "--seed", "2", "--json"], capture_output=True, text=True, check=True)
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(s["completion_s"]) == {"job-1-vae", "job-2-cnn", "job-3-mlp"}
    assert s["makespan_s"] >= max(s["completion_s"].values())
    assert s["mean_completion_s"] == pytest.approx(sum(s["completion_s"].values()) / 3, abs=0.02)
    bad = subprocess.run([sys.executable, "-m", "services.cli", "experiment", "run", "flowcon-3jobs", "--policy",
                          "dqoes"], capture_output=True, text=True)
    assert bad.returncode == 2 and "training scenario" in bad.stderr


def test_the_builtin_profiles_are_the_fitted_ones():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    fitted = load_profiles(repo / "docs" / "calibration" / "training-profiles.toml")
    assert fitted == BUILTIN_TRAINING_PROFILES
