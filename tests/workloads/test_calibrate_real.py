"""`dqoes calibrate` for real: MobileNetV2 at a tiny size, in a real cgroup under a real quota.

Needs torch, root and a writable cgroup filesystem. Without them it is
skipped with the reason, unless DQOES_REQUIRE_CGROUP=1 (then it fails).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from experiments.calibration import calibrations_from_document
from shared.runtime import cgroupfs
from shared.scenarios.spec import load_profiles_file

REPO = Path(__file__).resolve().parents[2]


def test_calibrate_measures_mobilenetv2_under_a_quota(tmp_path: Path, cgroup_root: Path):
    out = tmp_path / "profiles.toml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "calibrate", "--models", "mobilenetv2", "--limits", "0.25",
         "--batch-size", "2", "--resolution", "64", "--batches", "2", "--warmup", "1", "--out", str(out), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    assert "[2/2] mobilenetv2 under 0.25 cores" in stderr  # progress, on stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert [r["limit_cores"] for r in summary["table"]["mobilenetv2"]] == [None, 0.25]

    profiles = load_profiles_file(out)
    p = profiles["mobilenetv2"]
    assert p.work_cpu_s > 0 and (p.batch_images, p.resolution_px, p.threads) == (2, 64, 1)
    assert profiles["nasnetmobile"].work_cpu_s == p.work_cpu_s

    import tomllib

    (cal,) = calibrations_from_document(tomllib.loads(out.read_text()))
    free, limited = cal.runs
    assert free.limit_cores is None and limited.limit_cores == 0.25
    for r in cal.runs:
        assert len(r.cpu_s) == 2 and len(r.warmup_cpu_s) == 1 and all(c > 0 for c in r.cpu_s)
        assert r.wall_s is not None and r.total_cpu_s is not None and r.total_cpu_s > 0.5  # torch start-up
    # The quota held: the group used at most a quarter core (plus one period's slack) over its life.
    assert limited.total_cpu_s <= 0.25 * limited.wall_s + 0.15
    # Leaves no cgroup behind.
    group = cgroupfs.group_at(cgroup_root, f"dqoes-calibrate-{proc.pid}")
    assert not any(d.exists() for d in group.dirs())


def test_each_run_records_its_allocator_and_a_calibration_for_the_image_refuses_the_default_one(
        tmp_path: Path, cgroup_root: Path, monkeypatch):
    """The workload re-executes itself under jemalloc where it is installed, and the image's containers
    run under it: each run records what its process had mapped, and a calibration asked to describe
    the image (`require_jemalloc`, as `experiment real --calibrate` of Docker containers asks) stops at
    the first run without it, leaving nothing behind."""
    import pytest

    from experiments.calibrate import CalibrationOptions, calibrate
    from experiments.common import ExperimentError
    from services.inference.jemalloc import find_jemalloc

    opts = CalibrationOptions(models="mobilenetv2", limits="0.5", batch_size=2, resolution=64, batches=1, warmup=1,
                              cgroup_root=str(cgroup_root), out=str(tmp_path / "p.toml"))
    monkeypatch.setenv("DQOES_NO_JEMALLOC", "1")
    lines: list[str] = []
    res = calibrate(opts, lines.append)
    assert res.summary["calibration"]["allocator"] == "default malloc"
    assert any(line.startswith("warning: the workloads ran under default malloc, not jemalloc") for line in lines)
    import tomllib

    (cal,) = calibrations_from_document(tomllib.loads((tmp_path / "p.toml").read_text()))
    assert [r.allocator for r in cal.runs] == ["default malloc", "default malloc"]
    with pytest.raises(ExperimentError, match="libjemalloc2"):
        calibrate(dataclasses.replace(opts, require_jemalloc=True, out=str(tmp_path / "q.toml")), lines.append)
    assert not (tmp_path / "q.toml").exists()
    assert not [p for p in cgroup_root.rglob("dqoes-calibrate-*")]
    if find_jemalloc() is None:
        return  # what follows needs the library (Debian's libjemalloc2)
    monkeypatch.delenv("DQOES_NO_JEMALLOC")
    res = calibrate(dataclasses.replace(opts, require_jemalloc=True), lines.append)
    assert res.summary["calibration"]["allocator"] == "jemalloc"
