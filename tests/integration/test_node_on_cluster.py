"""A node given its control plane as a list of NATS URLs keeps working when one server of three is lost.

Real processes and real nats-servers: `dqoes join` takes a comma-separated list (here a dead URL first)
and records it; the node role (`dqoes serve node --control-plane LIST`, sim runtime) then runs on three
clustered servers (shared/natscluster.py) that carry the control plane's authorization, joined node
included. Each server in turn is killed with SIGKILL: the node's worker keeps running its rounds through
a survivor, without a restart (its process stays the same), and says it reconnected.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shared import subjects
from shared.bus import Bus
from shared.natscluster import NatsCluster
from shared.ports import free_port
from shared.schema import NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]


def _env(state: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(state)}
    for k in [k for k in env if k.startswith("DQOES_") and k != "DQOES_STATE_DIR"]:
        env.pop(k)
    return env


def _dqoes(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=_env(state))


def _serve(state: Path, out: Path, *args: str) -> subprocess.Popen[bytes]:
    with out.open("wb") as f:
        return subprocess.Popen([sys.executable, "-m", "services.cli", "serve", *args], stdout=f,
                                stderr=subprocess.STDOUT, cwd=REPO, env=_env(state))


def _wait(proc: subprocess.Popen[bytes], out: Path, needle: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in out.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _worker_pid(supervisor: int) -> int:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if (int(stat.read_text().rsplit(")", 1)[1].split()[1]) == supervisor
                    and b"services.worker" in (stat.parent / "cmdline").read_bytes()):
                return int(stat.parent.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no worker below {supervisor}")


async def _rounds_after_each_loss(cluster: NatsCluster, admin: Path, node: str) -> list[tuple[str, int, int]]:
    """Kill each server in turn; (server, last round before, first round seen after) for each."""
    watcher = await Bus.connect(cluster.url, "test-watcher", creds=admin, reconnect_wait_s=0.2)
    seen: list[tuple[float, int]] = []
    await watcher.subscribe(subjects.state(node), lambda m, _: seen.append((time.monotonic(), m.round)),
                            expect=NodeState)
    out = []
    try:
        deadline = time.monotonic() + 60
        while not [r for _, r in seen if r > 0]:
            assert time.monotonic() < deadline, "the node ran no round on the cluster"
            await asyncio.sleep(0.2)
        for i, name in enumerate(cluster.names):
            before = max(r for _, r in seen)
            t_kill = time.monotonic()
            cluster.kill(i)
            deadline = time.monotonic() + 30
            while not [r for t, r in seen if t > t_kill + 0.5 and r > before]:
                assert time.monotonic() < deadline, f"no round from {node} after {name} was lost"
                await asyncio.sleep(0.2)
            out.append((name, before, min(r for t, r in seen if t > t_kill + 0.5 and r > before)))
            await asyncio.to_thread(cluster.start_member, i)
            await asyncio.sleep(2.0)  # its copy catches up before the next loss
    finally:
        await watcher.close()
    return out


def test_a_node_given_the_list_keeps_working_when_a_server_is_lost(tmp_path):
    cp_state, node_state = tmp_path / "cp", tmp_path / "node"
    port = free_port()
    cp = _serve(cp_state, tmp_path / "cp.out", "control-plane", "--port", str(port))
    try:
        _wait(cp, tmp_path / "cp.out", "control plane: ready")
        tok = _dqoes("join-token", "create", "--quiet", state=cp_state)
        assert tok.returncode == 0, tok.stderr
        listed = f"nats://127.0.0.1:{free_port()}, nats://127.0.0.1:{port}"  # the first answers nothing
        r = _dqoes("join", listed, "--token", tok.stdout.strip(), "--name", "worker-1", "--json", state=node_state)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["control_plane"] == listed.replace(" ", "")
        assert json.loads((node_state / "node" / "node.json").read_text())["control_plane"] == listed.replace(" ", "")
    finally:
        assert _stop(cp) == 0
    auth_dir = cp_state / "control-plane" / "auth"  # its authorization: the joined node's identities included
    with NatsCluster(auth_dir, tmp_path / "cluster") as cluster:
        node = _serve(node_state, tmp_path / "node.out", "node", "--control-plane", cluster.url, "--runtime", "sim",
                      "--scenario", "paper-identical-achievable", "--time-scale", "10")
        try:
            _wait(node, tmp_path / "node.out", "node worker-1: worker on the sim runtime")
            worker = _worker_pid(node.pid)
            losses = asyncio.run(_rounds_after_each_loss(cluster, auth_dir / "admin.creds", "worker-1"))
            print(losses)
            assert [name for name, _, _ in losses] == cluster.names
            assert _worker_pid(node.pid) == worker  # carried on through a survivor, never restarted
            log = (node_state / "node" / "worker-worker-1.log").read_text(errors="replace")
            assert "reconnected" in log, log[-2000:]
        finally:
            _stop(node)
