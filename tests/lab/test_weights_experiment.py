"""`python -m lab weights` for real: the inference workload and busy loops in real cgroups, briefly.

Needs torch, root and a writable cgroup filesystem (the `cgroup_root`
fixture); without them it is skipped with the reason, unless
DQOES_REQUIRE_CGROUP=1 (then it fails). Nothing here asserts speed: only the
shape of the result, that the numbers are possible (received > 0, never past
the quota) and that every process and group is gone afterwards.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import weights
from shared.runtime import cgroupfs

REPO = Path(__file__).resolve().parents[2]
SLACK_CORES = 0.05
"""A window's edges can catch one CFS period (100 ms) more than the quota."""


def _parent(root: Path, pid: int) -> cgroupfs.Group:
    return cgroupfs.group_at(root, f"dqoes-weights-{pid}")


@pytest.mark.timeout(240)
def test_weights_experiment_runs_the_inference_workload_and_cleans_up(tmp_path: Path, cgroup_root: Path):
    md = tmp_path / "results.md"
    md.write_text("# Results\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab", "weights", "--quotas", "0.3,0.6", "--model",
         "mobilenetv2", "--batch-size", "2", "--resolution", "64", "--duration-s", "3", "--warmup-s", "1",
         "--neighbour-at", "root", "--conditions", "alone,neighbour,weighted,parent", "--json", "--update", str(md)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    stdout, stderr = proc.communicate(timeout=220)
    assert proc.returncode == 0, stderr[-2000:]
    assert "[4/4] (d) neighbour, managed and parent weights from the limits" in stderr  # progress, on stderr
    out = json.loads(stdout.strip().splitlines()[-1])
    res = out["result"]
    version = cgroupfs.cpu_version(cgroup_root)
    scale = cgroupfs.weight_scale(version)
    assert res["cgroup_version"] == version and res["weight_file"] == scale.file
    assert [c["condition"] for c in res["conditions"]] == ["alone", "neighbour", "weighted", "parent"]
    assert res["neighbour_at"] == "root"
    node_cores = out["machine"]["node_cores"]
    for c in res["conditions"]:
        want_parent = weights.managed_weight(version, 0.9, node_cores) if c["condition"] == "parent" else 1.0
        assert c["parent_weight_raw"] == scale.raw_for(want_parent)
        assert [g["group"] for g in c["groups"]] == ["managed-0", "managed-1"]
        assert (c["neighbour_cores"] > 0) == c["neighbour"]
        for g, quota in zip(c["groups"], (0.3, 0.6), strict=True):
            assert g["quota_cores"] == quota
            assert 0 < g["cores"] <= quota + SLACK_CORES, g
            assert g["ratio"] == pytest.approx(g["cores"] / quota, abs=1e-3)
            assert g["throttled_share"] is None or 0 <= g["throttled_share"] <= 1
            assert g["batches"] >= 1 and g["latency_median_s"] > 0  # a 2-image 64 px batch takes well under 1 s
            want = weights.managed_weight(version, quota, node_cores) if c["weighted"] else 1.0
            assert g["weight"] == pytest.approx(want) and g["weight_raw"] == scale.raw_for(want)
    assert weights.BEGIN in md.read_text() and "| (c) neighbour, managed weights from the limits | managed-1 | 0.6 |" \
        in md.read_text()
    for rel in (f"dqoes-weights-{proc.pid}", f"dqoes-weights-{proc.pid}-neighbour"):
        assert not any(d.exists() for d in cgroupfs.group_at(cgroup_root, rel).dirs())


@pytest.mark.timeout(120)
def test_an_interrupted_run_removes_its_processes_and_groups(cgroup_root: Path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab", "weights", "--workload", "spin", "--quotas", "0.2,0.4",
         "--conditions", "neighbour", "--duration-s", "60", "--warmup-s", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    parent = _parent(cgroup_root, proc.pid)
    groups = [cgroupfs.group_at(cgroup_root, f"dqoes-weights-{proc.pid}/{name}")
              for name in ("managed-0", "managed-1", "neighbour")]
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        # wait until every busy loop is in its group: one per managed group, one per core in the neighbour
        want = 2 + math.ceil(len(os.sched_getaffinity(0)))
        while len(children) < want:
            assert proc.poll() is None, "the experiment ended before it was interrupted"
            assert time.monotonic() < deadline, f"only {children} in the groups after 60 s"
            time.sleep(0.1)
            with contextlib.suppress(OSError):
                children = [p for g in groups for p in cgroupfs.pids(g)]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # the test failed: do the cleanup the experiment should have done
            proc.kill()
            proc.wait()
            for g in groups:
                with contextlib.suppress(OSError):
                    for pid in cgroupfs.pids(g):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            for g in (*groups, parent):
                with contextlib.suppress(OSError):
                    cgroupfs.remove_group(g)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    assert not any(d.exists() for d in parent.dirs())
    for pid in children:
        assert not Path(f"/proc/{pid}").exists()
