"""`dqoes experiment real` end to end on this machine: real inference processes under the cgroup
runtime, a private NATS, the manager and a worker, for half a minute.

What it records must let a run be explained afterwards: besides the node
states and CPU samples, every decision the worker published (each
container's old and new limit and the reason) and every batch the workloads
reported (what the policy saw).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from experiments.real import RealOptions, run

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(os.geteuid() != 0, reason="the cgroup runtime needs root")]


def test_a_short_real_run_records_decisions_and_batches(tmp_path):
    # Run with a setting, as `--policies learned:half_life_s=0` asks: the worker must run with it.
    label = "learned:half_life_s=0"
    res = run(RealOptions(containers=2, duration_s=30.0, policies=label, runtime="cgroup", out=str(tmp_path)))
    rows = [json.loads(line) for line in (tmp_path / "learned+half_life_s=0.jsonl").read_text().splitlines()]
    assert (tmp_path / "learned+half_life_s=0").is_dir()  # no colon: a docker -v source may not have one
    kinds = {r["kind"] for r in rows}
    assert {"state", "cpu", "decision", "batch"} <= kinds
    assert all(r["params"]["half_life_s"] == 0 for r in rows if r["kind"] == "state")
    decisions = [r for r in rows if r["kind"] == "decision"]
    assert all(set(d["containers"]) == {"c01", "c02"} for d in decisions)
    assert all(c["reason"].startswith("learned:") for d in decisions for c in d["containers"].values())
    assert any(c["new_limit"] is not None for d in decisions for c in d["containers"].values())
    batches = [r for r in rows if r["kind"] == "batch"]
    assert {b["container"] for b in batches} == {"c01", "c02"}
    assert all(b["latency_s"] > 0 and b["cpu_s"] >= 0 for b in batches)
    # When each finished, by its workload (the worker reads it as of then), no later than received.
    assert all(0 < b["finished_s"] <= b["t_s"] + 1e-3 for b in batches)
    # Unpinned, the workloads' threads follow their limits, and every batch says so to the worker.
    assert all(b.get("follows_limit") is True for b in batches)
    assert res.summary["real"][label]["met_final"] >= 0
    assert res.summary["real"][label]["settings"] == {"half_life_s": 0.0}
    # Records are kept and shared: the run's credentials and server store are not in them, and are
    # gone once it ends.
    kept = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")]
    assert not [p for p in kept if p.endswith(".creds") or "/auth" in p or "jetstream" in p], kept
    assert not list(Path(tempfile.gettempdir()).glob(f"dqoes-run-{os.getpid()}-*"))  # named after its PID
    # The bus asked for credentials: the worker connected as its own identity (its nkey).
    assert "(identity worker-" in (tmp_path / "learned+half_life_s=0" / "worker.log").read_text()


def test_a_calibrating_run_works_its_objectives_out_from_what_it_measured_here(tmp_path):
    """`--calibrate`: the run's models are measured here first, at its batches, and the objectives, the
    forecast and the bounds come from those profiles, which the summary keeps (a light calibration:
    one limit, one measured batch)."""
    from experiments.calibrate import CalibrationOptions
    from experiments.real import FACTORS, summary_profiles

    cal = CalibrationOptions(limits="0.5", batches=1, warmup=1)
    res = run(RealOptions(containers=2, duration_s=30.0, policies="learned", runtime="cgroup", models="mobilenetv2",
                          batch_size=2, resolution=64, out=str(tmp_path), calibrate=True, calibration=cal))
    d = res.summary
    assert (tmp_path / "profiles.toml").is_file()
    measured = summary_profiles(d)["mobilenetv2"]
    assert (measured.batch_images, measured.resolution_px) == (2, 64)
    assert measured.source.startswith("calibrated")
    assert [m["name"] for m in d["profiles_measured"]] == ["mobilenetv2", "nasnetmobile"]
    for i, c in enumerate(d["containers"]):
        assert c["objective_s"] == round(measured.with_threads(1).fastest_s(d["cores"]) * FACTORS[i], 2)
    assert d["command"].endswith(" --calibrate")
    assert "measured on this machine in the same call" in res.markdown
    assert res.summary["real"]["learned"]["met_final"] >= 0


def test_a_calibrating_run_refuses_an_unknown_model_before_it_measures_anything(tmp_path, capsys):
    from experiments.common import ExperimentError

    with pytest.raises(ExperimentError, match="unknown model 'nosuch'"):
        run(RealOptions(runtime="cgroup", models="nosuch", calibrate=True, out=str(tmp_path)))
    assert list(tmp_path.iterdir()) == [] and "calibrating" not in capsys.readouterr().err
