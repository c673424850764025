"""`dqoes experiment real --runtime cgroup`, stopped by SIGTERM mid-run: nothing it started is left
(processes, or its private bus's credentials).

A SIGTERM (a supervisor, `kill`, a CI timeout) cleans up as Ctrl-C does. Before, the default action
killed the command alone and left its NATS server, manager, worker and inference processes running.
A `kill -9` cannot be cleaned up after by the command itself: every process it started dies with it
(PR_SET_PDEATHSIG, shared/children.py), and its private directory, named after its PID, is removed
by the next run. Needs torch, root and a writable cgroup filesystem (the `cgroup_root` fixture).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.common import PrivateNats

REPO = Path(__file__).resolve().parents[2]


def _tree(pid: int) -> set[int]:
    """The pids below `pid` now (children, theirs, ...)."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent_of[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        out.update(kids)
        todo.extend(kids)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_real(tmp_path: Path) -> tuple[subprocess.Popen[str], set[int]]:
    """`experiment real` with two inference processes, once all its processes run; (it, their pids)."""
    e = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "experiment", "real", "--runtime", "cgroup", "--containers", "2",
         "--cores", "1", "--duration-s", "120", "--policies", "default", "--batch-size", "2",
         "--resolution", "64", "--out", str(tmp_path / "run")],
        cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Wait for the inference processes: the worker's grandchildren (NATS, manager and worker first).
    deadline = time.monotonic() + 90
    while len(tree := _tree(proc.pid)) < 5:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{len(tree)} processes; {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    time.sleep(1.0)
    return proc, _tree(proc.pid)


def test_a_sigterm_mid_run_stops_every_process_it_started(tmp_path, cgroup_root):
    proc, tree = _start_real(tmp_path)
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "dqoes: interrupted" in err, (proc.returncode, err[-3000:])
    deadline = time.monotonic() + 10
    while (left := [p for p in tree if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left if _alive(p)]
    # Nor its private bus's credentials and store (named after its PID: other runs' may come and go).
    assert not list(Path(tempfile.gettempdir()).glob(f"dqoes-run-{proc.pid}-*"))


def test_a_kill_9_mid_run_leaves_no_process_and_the_next_run_removes_its_directory(tmp_path, cgroup_root):
    proc, tree = _start_real(tmp_path)
    try:
        private = list(Path(tempfile.gettempdir()).glob(f"dqoes-run-{proc.pid}-*"))
        assert len(private) == 1  # named after its PID
        proc.kill()
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while (left := [p for p in tree if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left if _alive(p)]
    assert private[0].is_dir()  # nobody was left to remove it ...
    PrivateNats(["n1"]).close()  # ... until the next run starts
    assert not private[0].exists()
