"""`python -m lab training-real` end to end on this machine: two short real training jobs
submitted through `dqoes.submit` to a manager and a worker (cgroup runtime) over a private NATS.

The run's bus is secured as every deployment's is (its roles' credentials, kept out of the records
and removed when it ends); the jobs must still be placed, started and seen finishing through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from lab.training_real import TrainingRealOptions, run

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(os.geteuid() != 0, reason="the cgroup runtime needs root")]


def test_a_short_training_run_over_the_secured_bus_finishes_its_jobs(tmp_path):
    summary, _ = run(TrainingRealOptions(jobs="mlp:0:10,cnn:1:5", policies="flowcon", threads=1, timeout_s=120,
                                         out=str(tmp_path)), lambda _: None)
    r = summary["policies"]["flowcon"]
    assert (r["finished"], r["jobs"]) == (2, 2)
    assert set(r["completion_s"]) == {"job-1-mlp", "job-2-cnn"}
    assert set(r["placement"].values()) == {"node-1"}
    logs = tmp_path / "run1" / "flowcon"
    manager_log = (logs / "manager.log").read_text()
    assert "(identity manager)" in manager_log and "(identity store)" in manager_log
    assert "(identity worker-node-1)" in (logs / "worker.log").read_text()
    kept = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")]
    assert not [p for p in kept if p.endswith(".creds") or "/auth" in p or "jetstream" in p], kept
    assert not list(Path(tempfile.gettempdir()).glob(f"dqoes-run-{os.getpid()}-*"))  # named after its PID
