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
import time
from pathlib import Path

import pytest
from role_parts import dqoes, serve, worker_pid

from shared import subjects
from shared.bus import Bus
from shared.natscluster import NatsCluster
from shared.ports import free_port
from shared.schema import NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
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
    cp = serve(cp_state, tmp_path / "cp.out", "control-plane", "--port", str(port))
    try:
        cp.wait_for("control plane: ready")
        tok = dqoes("join-token", "create", "--quiet", state=cp_state)
        assert tok.returncode == 0, tok.stderr
        listed = f"nats://127.0.0.1:{free_port()}, nats://127.0.0.1:{port}"  # the first answers nothing
        r = dqoes("join", listed, "--token", tok.stdout.strip(), "--name", "worker-1", "--json", state=node_state)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["control_plane"] == listed.replace(" ", "")
        assert json.loads((node_state / "node" / "node.json").read_text())["control_plane"] == listed.replace(" ", "")
    finally:
        assert cp.stop() == 0
    auth_dir = cp_state / "control-plane" / "auth"  # its authorization: the joined node's identities included
    with NatsCluster(auth_dir, tmp_path / "cluster") as cluster:
        node = serve(node_state, tmp_path / "node.out", "node", "--control-plane", cluster.url, "--runtime", "sim",
                      "--scenario", "paper-identical-achievable", "--time-scale", "10")
        try:
            node.wait_for("node worker-1: worker on the sim runtime")
            worker = worker_pid(node)
            losses = asyncio.run(_rounds_after_each_loss(cluster, auth_dir / "admin.creds", "worker-1"))
            print(losses)
            assert [name for name, _, _ in losses] == cluster.names
            assert worker_pid(node) == worker  # carried on through a survivor, never restarted
            log = (node_state / "node" / "worker-worker-1.log").read_text(errors="replace")
            assert "reconnected" in log, log[-2000:]
        finally:
            node.stop()
