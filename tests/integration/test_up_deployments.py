"""Several `dqoes up` on one machine, and `dqoes up` killed with SIGKILL: real processes throughout.

- a data directory belongs to one `dqoes up` (a lock): a second one is refused with the first's PID;
- each deployment has its own pointer; with two running, `dqoes status` names both and asks for
  `--deployment`, and answers for the one chosen;
- `kill -9` of `dqoes up` leaves none of its processes (nats-server, manager, workers, dashboard)
  after 5 s: they die with it (PR_SET_PDEATHSIG, shared/children.py); its stale pointer is ignored.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[2]


def _env(state: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(state)}
    env.pop("DQOES_NATS_URL", None)
    env.pop("DQOES_NATS_CREDS", None)
    return env


def dqoes(*args: str, state: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=_env(state))


def start_up(data: Path, state: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    with out.open("wb") as f:
        return subprocess.Popen([sys.executable, "-m", "services.cli", "up", "--nodes", "1", "--forever",
                                 "--time-scale", "5", "--data-dir", str(data), *extra],
                                stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=_env(state))


def wait_started(proc: subprocess.Popen[bytes], out: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while "Ctrl-C stops everything" not in out.read_text(errors="replace"):
        assert proc.poll() is None, out.read_text()[-3000:]
        assert time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.2)


def tree(pid: int) -> set[int]:
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
        kids = {c for c, pp in parent_of.items() if pp == p}
        out |= kids
        todo.extend(kids)
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "?"


def test_two_deployments_one_lock_each_named_by_status_and_gone_with_a_kill_9(tmp_path):
    state = tmp_path / "state"
    a = start_up(tmp_path / "data-a", state, tmp_path / "a.out")
    c: subprocess.Popen[bytes] | None = None
    try:
        wait_started(a, tmp_path / "a.out")
        # The same data directory: refused at once, naming the first's PID; the first runs on.
        b = dqoes("up", "--nodes", "1", "--forever", "--data-dir", str(tmp_path / "data-a"), "--no-dashboard",
                  state=state)
        assert b.returncode == 2 and f"in use by another `dqoes up` (PID {a.pid})" in b.stderr, b
        assert len(b.stderr.strip().splitlines()) == 1, b.stderr
        assert a.poll() is None

        c = start_up(tmp_path / "data-c", state, tmp_path / "c.out", "--no-dashboard")
        wait_started(c, tmp_path / "c.out")
        pointers = sorted(p.name for p in (state / "deployments").iterdir())
        assert pointers == sorted([f"{a.pid}.json", f"{c.pid}.json"])
        both = dqoes("status", "--json", state=state)
        assert both.returncode == 2, both
        assert str(a.pid) in both.stderr and str(c.pid) in both.stderr and "--deployment" in both.stderr
        for chosen, data in ((a, "data-a"), (c, "data-c")):
            for how in (str(chosen.pid), str(tmp_path / data)):
                r = dqoes("status", "--json", "--deployment", how, state=state)
                assert r.returncode == 0, r.stderr
                assert json.loads(r.stdout.strip().splitlines()[-1])["nodes"], r.stdout

        procs = {a.pid: tree(a.pid), c.pid: tree(c.pid)}
        names = " | ".join(cmdline(p) for p in procs[a.pid])
        assert len(procs[a.pid]) >= 4 and "nats-server" in names and "services.manager" in names \
            and "services.worker" in names and "dashboard.serve" in names, names
        for p in (a, c):
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
        deadline = time.monotonic() + 5
        left = []
        while time.monotonic() < deadline:
            left = [p for kids in procs.values() for p in kids if alive(p)]
            if not left:
                break
            time.sleep(0.1)
        assert not left, [cmdline(p) for p in left]
        # Their pointers stay behind, and mean nothing: nothing answers, they are removed.
        r = dqoes("status", "--json", state=state)
        assert r.returncode != 0 and "deployments are running" not in r.stderr
        assert not list((state / "deployments").iterdir())
        # The lock went with the process: the data directory serves a new `dqoes up`.
        assert (tmp_path / "data-a" / "dqoes-up.lock").exists()
    finally:
        for p in (a, c):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
