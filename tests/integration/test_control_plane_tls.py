"""A control plane serving TLS (services/cli/cptls.py), a node joining with a token that pins its CA.

Real processes and a real nats-server: `dqoes serve control-plane --tls` (a private CA made in its
state directory), `dqoes join-token create` (a DQJ2 token carrying the CA's SHA-256), `dqoes join`
and `dqoes serve node` (sim runtime) on the node. The node reaches the control plane through a TCP
relay of the test's, which records every byte the node sends, so the test reads what crossed the
"wire": the worker's rounds arrive, and neither its subjects nor its node name appear in clear. A
plaintext connection sent through the same relay is refused by the server, and its CONNECT is seen
in the record (so the record does show clear text when there is some). A token whose digest is not
the server's CA is refused with one line, before anything is written or sent: the node's directory
is not made and the token keeps its use.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from role_parts import Role, dqoes, node_rounds, serve

from shared import auth
from shared.ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

SCENARIO = ("--runtime", "sim", "--scenario", "paper-identical-achievable", "--time-scale", "10")
NODE = "worker-1"  # the scenario's node


class Relay:
    """127.0.0.1:port -> the control plane's port, byte for byte; keeps what clients sent."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.sent: list[bytearray] = []
        """What each connection's client sent, in order of connection."""
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            record = bytearray()
            with self._lock:
                self.sent.append(record)
            threading.Thread(target=self._pipe, args=(client, server, record), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, None), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if record is not None:
                    with self._lock:
                        record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def client_bytes(self) -> bytes:
        with self._lock:
            return b"".join(bytes(r) for r in self.sent)

    def close(self) -> None:
        self._sock.close()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Role, int]]:
    state = tmp_path_factory.mktemp("cp-tls")
    port = free_port()
    role = serve(state, state.parent / "cp-tls.out", "control-plane", "--listen", "127.0.0.1", "--port", str(port),
                 "--tls")
    try:
        role.wait_for("control plane: ready", timeout_s=60)
        yield role, port
    finally:
        role.stop()


def ca_file(role: Role) -> Path:
    return role.state / "control-plane" / "tls" / "ca.pem"


def token(role: Role) -> str:
    r = dqoes("join-token", "create", "--quiet", state=role.state)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def plaintext_connect(port: int) -> tuple[bytes, bool]:
    """A NATS client that speaks in clear: INFO read, CONNECT and PING sent; what the server answers,
    and whether it closed the connection (within 5 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        info = s.recv(4096)
        assert info.startswith(b"INFO ") and json.loads(info[5:])["tls_required"] is True
        s.sendall(b'CONNECT {"verbose":false,"name":"in-clear"}\r\nPING\r\n')
        answer = b""
        try:
            while chunk := s.recv(4096):
                answer += chunk
        except OSError:
            return answer, False
        return answer, True


def test_a_node_joins_over_tls_with_a_pinned_ca_and_its_traffic_is_not_in_clear(control_plane, tmp_path):
    role, port = control_plane
    ca = ca_file(role)
    assert ca.stat().st_mode & 0o077 == 0
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(ca.read_text())).hexdigest()
    tok = token(role)
    assert tok.startswith(f"DQJ2-{digest}-"), tok
    relay = Relay(port)
    try:
        # In clear, the server takes nothing: it asks for TLS and closes the connection.
        answer, closed = plaintext_connect(relay.port)
        assert closed and b"PONG" not in answer and b"+OK" not in answer, answer
        assert b"CONNECT" in relay.client_bytes()  # the record shows clear text when there is some
        before = len(relay.sent)

        node_state = tmp_path / "node-host"
        r = dqoes("join", f"tls://127.0.0.1:{relay.port}", "--token", tok, "--name", NODE, "--json",
                  state=node_state)
        assert r.returncode == 0, r.stderr
        record = json.loads((node_state / "node" / "node.json").read_text())
        assert record["control_plane"] == f"tls://127.0.0.1:{relay.port}"
        assert Path(record["tls_ca"]).read_text() == ca.read_text()  # the CA the token pinned, kept
        node = serve(node_state, tmp_path / "node.out", "node", *SCENARIO)
        try:
            node.wait_for(f"control plane tls://127.0.0.1:{relay.port}", timeout_s=30)
            admin = role.state / "control-plane" / "auth" / "admin.creds"
            seen = asyncio.run(node_rounds(auth.with_tls_ca(f"tls://127.0.0.1:{port}", ca), admin, NODE, 3))
            assert len(seen) >= 3
        finally:
            node.stop()
        sent = b"".join(bytes(r) for r in relay.sent[before:])
        assert len(sent) > 2000, len(sent)  # the join and the worker's rounds went through the relay
        for clear in (b"CONNECT", b"PUB ", b"dqoes.", NODE.encode(), b"worker_nkey"):
            assert clear not in sent, clear
        assert "returning true from eof_received" not in (node_state / "node" / f"worker-{NODE}.log").read_text()
    finally:
        relay.close()


def test_a_token_pinning_another_ca_is_refused_before_anything_is_sent_or_written(control_plane, tmp_path):
    role, port = control_plane
    tok = token(role)
    token_id = tok.split("-")[2]
    forged = f"DQJ2-{hashlib.sha256(b'another CA').hexdigest()}-{tok.split('-', 2)[2]}"
    node_state = tmp_path / "node-host"
    r = dqoes("join", f"tls://127.0.0.1:{port}", "--token", forged, "--name", "n-forged", state=node_state)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not the control plane the token was made for" in lines[0], r.stderr
    assert not node_state.exists()  # no key, no CA, no record, no directory
    listed = json.loads(dqoes("join-token", "list", "--json", state=role.state).stdout)["tokens"]
    assert {t["id"]: t["uses_left"] for t in listed}[token_id] == 1  # no join request reached it
    # The genuine token, the same id and secret, joins: the refusal was the digest's.
    ok = dqoes("join", f"tls://127.0.0.1:{port}", "--token", tok, "--name", "n-genuine", state=node_state)
    assert ok.returncode == 0, ok.stderr


def test_serve_node_joins_with_a_pinned_token_on_its_first_start(control_plane, tmp_path):
    """`dqoes serve node --join-token` (the unit's path, a Docker secret's) checks the pin as `dqoes join` does."""
    role, port = control_plane
    dqoes("node", "revoke", NODE, state=role.state)  # the scenario's node, joined by another test of the module
    node_state = tmp_path / "node-host"
    node = serve(node_state, tmp_path / "node.out", "node", "--control-plane", f"nats://127.0.0.1:{port}",
                 "--join-token", token(role), "--name", NODE, *SCENARIO)
    try:
        node.wait_for(f"node {NODE}: joined tls://127.0.0.1:{port}", timeout_s=30)  # nats:// taken as tls://
        log = node_state / "node" / f"worker-{NODE}.log"
        deadline = time.monotonic() + 30
        while "connected to NATS at tls://127.0.0.1" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, node.text()
            time.sleep(0.1)
        assert (node_state / "node" / "ca.pem").read_text() == ca_file(role).read_text()
    finally:
        node.stop()


def test_a_control_plane_on_loopback_stays_plain_and_its_tokens_pin_nothing(tmp_path):
    port = free_port()
    role = serve(tmp_path, tmp_path / "cp.out", "control-plane", "--listen", "127.0.0.1", "--port", str(port))
    try:
        role.wait_for("control plane: ready", timeout_s=60)
        assert token(role).startswith("DQJ1-")
        assert not (tmp_path / "control-plane" / "tls.json").exists()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            assert '"tls_required":true' not in s.recv(4096).decode()
    finally:
        role.stop()
