"""`dqoes serve node` on the docker runtime against the real engine: it governs only labelled containers.

A control plane and a node role run as real processes (services/cli/serve.py); the node joins
with a token, its worker lists this engine's containers labelled dqoes.managed=true and publishes
them in its node state, and an unlabelled container on the same engine is left out.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from role_parts import dqoes, serve

from shared import subjects
from shared.bus import Bus
from shared.ports import free_port
from shared.schema import NodeState

pytestmark = [pytest.mark.timeout(180)]
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
    cp = serve(cp_state, tmp_path / "cp.out", "control-plane", "--port", str(port))
    node = None
    try:
        cp.wait_for("control plane: ready")
        tok = dqoes("join-token", "create", "--quiet", state=cp_state)
        assert tok.returncode == 0, tok.stderr
        name = f"dqn-{containers.run_id[:8]}"
        node = serve(node_state, tmp_path / "node.out", "node", "--control-plane", url, "--join-token",
                      tok.stdout.strip(), "--name", name, "--runtime", "docker")
        node.wait_for(f"node {name}: worker on the docker runtime")
        states = asyncio.run(_states(url, cp_state / "control-plane" / "auth" / "admin.creds", name,
                                     time.monotonic() + 60))
        seen = {c.container for s in states for c in s.containers}
        assert labelled.name in seen, (seen, (node_state / "node" / f"worker-{name}.log").read_text()[-2000:])
        assert stranger.name not in seen
        assert containers.inspect(stranger.name)["HostConfig"]["CpuQuota"] == 0
    finally:
        if node is not None:
            node.stop()
        cp.stop()
