"""A control plane on three hosts (services/cli/cpcluster.py), run for real on this one machine.

Three `dqoes serve control-plane` processes, each a member of one NATS cluster (its own nats-server,
routes to the other two over TLS with a test CA, the route password from one shared file; clients
too over TLS only, with the same certificates); a join token made on member 1 pins that CA and
admits a node through member 2; the node's worker (sim runtime) runs rounds; an objective is set.
Member 1's whole process group is then killed with SIGKILL: the node goes on running rounds through
the others, the objective is still listed (the manager runs again on a survivor, loading the R3
bucket), a new node joins through member 3, and `dqoes node revoke` on member 3 cuts the first node
off at every remaining member (its open connection closed, new ones refused).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from role_parts import REPO, Role, dqoes, node_rounds, role_env, serve

from shared import auth, subjects
from shared.bus import Bus, BusError
from shared.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@dataclass
class Member:
    role: Role
    url: str
    ca: Path | None = None
    """The CA its client certificate chains to (the route CA) when it serves clients over TLS."""

    @property
    def bus_url(self) -> str:
        """What the test's own connections use: the URL, verified against the CA when there is one."""
        return auth.with_tls_ca(self.url, self.ca) if self.ca is not None else self.url

    @property
    def dir(self) -> Path:
        return self.role.state / "control-plane"

    @property
    def admin(self) -> Path:
        return self.dir / "auth" / "admin.creds"

    def kill_group(self) -> None:
        """SIGKILL to the member's whole process group, as a lost host."""
        assert self.role.proc is not None
        os.killpg(self.role.proc.pid, signal.SIGKILL)
        self.role.proc.wait()


def start_member(state: Path, out: Path, argv: list[str]) -> Role:
    """`dqoes serve control-plane ...` in a process group of its own (the test kills it whole)."""
    role = Role(["serve", "control-plane", *argv], state, out)
    with out.open("ab") as f:
        role.proc = subprocess.Popen([sys.executable, "-m", "services.cli", *role.argv], stdout=f,
                                     stderr=subprocess.STDOUT, cwd=REPO, env=role_env(state),
                                     start_new_session=True)
    return role


def route_tls(tmp_path: Path) -> list[str]:
    """Flags for TLS routes: a CA and a certificate for 127.0.0.1 signed by it (openssl); [] without
    openssl (the routes then run in clear)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return []
    d = tmp_path / "tls"
    d.mkdir(mode=0o700)

    def run(*argv: str) -> None:
        subprocess.run([openssl, *argv], check=True, capture_output=True, cwd=d)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=dqoes-test-ca")
    run("req", *ec, "-keyout", "route.key", "-out", "route.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    run("x509", "-req", "-in", "route.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "route.pem", "-days", "1", "-extfile", "ext.cnf")
    (d / "route.key").chmod(0o600)
    return ["--cluster-tls-cert", str(d / "route.pem"), "--cluster-tls-key", str(d / "route.key"),
            "--cluster-tls-ca", str(d / "ca.pem")]


def route_info(port: int, tls: list[str] | None) -> str:
    """What a route port sends first: to a plain connection (nothing, as TLS comes first), or after a
    TLS handshake with the members' certificate (its INFO)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        if tls is None:
            raw.settimeout(1.0)
            try:
                return raw.recv(4096).decode()
            except TimeoutError:
                return ""
        flags = dict(zip(tls[::2], tls[1::2], strict=True))
        ctx = ssl.create_default_context(cafile=flags["--cluster-tls-ca"])
        ctx.load_cert_chain(flags["--cluster-tls-cert"], flags["--cluster-tls-key"])
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            return conn.recv(4096).decode()


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    tls = route_tls(tmp_path)
    secret = tmp_path / "cluster.secret"
    secret.write_text("a-shared-route-password-for-the-test\n")
    secret.chmod(0o600)
    client_ports = [free_port() for _ in range(3)]
    route_ports = [free_port() for _ in range(3)]
    out: list[Member] = []
    try:
        for i in range(3):
            routes = ",".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(route_ports) if j != i)
            role = start_member(tmp_path / f"cp{i + 1}", tmp_path / f"cp{i + 1}.out", [
                "--listen", "127.0.0.1", "--port", str(client_ports[i]), "--server-name", f"cp{i + 1}",
                "--cluster-listen", f"127.0.0.1:{route_ports[i]}", "--routes", routes,
                "--cluster-secret-file", str(secret), *tls, *(["--tls"] if tls else [])])
            # With the route certificates, clients too connect over TLS only (services/cli/cptls.py).
            ca = Path(tls[tls.index("--cluster-tls-ca") + 1]) if tls else None
            out.append(Member(role, f"{'tls' if tls else 'nats'}://127.0.0.1:{client_ports[i]}", ca))
        for m in out:
            m.role.wait_for("control plane: ready", timeout_s=60)
        if tls:  # each member's route port speaks only TLS, and only to a certificate of the CA
            for port in route_ports:
                assert route_info(port, None) == "", "a route port answered in clear"
                assert '"tls_required":true' in route_info(port, tls)
        yield out
    finally:
        for m in out:
            if m.role.proc is not None and m.role.proc.poll() is None:
                m.role.stop()


def token(m: Member) -> str:
    r = dqoes("join-token", "create", "--quiet", state=m.role.state)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def join(m: Member, tok: str, node_state: Path, name: str) -> dict[str, str]:
    r = dqoes("join", m.url, "--token", tok, "--name", name, "--json", state=node_state)
    assert r.returncode == 0, r.stderr + r.stdout
    return json.loads(r.stdout.splitlines()[-1])


async def _ask(m: Member, subject: str, body: bytes, timeout_s: float = 40.0) -> dict:
    """A manager's answer through member `m`, asked again while no manager runs (a lease changing hands)."""
    bus = await Bus.connect(m.bus_url, "test-admin", creds=m.admin)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return json.loads(await bus.request(subject, body, timeout_s=2.0))
            except BusError:
                assert time.monotonic() < deadline, f"no manager answered on {subject} through {m.url}"
                await asyncio.sleep(0.3)
    finally:
        await bus.close()


async def _registry_refused(m: Member, creds: Path) -> bool:
    """Whether the replicated registry (tokens' secrets in it) is out of reach of `creds`' identity."""
    bus = await Bus.connect(m.bus_url, "test-snoop", creds=creds)
    try:
        kv = await bus.kv(subjects.KV_CONTROL, replicas=3, wait_s=2.0)
        await kv.get("registry")
        return False
    except BusError:
        return True
    finally:
        await bus.close()


async def _cut_off(connected: Bus, creds: Path, urls: list[str], revoke: object) -> tuple[bool, list[str]]:
    """Revoke while `connected` is open: whether it was closed, and each URL's refusal afterwards."""
    r = await asyncio.to_thread(revoke)  # type: ignore[arg-type]
    assert r.returncode == 0, r.stderr  # type: ignore[attr-defined]
    deadline = time.monotonic() + 15
    while connected._nc.is_connected and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    cut = not connected._nc.is_connected
    await connected.close()
    refusals = []
    for url in urls:
        try:
            again = await Bus.connect(url, "revoked-again", creds=creds, connect_timeout_s=3)
            await again.close()
            refusals.append("connected")
        except BusError as e:
            refusals.append(str(e))
    return cut, refusals


def test_three_members_survive_a_lost_host_and_share_joins_and_revokes(members, tmp_path):
    # Exactly one manager, under the lease; its member is the one lost below ("member 1"), so the
    # manager has to start again elsewhere.
    deadline = time.monotonic() + 30
    while not any("manager started" in m.role.text() for m in members):
        assert time.monotonic() < deadline, "no member started the manager"
        time.sleep(0.2)
    assert sum("manager started" in m.role.text() for m in members) == 1
    m1 = next(m for m in members if "manager started" in m.role.text())
    m2, m3 = [m for m in members if m is not m1]

    # A token made on member 1 admits a node through member 2; the node keeps every member's URL.
    node_state = tmp_path / "host-a"
    tok = token(m1)
    assert tok.startswith("DQJ2-") == (m1.ca is not None), tok  # a TLS control plane's token pins its CA
    record = join(m2, tok, node_state, "worker-1")
    assert sorted(auth.server_list(record["control_plane"])) == sorted(m.url for m in members), record
    creds = node_state / "node" / "auth" / "worker-worker-1.creds"
    assert asyncio.run(_registry_refused(m2, creds)), "a node's identity could read the join registry"
    node = serve(node_state, tmp_path / "node.out", "node", "--runtime", "sim", "--scenario",
                 "paper-identical-achievable", "--time-scale", "10")
    try:
        node.wait_for("node worker-1: worker on the sim runtime")
        asyncio.run(node_rounds(m3.bus_url, m3.admin, "worker-1", 2))
        stored = asyncio.run(_ask(m2, subjects.TARGETS, b'{"container":"c01","objective":30}'))
        assert stored["ok"], stored

        # Member 1's host is lost, with the manager.
        lost_at = time.monotonic()
        m1.kill_group()
        assert len(asyncio.run(node_rounds(m3.bus_url, m3.admin, "worker-1", 3))) >= 3
        rounds_s = time.monotonic() - lost_at
        targets = asyncio.run(_ask(m3, subjects.TARGETS_LIST, b"{}"))
        answered_s = time.monotonic() - lost_at
        assert targets["ok"], targets
        assert [t["objective_s"] for t in targets["targets"] if t.get("container") == "c01"] == [30], targets
        assert sum("manager started" in m.role.text() for m in (m2, m3)) == 1
        print(f"member lost: 3 rounds seen {rounds_s:.1f} s after, the objective listed by the new manager "
              f"{answered_s:.1f} s after")

        # Tokens are the same on every member: one made on member 2 is listed on member 3.
        spare = dqoes("join-token", "create", "--json", "--uses", "2", state=m2.role.state)
        assert spare.returncode == 0, spare.stderr
        listed = json.loads(dqoes("join-token", "list", "--json", state=m3.role.state).stdout)["tokens"]
        assert json.loads(spare.stdout)["id"] in [t["id"] for t in listed], listed

        # A new node joins through member 3 with a token made there.
        assert join(m3, token(m3), tmp_path / "host-b", "n2")["node"] == "n2"

        # Revoking worker-1 on member 3 cuts it off at member 2 too.
        node.stop()

        async def revoke() -> tuple[bool, list[str]]:
            connected = await Bus.connect(m2.bus_url, "worker-1-open", creds=creds, reconnect_wait_s=0.2)
            return await _cut_off(connected, creds, [m2.bus_url, m3.bus_url],
                                  lambda: dqoes("node", "revoke", "worker-1", state=m3.role.state))

        cut, refusals = asyncio.run(revoke())
        assert cut, "the revoked node's connection to member 2 was kept"
        assert all("authorization" in r.lower() for r in refusals), refusals
        key = auth.load(creds).nkey
        for m in (m2, m3):
            assert key not in auth.config_path(m.dir / "auth").read_text(), m.url
        remaining = json.loads(dqoes("node", "list", "--json", state=m2.role.state).stdout)["nodes"]
        assert [n["node"] for n in remaining] == ["n2"]
    finally:
        node.stop()
