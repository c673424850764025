"""Host roles and joining, with real processes and the real nats-server (services/cli/serve.py, join.py).

- `dqoes serve control-plane` and `dqoes serve node` supervise their children: a killed manager,
  nats-server or worker comes back; SIGTERM stops the role and its children; a SIGKILLed
  supervisor leaves no child behind;
- `dqoes join` with a good token gives the node a worker identity of its own (keys made on the
  node) that may publish its own node's subjects and is refused another node's;
- a wrong, expired, used-up or revoked token is refused with one line and changes neither the
  registry nor the server's configuration;
- `dqoes node revoke` closes the node's connection and refuses new ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from role_parts import Role, dqoes, serve

from shared import auth, subjects
from shared.bus import Bus, BusError
from shared.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
def children_of(pid: int) -> dict[int, str]:
    """The processes below `pid` now, with their command lines."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent_of[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for c in [c for c, pp in parent_of.items() if pp == p]:
            try:
                out[c] = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def one(procs: dict[int, str], needle: str) -> int:
    found = [p for p, c in procs.items() if needle in c]
    assert len(found) == 1, (needle, procs)
    return found[0]


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Role, str]]:
    state = tmp_path_factory.mktemp("cp-state")
    port = free_port()
    role = serve(state, state.parent / "cp.out", "control-plane", "--listen", "127.0.0.1", "--port", str(port))
    try:
        role.wait_for("control plane: ready")
        yield role, f"nats://127.0.0.1:{port}"
    finally:
        role.stop()


def cp_dir(role: Role) -> Path:
    return role.state / "control-plane"


def token(role: Role, *extra: str) -> str:
    r = dqoes("join-token", "create", "--quiet", *extra, state=role.state)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def join(url: str, tok: str, node_state: Path, name: str) -> subprocess.CompletedProcess[str]:
    return dqoes("join", url, "--token", tok, "--name", name, "--json", state=node_state)


async def _publish_as(url: str, creds: Path, admin: Path, subject_list: list[str]) -> dict[str, bool]:
    """Which of `subject_list` a connection with `creds` could publish on (an admin watcher sees them)."""
    watcher = await Bus.connect(url, "watcher", creds=admin)
    seen: list[str] = []
    await watcher.subscribe_raw("dqoes.>", lambda m: seen.append(m.subject))
    bus = await Bus.connect(url, "node", creds=creds)
    out = {}
    try:
        for s in subject_list:
            seen.clear()
            bus.permission_violations.clear()
            await bus.publish_raw(s, b"{}")
            for b in (bus, watcher):
                await b.flush()
            deadline = time.monotonic() + 10  # delivered, or refused (the refusal comes asynchronously)
            while time.monotonic() < deadline and s not in seen and not bus.permission_violations:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # and nothing else follows
            refused = any("publish" in v.lower() for v in bus.permission_violations)
            assert (s in seen) is not refused, (s, seen, list(bus.permission_violations))
            out[s] = s in seen
    finally:
        await bus.close()
        await watcher.close()
    return out


def test_join_gives_an_identity_limited_to_its_node_and_revoke_cuts_it_off(control_plane, tmp_path):
    role, url = control_plane
    node_state = tmp_path / "host-a"
    r = join(url, token(role), node_state, "n1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["node"] == "n1"
    creds = node_state / "node" / "auth" / "worker-n1.creds"
    seed = auth.load(creds).seed
    # The seed never left the node: the control plane's files hold only the public key.
    for f in cp_dir(role).rglob("*"):
        if f.is_file():
            assert seed not in f.read_text(errors="replace"), f
    admin = cp_dir(role) / "auth" / "admin.creds"
    allowed = asyncio.run(_publish_as(url, creds, admin, [subjects.state("n1"), subjects.decisions("n1"),
                                                          subjects.state("n2"), subjects.decisions("n2"),
                                                          subjects.TARGETS, subjects.JOIN_REQUEST]))
    assert allowed == {subjects.state("n1"): True, subjects.decisions("n1"): True,
                       subjects.state("n2"): False, subjects.decisions("n2"): False, subjects.TARGETS: False,
                       subjects.JOIN_REQUEST: False}
    listed = dqoes("node", "list", "--json", state=role.state)
    assert "n1" in [n["node"] for n in json.loads(listed.stdout)["nodes"]]

    async def revoke_while_connected() -> tuple[bool, str]:
        bus = await Bus.connect(url, "n1", creds=creds, reconnect_wait_s=0.2)
        try:
            r = await asyncio.to_thread(dqoes, "node", "revoke", "n1", state=role.state)
            assert r.returncode == 0, r.stderr
            deadline = time.monotonic() + 10
            while bus._nc.is_connected and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            cut = not bus._nc.is_connected
        finally:
            await bus.close()
        try:
            again = await Bus.connect(url, "n1-again", creds=creds, connect_timeout_s=3)
            await again.close()
            return cut, "connected"
        except BusError as e:
            return cut, str(e)

    cut, second = asyncio.run(revoke_while_connected())
    assert cut, "the revoked node's connection was kept"
    assert "authorization" in second.lower(), second
    assert "reloaded" in role.text() or "regenerated" in role.text()


def test_an_anonymous_connection_may_only_ask_to_join(control_plane):
    role, url = control_plane

    async def probe() -> tuple[list[str], list[str]]:
        watcher = await Bus.connect(url, "watcher", creds=cp_dir(role) / "auth" / "admin.creds")
        seen: list[str] = []
        await watcher.subscribe_raw("dqoes.>", lambda m: seen.append(m.subject))
        anon = await Bus.connect(url, "anonymous", inbox_prefix=auth.JOIN_INBOX)
        try:
            for s in (subjects.state("n1"), subjects.TARGETS, subjects.control("n1")):
                await anon.publish_raw(s, b"{}")
            await anon.subscribe_raw("dqoes.>", lambda m: None)
            await anon.subscribe_raw("_INBOX.admin.>", lambda m: None)
            for b in (anon, watcher):
                await b.flush()
            deadline = time.monotonic() + 10  # the server's refusals come asynchronously
            while len(anon.permission_violations) < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await watcher.flush()
            return seen, list(anon.permission_violations)
        finally:
            await anon.close()
            await watcher.close()

    seen, violations = asyncio.run(probe())
    assert seen == []
    assert sum("publish" in v.lower() for v in violations) == 3, violations
    assert sum("subscription" in v.lower() for v in violations) == 2, violations


@pytest.mark.parametrize("case", ["wrong-secret", "expired", "used-up", "revoked", "garbage"])
def test_bad_tokens_are_refused_with_one_line_and_change_nothing(control_plane, tmp_path, case):
    role, url = control_plane
    node_state = tmp_path / "host-b"
    if case == "wrong-secret":
        good = token(role)
        tok = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    elif case == "expired":
        tok = token(role, "--ttl", "1s")
        time.sleep(1.5)
    elif case == "used-up":
        tok = token(role)
        assert join(url, tok, tmp_path / "first", f"used-{os.getpid()}").returncode == 0
    elif case == "revoked":
        tok = token(role)
        assert dqoes("join-token", "revoke", tok.split("-")[1], state=role.state).returncode == 0
    else:
        tok = "not-a-token"
    config = (cp_dir(role) / "auth" / auth.CONFIG_NAME).read_bytes()
    registry = (cp_dir(role) / "join" / "nodes.json")
    before = registry.read_bytes() if registry.exists() else b""
    r = join(url, tok, node_state, "intruder")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("dqoes: error: "), r.stderr
    assert ("join refused" if case != "garbage" else "not a join token") in r.stderr
    assert (cp_dir(role) / "auth" / auth.CONFIG_NAME).read_bytes() == config
    assert (registry.read_bytes() if registry.exists() else b"") == before
    assert not (node_state / "node" / "node.json").exists()


def test_roles_restart_their_children_and_take_them_along(control_plane, tmp_path):
    role, url = control_plane
    # control plane: a killed manager and a killed nats-server come back
    kids = children_of(role.pid)
    manager = one(kids, "services.manager")
    server = one(kids, "nats-server")
    os.kill(manager, signal.SIGKILL)
    role.wait_for("manager restarted", timeout_s=30)
    os.kill(server, signal.SIGKILL)
    role.wait_for("nats-server exited", timeout_s=30)
    assert one(children_of(role.pid), "nats-server") != server
    # node: joins with its token on first start (sim runtime), its worker restarts after a kill
    node_state = tmp_path / "host-c"
    node = serve(node_state, tmp_path / "node.out", "node", "--control-plane", url, "--join-token", token(role),
                 "--name", "worker-1", "--runtime", "sim", "--scenario", "paper-identical-achievable",
                 "--time-scale", "10")
    try:
        node.wait_for("node worker-1: worker on the sim runtime")
        worker = one(children_of(node.pid), "services.worker")
        deadline = time.monotonic() + 30
        while "connected to NATS" not in (node_state / "node" / "worker-worker-1.log").read_text(errors="replace"):
            assert time.monotonic() < deadline, node.text()
            time.sleep(0.2)
        os.kill(worker, signal.SIGKILL)
        node.wait_for("worker-worker-1 restarted", timeout_s=30)
        worker = one(children_of(node.pid), "services.worker")
        # a second node role on the same state directory is refused with one line
        second = dqoes("serve", "node", state=node_state, timeout=30)
        assert second.returncode == 2 and "in use" in second.stderr, second.stderr
        # kill -9 of the supervisor: its worker goes with it
        node.proc.kill()
        node.proc.wait()
        deadline = time.monotonic() + 10
        while alive(worker):
            assert time.monotonic() < deadline, "the worker outlived its supervisor"
            time.sleep(0.1)
    finally:
        node.stop()


def test_sigterm_stops_the_control_plane_and_its_children(tmp_path):
    state = tmp_path / "state"
    role = serve(state, tmp_path / "cp.out", "control-plane", "--listen", "127.0.0.1", "--port", str(free_port()))
    role.wait_for("control plane: ready")
    kids = children_of(role.pid)
    assert {"nats-server", "services.manager"} <= {k for k in ("nats-server", "services.manager")
                                                    if any(k in c for c in kids.values())}
    assert role.stop() == 0
    assert not [p for p in kids if alive(p)]


def test_a_bad_config_file_stops_a_role_with_one_line(tmp_path):
    bad = tmp_path / "dqoes.toml"
    bad.write_text("[node]\nruntime = 'docker'\nrun_time = 'sim'\n")
    for role in ("node", "control-plane"):
        r = dqoes("serve", role, "--config", str(bad), state=tmp_path / "state", timeout=30)
        assert r.returncode == 2, r
        assert r.stderr.count("\n") == 1 and "unknown key node.run_time" in r.stderr, r.stderr
    assert not (tmp_path / "state" / "node").exists()  # nothing started, nothing written


def test_joined_nodes_survive_a_restart_of_the_control_plane(tmp_path):
    state, port = tmp_path / "state", free_port()
    url = f"nats://127.0.0.1:{port}"
    first = serve(state, tmp_path / "cp1.out", "control-plane", "--port", str(port))
    try:
        first.wait_for("control plane: ready")
        r = join(url, token(first), tmp_path / "host-d", "n5")
        assert r.returncode == 0, r.stderr
    finally:
        assert first.stop() == 0
    second = serve(state, tmp_path / "cp2.out", "control-plane", "--port", str(port))
    try:
        second.wait_for("control plane: ready")
        creds = tmp_path / "host-d" / "node" / "auth" / "worker-n5.creds"
        allowed = asyncio.run(_publish_as(url, creds, cp_dir(second) / "auth" / "admin.creds",
                                          [subjects.state("n5"), subjects.state("n1")]))
        assert allowed == {subjects.state("n5"): True, subjects.state("n1"): False}
    finally:
        second.stop()


def test_a_node_joins_with_a_token_file_once_and_a_restart_reuses_its_keys(control_plane, tmp_path):
    """How the Swarm stack's worker starts (compose/stack-multinode.yml): the token from a file (a Docker
    secret), the inference credentials written for the host's applications, and on a restart no new join."""
    role, url = control_plane
    missing = dqoes("serve", "node", "--control-plane", url, "--join-token-file", str(tmp_path / "none"),
                    state=tmp_path / "host-x", timeout=30)
    assert missing.returncode == 2 and "join token file" in missing.stderr, missing.stderr
    token_file = tmp_path / "join-token"
    token_file.write_text(token(role) + "\n")  # one use: a second join with it would be refused
    apps = tmp_path / "apps"
    apps.mkdir()
    node_state = tmp_path / "host-e"
    args = ("--control-plane", url, "--join-token-file", str(token_file), "--apps-creds", str(apps / "inference.creds"),
            "--name", "apps-1", "--runtime", "sim", "--scenario", "paper-identical-achievable", "--time-scale", "10")
    first = serve(node_state, tmp_path / "first.out", "node", *args)
    try:
        first.wait_for("node apps-1: joined")
        first.wait_for("node apps-1: worker on the sim runtime")
    finally:
        assert first.stop() == 0, first.text()
    assert auth.load(apps / "inference.creds").identity == "inference-apps-1"
    keys = json.loads(dqoes("node", "list", "--json", state=role.state).stdout)["nodes"]
    second = serve(node_state, tmp_path / "second.out", "node", *args)
    try:
        second.wait_for("node apps-1: joined")  # "... before; its keys ... are reused"
        second.wait_for("node apps-1: worker on the sim runtime")
        assert "are reused" in second.text(), second.text()
    finally:
        assert second.stop() == 0, second.text()
    assert json.loads(dqoes("node", "list", "--json", state=role.state).stdout)["nodes"] == keys
