"""`dqoes up --runtime cgroup`: real torch inference processes in cgroups, governed by the real worker.

Needs root, a writable cgroup tree and torch; skipped with the reason
otherwise (failing instead when DQOES_REQUIRE_CGROUP=1).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from services.cli.live import cgroup_up_problem
from shared.runtime import cgroupfs
from shared.scenarios.spec import parse_scenario

REPO = Path(__file__).resolve().parents[2]

SMALL = {
    "name": "cgroup-small",
    "duration_s": 40,
    "nodes": [{"name": "cg1", "cores": 2}],
    "containers": [
        # Batches of 4 at 96 px take well under a second: "lax" is far in G, "tight" in B.
        {"name": "lax", "model": "nasnetmobile", "objective_s": 30.0},
        {"name": "tight", "model": "nasnetmobile", "objective_s": 0.01},
    ],
}


def test_problems_are_named_before_anything_starts():
    sc = parse_scenario(SMALL)
    ok = dict(compare=False, policy="dqoes", euid=0, has_torch=True)
    assert cgroup_up_problem(sc, **ok) is None
    assert "needs root" in cgroup_up_problem(sc, **{**ok, "euid": 1000})
    assert "workloads" in cgroup_up_problem(sc, **{**ok, "has_torch": False})
    assert "--compare" in cgroup_up_problem(sc, **{**ok, "compare": True})
    assert "oracle" in cgroup_up_problem(sc, **{**ok, "policy": "oracle"})
    odd = parse_scenario({**SMALL, "models": [{"name": "mine", "work_cpu_s": 1.0}],
                          "containers": [{"name": "x", "model": "mine", "objective_s": 5}]})
    assert "no real model for mine" in cgroup_up_problem(odd, **ok)


def test_a_bad_flag_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "services.cli.main", "up", "--runtime", "cgroup", "--twin",
                           "--scenario", "paper-varied", "--no-dashboard"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.timeout(180)
def test_up_runs_real_inference_processes_and_limits_them(tmp_path, cgroup_root):
    f = tmp_path / "small.json"
    f.write_text(json.dumps(SMALL))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "up", "--runtime", "cgroup", "--scenario", str(f),
         "--policy", "dqoes", "--batch", "4", "--resolution", "96", "--json", "--no-dashboard", "--run-dir", str(run_dir)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    version = cgroupfs.cpu_version(cgroupfs.DEFAULT_ROOT)
    lax = cgroupfs.group_at(cgroupfs.DEFAULT_ROOT, "dqoes-cg1/lax", version)
    limited_cores = None
    t_end = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < t_end:
        if cgroupfs.exists(lax):
            try:
                limited_cores = cgroupfs.read_quota_cores(lax) or limited_cores
            except OSError:
                pass
        time.sleep(0.2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = orjson.loads(out.decode().strip().splitlines()[-1])
    assert result["scenario"] == "cgroup-small" and result["time_scale"] == 1.0
    assert "dqoes" in result["policies"]

    # The worker limited the lax container in its real cgroup ...
    assert limited_cores is not None and limited_cores < 2.0
    worker_log = (run_dir / "dqoes" / "worker-cg1.log").read_text()
    assert "Traceback" not in worker_log, worker_log[-3000:]
    assert "lax joined" in worker_log and "tight joined" in worker_log
    # ... and cleaned up: the processes and their groups are gone.
    assert not cgroupfs.exists(lax)
