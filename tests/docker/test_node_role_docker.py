"""`dqoes serve node` on the docker runtime against the real engine: it governs only labelled containers.

A control plane and a node role run as real processes (services/cli/serve.py); the node joins
with a token, its worker lists this engine's containers labelled dqoes.managed=true and publishes
them in its node state, and an unlabelled container on the same engine is left out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shared import subjects
from shared.bus import Bus
from shared.ports import free_port
from shared.schema import NodeState

pytestmark = [pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[2]


def _env(state: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(state)}
    for k in ("DQOES_NATS_URL", "DQOES_NATS_CREDS", "DQOES_CONFIG", "DQOES_NODE", "DQOES_RUNTIME"):
        env.pop(k, None)
    return env


def _serve(role: str, state: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    with out.open("wb") as f:
        return subprocess.Popen([sys.executable, "-m", "services.cli", "serve", role, *extra], stdout=f,
                                stderr=subprocess.STDOUT, cwd=REPO, env=_env(state))


def _wait(proc: subprocess.Popen[bytes], out: Path, needle: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in out.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _states(url: str, admin: Path, node: str, until: float) -> list[NodeState]:
    bus = await Bus.connect(url, "watcher", creds=admin)
    got: list[NodeState] = []
    await bus.subscribe(subjects.state(node), lambda m, _: got.append(m), expect=NodeState)
    try:
        while time.monotonic() < until and not any(s.containers for s in got):
            await asyncio.sleep(0.2)
    finally:
        await bus.close()
    return got


def test_the_node_role_governs_only_labelled_containers(containers, tmp_path):
    labelled = containers.run("labelled")
    stranger = containers.run("stranger", managed=False)
    cp_state, node_state = tmp_path / "cp", tmp_path / "node"
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    cp = _serve("control-plane", cp_state, tmp_path / "cp.out", "--port", str(port))
    node = None
    try:
        _wait(cp, tmp_path / "cp.out", "control plane: ready")
        tok = subprocess.run([sys.executable, "-m", "services.cli", "join-token", "create", "--quiet"],
                             capture_output=True, text=True, cwd=REPO, env=_env(cp_state), timeout=60)
        assert tok.returncode == 0, tok.stderr
        name = f"dqn-{containers.run_id[:8]}"
        node = _serve("node", node_state, tmp_path / "node.out", "--control-plane", url, "--join-token",
                      tok.stdout.strip(), "--name", name, "--runtime", "docker")
        _wait(node, tmp_path / "node.out", f"node {name}: worker on the docker runtime")
        states = asyncio.run(_states(url, cp_state / "control-plane" / "auth" / "admin.creds", name,
                                     time.monotonic() + 60))
        seen = {c.container for s in states for c in s.containers}
        assert labelled.name in seen, (seen, (node_state / "node" / f"worker-{name}.log").read_text()[-2000:])
        assert stranger.name not in seen
        assert containers.inspect(stranger.name)["HostConfig"]["CpuQuota"] == 0
    finally:
        if node is not None:
            _stop(node)
        _stop(cp)
