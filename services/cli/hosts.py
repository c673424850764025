"""What the host-role commands share: where each role keeps its state, the join request and its answer.

Why its own module: `dqoes serve` (services/cli/serve.py) runs the roles and
`dqoes join`, `join-token`, `node` (services/cli/join.py) act on them; the
command modules never import one another, so the layout of a role's state
directory, the control plane's server configuration and both ends of the
join exchange live here.

Layout under the state directory (`state_dir`, hostconfig.py):
`control-plane/` (auth/: credentials and nats-server.conf; join/: tokens and
the registry of joined nodes; jetstream/; logs) and `node/` (auth/: this
node's own worker and inference credentials; node.json: its name and the
control plane it joined; logs). Each role holds its directory's lock while
it runs (services.cli.deployments), and its PID is in the lock file: `dqoes
node revoke` sends it SIGHUP to have the control plane regenerate its
authorization and reload nats-server.

The join exchange (shared/joining.py has the token side): the node connects
anonymously, which the control plane's server maps to the `join` identity
(publish `dqoes.join.request`, read `_INBOX.join.>`, nothing else), and
sends its public keys with the token's proof; the registrar (a connection of
the control plane's supervisor with its own identity) admits them, rewrites
the authorization and reloads the server, then answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from services.cli import deployments
from services.cli.common import CliError
from shared import auth, authfiles, joining, subjects, tlspin
from shared.bus import Bus, BusError, Incoming

CONTROL_PLANE = "control-plane"
NODE = "node"
NODE_RECORD = "node.json"
TLS_CA_NAME = "ca.pem"
"""In the node's directory: the control plane's CA its join token pinned (shared/tlspin.py)."""
REGISTRARS = "registrars"
"""The queue group of the registrars (one answers each join request)."""


def state_root(cfg: dict[str, Any]) -> Path:
    return Path(cfg.get("state_dir") or deployments.state_dir())


def role_dir(cfg: dict[str, Any], role: str) -> Path:
    return state_root(cfg) / role


def auth_dir(root: Path) -> Path:
    return root / "auth"


def join_dir(root: Path) -> Path:
    return root / "join"


def default_node_name() -> str:
    return subjects.validate_id(socket.gethostname().split(".")[0] or "node", "node")


# --- the control plane's authorization --------------------------------------------------------


def write_authorization(root: Path, accept_joins: bool) -> Path:
    """The control plane's nats-server.conf from its registry of joined nodes (shared/auth.py)."""
    try:
        joined = joining.joined_nodes(join_dir(root))
        return auth.control_plane_config(
            auth_dir(root), [(n.node, n.worker_nkey, n.inference_nkey) for n in joined.values()],
            accept_joins=accept_joins)
    except (joining.JoinError, auth.AuthError) as e:
        raise CliError(str(e)) from None


def reserved_names(root: Path) -> frozenset[str]:
    """Node names a joining node may not take: those with identities made on the control plane."""
    return frozenset(auth.nodes_of(auth_dir(root)))


def signal_control_plane(root: Path) -> int | None:
    """SIGHUP to the running control plane of `root` (it regenerates its authorization and reloads
    nats-server); its PID, or None when none runs (the next start reads the registry)."""
    pid = deployments.holder(root)
    if pid is None:
        return None
    try:
        os.kill(pid, signal.SIGHUP)
    except PermissionError:
        raise CliError(f"the control plane (PID {pid}) runs as another user: run this as that user") from None
    except ProcessLookupError:
        return None
    return pid


def wait_config_without(root: Path, key: str, timeout_s: float = 10.0) -> bool:
    """Wait until the control plane's server config no longer names `key` (it was regenerated)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if key not in auth.config_path(auth_dir(root)).read_text():
                return True
        except OSError:
            return False
        time.sleep(0.05)
    return False


# --- the registrar: the control plane's end of a join -------------------------------------------


T = TypeVar("T")


class Replicated(Protocol):
    """The registry of a control plane on several hosts (services/cli/cpcluster.py's Member)."""

    def change(self, fn: Callable[[joining.Registry], T]) -> Awaitable[T]: ...

    def servers(self) -> Awaitable[list[str]]: ...


class Registrar:
    """Answers join requests on `dqoes.join.request` for the control plane at `root`."""

    def __init__(self, root: Path, on_change: Callable[[], None], replicated: Replicated | None = None) -> None:
        self.root = root
        self.on_change = on_change
        """Called after the registry changed: regenerate the authorization and reload the server."""
        self.replicated = replicated
        """A member of several: joins change the replicated registry, whose watch regenerates."""
        self.log: list[str] = []

    async def handle(self, bus: Bus, incoming: Incoming) -> None:
        joined = None
        try:
            request = joining.decode_request(incoming.data)
            now, reserved = time.time(), reserved_names(self.root)
            answer: dict[str, Any] = {"ok": True}
            if self.replicated is None:
                joined = joining.accept(join_dir(self.root), request, now, reserved)
            else:
                joined = await self.replicated.change(lambda reg: joining.admit(reg, request, now, reserved))
                answer["servers"] = await self.replicated.servers()
            answer.update(node=joined.node,
                          identities=[auth.identity_name(r, joined.node) for r in auth.PER_NODE])
        except BusError as e:
            answer = {"ok": False, "error": f"join not recorded: {e}"}
            self.log.append(f"a join request could not be recorded: {e}")
        except joining.JoinError as e:
            answer = {"ok": False, "error": str(e)}
            self.log.append(f"refused a join request: {e}")
        # The answer first: the reload that follows re-checks every connection, the joiner's too. The
        # node then connects with its new identity, retrying until the reload has taken it in.
        await bus.reply(incoming, json.dumps(answer).encode())
        await bus.flush()
        if joined is not None and self.replicated is not None:
            self.log.append(f"node {joined.node} joined (token {joined.token_id}); every member admits it")
        elif joined is not None:
            try:
                self.on_change()
                self.log.append(f"node {joined.node} joined (token {joined.token_id})")
            except CliError as e:
                self.log.append(f"node {joined.node} admitted, but the authorization was not regenerated: {e}")

    async def start(self, bus: Bus) -> None:
        # One registrar answers each request: the members of a control plane on several hosts all
        # subscribe, and a second answer (the token then used up) would race the first to the node.
        await bus.subscribe_raw(subjects.JOIN_REQUEST, lambda m: self.handle(bus, m), queue=REGISTRARS)


# --- the node's end ----------------------------------------------------------------------------


def read_record(root: Path) -> dict[str, Any] | None:
    """What `dqoes join` recorded: {"node", "control_plane", "tls_ca"} (tls_ca: the CA file pinned by
    the token, None for a control plane without TLS); None before a join."""
    p = root / NODE_RECORD
    if not p.exists():
        return None
    try:
        obj = json.loads(p.read_text())
        ca = obj.get("tls_ca")
        return {"node": str(obj["node"]), "control_plane": str(obj["control_plane"]),
                "tls_ca": str(ca) if ca else None}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise CliError(f"{p}: unreadable; remove it and join again") from None


def pinned_ca(url: str, token: str, timeout_s: float = 10.0) -> str | None:
    """The CA (PEM) a `DQJ2` token pins, as the control plane at `url` shows it (shared/tlspin.py);
    None for a token that pins none. CliError (one line) when no server of `url` shows it: a server
    that shows another CA is refused at once, one that cannot be reached lets the next be tried."""
    try:
        pin = joining.token_pin(token)
    except joining.JoinError as e:
        raise CliError(str(e)) from None
    if pin is None:
        return None
    last: tlspin.PinError | None = None
    for one in auth.server_list(auth.split_url(url)[0]):
        parts = urlsplit(one)
        try:
            return tlspin.pinned_ca(parts.hostname or "", parts.port or 4222, pin, timeout_s=min(timeout_s, 5.0))
        except tlspin.Mismatch as e:
            raise CliError(f"join refused: {e}") from None
        except tlspin.PinError as e:
            last = e
    raise CliError(f"join: {last}")


async def _ask(url: str, data: bytes, timeout_s: float) -> bytes:
    bus = await Bus.connect(url, "dqoes-join", connect_timeout_s=timeout_s, inbox_prefix=auth.JOIN_INBOX)
    try:
        return await bus.request(subjects.JOIN_REQUEST, data, timeout_s=timeout_s)
    finally:
        await bus.close()


async def _verify(url: str, creds: auth.Credentials, timeout_s: float) -> None:
    """Connect as the new worker identity until the server takes it (its reload may still be running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            bus = await Bus.connect(url, f"dqoes-join-check-{creds.identity}", creds=creds, connect_timeout_s=2.0)
        except BusError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        await bus.close()
        return


def _why(error: str, pinned: bool) -> str:
    """What to do about a join whose connection failed, from its error."""
    if "CERTIFICATE_VERIFY_FAILED" not in error:
        return "is the control plane running there, with accept_joins on?"
    if not pinned:
        return ("the control plane serves TLS with a CA this host does not trust, and the token pins none: make a "
                "new token there, `dqoes join-token create` pins its CA")
    if "mismatch" in error:
        return ("the control plane's certificate does not name the host or address this node reached it by: add "
                "it to tls_names there and restart the role")
    return "the control plane's certificate is not signed by the CA the token pinned"


def join(root: Path, url: str, token: str, node: str, timeout_s: float = 10.0,
         ca_pem: str | None = None) -> dict[str, Any]:
    """Join the control plane at `url` as `node`: keys made here, public halves sent with the token's
    proof, the record written once the control plane admitted them and the worker identity connects.
    A token that pins a CA: `ca_pem` (`pinned_ca`, checked now when not given) is kept beside the keys
    and every connection is TLS verified against it. CliError (one line) when refused."""
    if ca_pem is None:
        ca_pem = pinned_ca(url, token, timeout_s)
    try:
        node = subjects.validate_id(node, "node")
        worker, inference = auth.ensure_node_keys(auth_dir(root), node)
        request = joining.make_request(token, node, worker.nkey, inference.nkey)
    except (ValueError, auth.AuthError) as e:
        raise CliError(str(e)) from None
    plain = auth.split_url(url)[0]
    ca_file = None
    if ca_pem is not None:
        ca_file = root / TLS_CA_NAME
        try:
            authfiles.write_private(ca_file, ca_pem)
        except authfiles.UnsafePathError as e:
            raise CliError(str(e)) from None
        plain = auth.with_tls_ca(plain, ca_file)
    try:
        reply = asyncio.run(_ask(plain, joining.encode_request(request), timeout_s))
    except BusError as e:
        raise CliError(f"join: {e} ({_why(str(e), ca_pem is not None)})") from None
    try:
        answer = json.loads(reply)
    except ValueError:
        raise CliError(f"join: the control plane at {auth.redact(plain)} answered something else") from None
    if not answer.get("ok"):
        raise CliError(str(answer.get("error") or "join refused"))
    try:
        asyncio.run(_verify(plain, worker, timeout_s))
    except BusError as e:
        raise CliError(f"join: admitted, but the worker identity cannot connect: {e}") from None
    servers = answer.get("servers")
    if isinstance(servers, list) and servers and all(isinstance(s, str) for s in servers):
        # A control plane of several members: the node keeps every member's URL, the one it asked first.
        given = auth.server_list(auth.without_tls_ca(plain))
        plain = ",".join(given + [s for s in servers if s not in given])
    record = {"node": node, "control_plane": auth.without_tls_ca(plain),
              "tls_ca": str(ca_file) if ca_file is not None else None}
    try:
        authfiles.write_private(root / NODE_RECORD, json.dumps(record) + "\n")
    except authfiles.UnsafePathError as e:
        raise CliError(str(e)) from None
    return record
