"""Who may say what on the bus: identities per role, their NATS permissions, their credentials.

Why: DQoES moves the CPU of production hosts on the strength of what it reads
on NATS. An anonymous client that can publish a node state, a latency event,
an objective hand-over or a control message can steer it (issue 11 lists the
forgeries). So every deployment runs with authentication and per-user
subject permissions, enforced by nats-server itself (the table is `_rules`;
docs/guide/security.md has the threat model).

No secret on the wire: each identity is a NATS nkey (Ed25519). The server
knows only the public key; a client proves it holds the seed by signing the
nonce the server sends (challenge-response), so a server impostor on the
port learns nothing it could replay.

Replies only to the requester: each identity has its own inbox prefix
(`_INBOX.<identity>`) and may subscribe only to that, so no one reads the
replies meant for another. Responders (manager, workers) may publish on
`_INBOX.>` and nothing else for replies (no `allow_responses`: with it a
requester could aim a reply at any subject the responder may publish on,
the objectives bucket included); `shared.bus` also refuses to answer on a
reply subject outside `_INBOX.`. The objectives bucket is written by its own
identity, `store`, whose connection serves no requests.

Credentials: one nkey per identity, generated at first start into a
directory (`<data dir>/auth/`, mode 0700, files 0600, never in the
repository; a directory another user could change is refused, files are
written without following links: shared/authfiles.py): `<identity>.creds` (JSON: identity, nkey (public), seed,
inbox_prefix) for each, and `nats-server.conf`, the server's `authorization`
block (public keys only). A process reads its file (`--creds FILE`,
`$DQOES_NATS_CREDS`); URLs carry only the file's path (`with_credentials`,
`?creds=PATH`), never the seed. A `tls://` URL may name the CA its server's
certificate is verified against (`with_tls_ca`, `?ca=PATH`: a control plane's
private CA, pinned by `dqoes join`); the bus builds its TLS context from it
(`tls_context`). Adding a node: `ensure(dir, nodes=[...])`
writes the new identities and the new config (then reload the server);
rotating: `ensure(dir, rotate=True)`.

Pure apart from reading and writing files in the given directory (and
silencing asyncio's TLS end-of-file warning, `tls_context`): no NATS
here (the bus is the only NATS client). Standard library only, keys included
(`shared/nkey.py`): `python3 -m shared.auth init` runs on a bare host.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from shared import authfiles, subjects
from shared.nkey import NkeyError, new_user_seed
from shared.nkey import public_key as _public_key

CREDS_ENV = "DQOES_NATS_CREDS"
"""Environment variable naming a credentials file (the `--creds` flag's default)."""

CONFIG_NAME = "nats-server.conf"
NODES_NAME = "nodes.json"
ROLES = ("admin", "manager", "store", "client", "worker", "inference")
"""Roles; `worker` and `inference` identities are per node (`worker-<node>`)."""

PER_NODE = ("worker", "inference")
INBOX_ROOT = "_INBOX"
"""Every inbox is under it; responders may publish there and nowhere else for replies."""
CREDS_QUERY = "creds"
CA_QUERY = "ca"
"""`tls://HOST:PORT?ca=PATH`: the CA file (PEM) the server's certificate must chain to."""
"""The URL query parameter naming a credentials file (`nats://host:4222?creds=/path/client.creds`)."""


class AuthError(ValueError):
    """A credentials file or directory that cannot be used; the text says which and why."""


def public_key(seed: str) -> str:
    """The public nkey (`U...`) of a user seed; AuthError if it is not one."""
    try:
        return _public_key(seed)
    except NkeyError as e:
        raise AuthError(str(e)) from None


@dataclass(frozen=True, slots=True)
class Credentials:
    """One identity's key pair and inbox; `path`: the file it was read from (None if not from one)."""

    identity: str
    nkey: str
    seed: str = field(repr=False)
    inbox_prefix: str
    path: Path | None = field(default=None, compare=False)

    @classmethod
    def generate(cls, identity: str) -> Credentials:
        seed = new_user_seed()
        return cls(identity, public_key(seed), seed, inbox_prefix(identity))

    def to_json(self) -> str:
        return json.dumps({"identity": self.identity, "nkey": self.nkey, "seed": self.seed,
                           "inbox_prefix": self.inbox_prefix}) + "\n"


def inbox_prefix(identity: str) -> str:
    """`_INBOX.<identity>`: where this identity's replies come, and only it may read."""
    return f"{INBOX_ROOT}.{subjects.token(identity, 'identity')}"


@dataclass(frozen=True, slots=True)
class Permissions:
    """One identity's NATS permissions: subjects it may publish and subscribe to."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


@dataclass
class Identity:
    name: str
    role: str
    node: str | None
    permissions: Permissions
    credentials: Credentials | None = field(default=None)


def identity_name(role: str, node: str | None = None) -> str:
    """`admin`, `manager`, `store`, `client`, or `worker-<node>` / `inference-<node>`."""
    if role not in ROLES:
        raise AuthError(f"unknown role {role!r} (roles: {', '.join(ROLES)})")
    if role in PER_NODE:
        if node is None:
            raise AuthError(f"role {role} needs a node")
        return f"{role}-{subjects.token(node, 'node')}"
    return role


# --- the permission table ----------------------------------------------------------------

JS_API = "$JS.API"


def bucket_subjects(bucket: str) -> tuple[str, ...]:
    """What a writer of one key-value bucket needs (and nothing to delete or purge it)."""
    stream = f"KV_{bucket}"
    return (
        f"{JS_API}.INFO",
        f"{JS_API}.STREAM.CREATE.{stream}",
        f"{JS_API}.STREAM.INFO.{stream}",
        f"{JS_API}.STREAM.MSG.GET.{stream}",
        f"{JS_API}.CONSUMER.CREATE.{stream}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.>",
        f"{JS_API}.CONSUMER.DELETE.{stream}.>",
        f"{JS_API}.CONSUMER.INFO.{stream}.>",
        f"{JS_API}.DIRECT.GET.{stream}",
        f"{JS_API}.DIRECT.GET.{stream}.>",
        f"$KV.{bucket}.>",
        f"$JS.FC.{stream}.>",
        f"$JS.ACK.{stream}.>",
    )


REPLIES = f"{INBOX_ROOT}.>"
"""What a responder may publish its replies on: inboxes, nothing else."""
P = subjects.PREFIX


def _rules(role: str, node: str | None, bucket: str, own_inbox: str) -> Permissions:
    """The permission table. Add a new subject here: who publishes, who subscribes."""
    inbox = f"{own_inbox}.>"
    client_pub = (subjects.TARGETS, subjects.TARGETS_ALL, subjects.CLUSTER_QUERY, subjects.CLUSTER_CONTAINERS,
                  subjects.SUBMIT)
    client_sub = (subjects.CLUSTER_STATE, subjects.STATE_ALL, subjects.DECISIONS_ALL,
                  subjects.LATENCY_ALL, subjects.TRAINING_ALL, subjects.PROGRESS_ALL, inbox)
    if role == "admin":
        return Permissions(publish=(*client_pub, subjects.CONTROL_ALL), subscribe=(f"{P}.>", inbox))
    if role == "client":
        return Permissions(publish=client_pub, subscribe=client_sub)
    if role == "manager":
        return Permissions(
            publish=(subjects.OBJECTIVES_ALL, subjects.CLUSTER_STATE, subjects.LAUNCH_ALL, REPLIES),
            subscribe=(subjects.STATE_ALL, subjects.TARGETS, subjects.TARGETS_ALL, subjects.CLUSTER_QUERY,
                       subjects.CLUSTER_CONTAINERS, subjects.CLUSTER_STATE, subjects.SUBMIT, subjects.TRAINING_ALL,
                       inbox),
        )
    if role == "store":
        # The manager's second connection: the objectives bucket, and it answers nobody.
        return Permissions(publish=bucket_subjects(bucket), subscribe=(inbox,))
    assert node is not None
    if role == "worker":
        return Permissions(
            publish=(subjects.decisions(node), subjects.state(node), subjects.latency_of_node(node),
                     subjects.training(node), subjects.progress_of_node(node), REPLIES),
            subscribe=(subjects.latency_of_node(node), subjects.objectives(node), subjects.control(node),
                       subjects.progress_of_node(node), subjects.launch(node), inbox),
        )
    if role == "inference":
        # The node's inference containers and training jobs: their own batches and epochs.
        return Permissions(publish=(subjects.latency_of_node(node), subjects.progress_of_node(node)), subscribe=())
    raise AuthError(f"unknown role {role!r}")


def identities(nodes: Iterable[str], bucket: str = subjects.KV_OBJECTIVES) -> list[Identity]:
    """Every identity of a deployment with these nodes, without credentials."""
    out = [Identity(r, r, None, _rules(r, None, bucket, inbox_prefix(r))) for r in ("admin", "manager", "store",
                                                                                   "client")]
    for node in sorted(set(nodes)):
        for role in PER_NODE:
            name = identity_name(role, node)
            out.append(Identity(name, role, node, _rules(role, node, bucket, inbox_prefix(name))))
    return out


# --- the server's configuration ----------------------------------------------------------


def _q(text: str) -> str:
    """A NATS config string: JSON quoting is valid there."""
    return json.dumps(text)


def _list(items: Iterable[str]) -> str:
    return "[" + ", ".join(_q(i) for i in items) + "]"


def server_config(ids: Iterable[Identity]) -> str:
    """The `authorization` block for nats-server (include it or pass it with -c): public keys only."""
    lines = ["# Generated by DQoES (shared/auth.py): one nkey user per identity (public keys only).",
             "authorization {", "  users = ["]
    for i in ids:
        if i.credentials is None:
            raise AuthError(f"identity {i.name} has no credentials")
        p = i.permissions
        sub = f"{{allow: {_list(p.subscribe)}}}" if p.subscribe else f"{{deny: {_list(['>'])}}}"
        lines.append(f"    # {i.name}")
        lines.append(
            f"    {{nkey: {_q(i.credentials.nkey)}, "
            f"permissions: {{publish: {{allow: {_list(p.publish)}}}, subscribe: {sub}}}}}"
        )
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


# --- credentials on disk ----------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    try:
        authfiles.write_private(path, text)
    except authfiles.UnsafePathError as e:
        raise AuthError(str(e)) from None


def load(path: str | os.PathLike[str]) -> Credentials:
    """Read a credentials file (JSON: identity, nkey, seed, inbox_prefix); AuthError naming the file."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except OSError as e:
        raise AuthError(f"credentials file {p}: {e.strerror or e}") from None
    except ValueError:
        raise AuthError(f"credentials file {p}: not JSON") from None
    keys = ("identity", "nkey", "seed", "inbox_prefix")
    if not (isinstance(obj, dict) and all(isinstance(obj.get(k), str) and obj[k] for k in keys)):
        raise AuthError(f"credentials file {p}: expected JSON with {', '.join(keys)} "
                        "(an older password file? run `dqoes auth rotate`)")
    try:
        derived = public_key(obj["seed"])
    except AuthError as e:
        raise AuthError(f"credentials file {p}: seed: {e}") from None
    if derived != obj["nkey"]:
        raise AuthError(f"credentials file {p}: the seed does not match the nkey")
    if not obj["inbox_prefix"].startswith(INBOX_ROOT + "."):
        raise AuthError(f"credentials file {p}: inbox_prefix must start with {INBOX_ROOT}.")
    return Credentials(obj["identity"], obj["nkey"], obj["seed"], obj["inbox_prefix"], p.resolve())


def creds_path(directory: str | os.PathLike[str], name: str) -> Path:
    return Path(directory) / f"{name}.creds"


def peer_creds(creds_file: str | os.PathLike[str] | None, name: str) -> Path | None:
    """The credentials file of identity `name` beside `creds_file` (a deployment keeps them all in one
    directory); None where there is none. How a worker finds its node's inference identity, which the
    processes it starts get instead of its own."""
    if not creds_file:
        return None
    p = creds_path(Path(creds_file).parent, name)
    return p if p.is_file() else None


def config_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CONFIG_NAME


def ensure(directory: str | os.PathLike[str], nodes: Iterable[str] = (), *,
           bucket: str = subjects.KV_OBJECTIVES, rotate: bool = False,
           extra: Iterable[Identity] = ()) -> Path:
    """Make sure `directory` holds credentials for every identity and the server config.

    Existing credentials are kept (unless `rotate`, or they are not nkeys);
    nodes named before are kept too, so adding a node never removes
    another. `extra`: identities beyond the roles (the test suite's
    all-subjects user); not remembered. Returns the config path.
    """
    try:  # refused when another user could control it (shared/authfiles.py)
        d = authfiles.secure_dir(directory)
    except authfiles.UnsafePathError as e:
        raise AuthError(str(e)) from None
    nodes_file = d / NODES_NAME
    known: set[str] = set()
    if nodes_file.exists():
        try:
            known = set(json.loads(nodes_file.read_text()))
        except (OSError, ValueError, TypeError):
            raise AuthError(f"{nodes_file}: unreadable; remove it and list the nodes again") from None
    all_nodes = known | {subjects.validate_id(n, "node") for n in nodes}
    ids = identities(all_nodes, bucket) + list(extra)
    for i in ids:
        path = creds_path(d, i.name)
        existing = None
        if path.exists() and not rotate:
            try:
                existing = load(path)
            except AuthError:
                existing = None  # a password file of an older version: replaced by a key
        if existing is not None and existing.identity == i.name:
            i.credentials = existing
        else:
            i.credentials = Credentials.generate(i.name)
            _write_private(path, i.credentials.to_json())
    _write_private(nodes_file, json.dumps(sorted(all_nodes)) + "\n")
    _write_private(config_path(d), server_config(ids))
    return config_path(d)


def nodes_of(directory: str | os.PathLike[str]) -> list[str]:
    f = Path(directory) / NODES_NAME
    try:
        return sorted(json.loads(f.read_text()))
    except (OSError, ValueError, TypeError):
        return []


# --- hosts that join a control plane (shared/joining.py) ----------------------------------

REGISTRAR = "registrar"
"""The control plane's identity that answers join requests (its only permissions: that)."""
JOIN_USER = "join"
"""What an anonymous connection to a control plane becomes (`no_auth_user`): it may publish a join
request and read the replies under `_INBOX.join`, nothing else."""
JOIN_INBOX = f"{INBOX_ROOT}.{JOIN_USER}"


def registrar_identity() -> Identity:
    """Answers joins and, on a control plane of several members, keeps the replicated registry and the
    manager's lease (services/cli/cpcluster.py): those two buckets and nothing else of JetStream."""
    buckets = (*bucket_subjects(subjects.KV_CONTROL), *bucket_subjects(subjects.KV_LEADER))
    own = f"{inbox_prefix(REGISTRAR)}.>"
    return Identity(REGISTRAR, REGISTRAR, None,
                    Permissions(publish=(REPLIES, *buckets),
                                subscribe=(subjects.JOIN_REQUEST, own)))


def join_permissions() -> Permissions:
    return Permissions(publish=(subjects.JOIN_REQUEST,), subscribe=(f"{JOIN_INBOX}.>",))


def node_identities(node: str, worker_nkey: str, inference_nkey: str,
                    bucket: str = subjects.KV_OBJECTIVES) -> list[tuple[str, str, Permissions]]:
    """(name, public key, permissions) of a joined node's worker and inference identities: the same
    permissions as a node of `dqoes up`, keyed by what the node sent (its seeds never leave it)."""
    out = []
    for role, key in (("worker", worker_nkey), ("inference", inference_nkey)):
        name = identity_name(role, node)
        out.append((name, key, _rules(role, node, bucket, inbox_prefix(name))))
    return out


def _users_config(users: Iterable[tuple[str, str, Permissions]], join_secret: str | None) -> str:
    lines = ["# Generated by DQoES (shared/auth.py, control plane): public keys only.", "authorization {",
             "  users = ["]
    for name, key, p in users:
        sub = f"{{allow: {_list(p.subscribe)}}}" if p.subscribe else f"{{deny: {_list(['>'])}}}"
        lines.append(f"    # {name}")
        lines.append(f"    {{nkey: {_q(key)}, permissions: {{publish: {{allow: {_list(p.publish)}}}, "
                     f"subscribe: {sub}}}}}")
    if join_secret is not None:
        j = join_permissions()
        lines.append(f"    # {JOIN_USER}: every anonymous connection (no_auth_user); nobody knows its password")
        lines.append(f"    {{user: {_q(JOIN_USER)}, password: {_q(join_secret)}, permissions: "
                     f"{{publish: {{allow: {_list(j.publish)}}}, subscribe: {{allow: {_list(j.subscribe)}}}}}}}")
    lines += ["  ]", "}"]
    if join_secret is not None:
        lines.append(f"no_auth_user: {_q(JOIN_USER)}")
    return "\n".join(lines) + "\n"


def control_plane_config(directory: str | os.PathLike[str], joined: Iterable[tuple[str, str, str]] = (),
                         *, accept_joins: bool = True, bucket: str = subjects.KV_OBJECTIVES) -> Path:
    """The server config of a control plane: its own identities (credentials made here, as `ensure`),
    the registrar, every joined node's (node, worker public key, inference public key) and, when
    `accept_joins`, the anonymous `join` user. Returns the config path; reload the server after."""
    ensure(directory, bucket=bucket, extra=[registrar_identity()])
    d = Path(directory)
    local = identities(nodes_of(d), bucket) + [registrar_identity()]
    users = [(i.name, load(creds_path(d, i.name)).nkey, i.permissions) for i in local]
    taken = {i.name for i in local}
    for node, worker_key, inference_key in joined:
        for entry in node_identities(node, worker_key, inference_key, bucket):
            if entry[0] in taken:
                raise AuthError(f"joined node {node}: identity {entry[0]} exists on the control plane already")
            users.append(entry)
    _write_private(config_path(d), _users_config(users, _join_password(d) if accept_joins else None))
    return config_path(d)


def _join_password(d: Path) -> str:
    """The `join` user's password: random, known to nobody, the same on every regeneration (a reload that
    changed it would drop the anonymous connections waiting for their join's answer)."""
    path = d / "join.password"
    try:
        text = authfiles.read_private(path).strip() if path.exists() else ""
    except OSError:
        text = ""
    if not text:
        import secrets

        text = secrets.token_urlsafe(24)
        _write_private(path, text + "\n")
    return text


def ensure_node_keys(directory: str | os.PathLike[str], node: str) -> tuple[Credentials, Credentials]:
    """A joining node's worker and inference credentials, made here (kept if present): only their
    public keys leave the host."""
    try:
        d = authfiles.secure_dir(directory)
    except authfiles.UnsafePathError as e:
        raise AuthError(str(e)) from None
    out = []
    for role in PER_NODE:
        name = identity_name(role, node)
        path = creds_path(d, name)
        try:
            c = load(path) if path.exists() else None
        except AuthError:
            c = None
        if c is None or c.identity != name:
            c = Credentials.generate(name)
            _write_private(path, c.to_json())
            c = load(path)
        out.append(c)
    return out[0], out[1]


# --- URLs ---------------------------------------------------------------------------------


def server_list(url: str) -> list[str]:
    """The URLs of a comma-separated list (`nats://a:4222,nats://b:4222`), each as given; one
    URL is a list of one. A cluster's clients get every server's URL and reconnect to a
    surviving one (docs/guide/nats-cluster.md)."""
    return [u.strip() for u in url.split(",") if u.strip()] or [url]


def with_credentials(url: str, creds: Credentials | str | os.PathLike[str] | None) -> str:
    """`url` naming a credentials file (`?creds=PATH`; the bus reads it); unchanged for None.
    A comma-separated list gets it on every URL.

    The file's path travels, never the seed: such a URL may be logged or
    passed to a child process."""
    if creds is None:
        return url
    path = creds.path if isinstance(creds, Credentials) else Path(creds)
    if path is None:
        raise AuthError(f"credentials of {getattr(creds, 'identity', '?')} were not read from a file")
    out = []
    for one in server_list(url):
        server, _ = _split_one(one)
        parts = urlsplit(server)
        params = [(CREDS_QUERY, str(Path(path).resolve()))] + [
            (k, v) for k, v in parse_qsl(parts.query) if k == CA_QUERY]  # the CA stays: it is how to connect
        query = urlencode(params, quote_via=quote, safe="/")
        out.append(urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)))
    return ",".join(out)


def with_tls_ca(url: str, ca_file: str | os.PathLike[str]) -> str:
    """`url` (each of a list) as `tls://` naming `ca_file` (`?ca=PATH`), the CA its server's
    certificate must chain to; its credentials file, if it names one, kept."""
    out = []
    for one in server_list(url):
        parts = urlsplit(one)
        params = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != CA_QUERY]
        query = urlencode([*params, (CA_QUERY, str(Path(ca_file).resolve()))], quote_via=quote, safe="/")
        out.append(urlunsplit(("tls", parts.netloc, parts.path, query, parts.fragment)))
    return ",".join(out)


def without_tls_ca(url: str) -> str:
    """`url` (each of a list) without the CA file it names."""
    out = []
    for one in server_list(url):
        parts = urlsplit(one)
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != CA_QUERY],
                          quote_via=quote, safe="/")
        out.append(urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)))
    return ",".join(out)


def tls_ca_of(url: str) -> str | None:
    """The CA file a URL (or each URL of a list) names, None if none; AuthError if they differ."""
    named = {v for one in server_list(url) for k, v in parse_qsl(urlsplit(one).query) if k == CA_QUERY}
    if len(named) > 1:
        raise AuthError("the URLs of one connection name different CA files")
    return next(iter(named), None)


def _quiet_tls_eof() -> None:
    """Drop asyncio's warning "returning true from eof_received() has no effect when using ssl": a
    NATS connection upgraded to TLS logs it at every close (nats-py's stream protocol), which says
    nothing about the connection."""
    logger = logging.getLogger("asyncio")
    if not any(isinstance(f, _TlsEofFilter) for f in logger.filters):
        logger.addFilter(_TlsEofFilter())


class _TlsEofFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


def tls_context(url: str) -> ssl.SSLContext | None:
    """The TLS context for a URL that names a CA file: the server's certificate must chain to that
    CA and name the host; None without one (a `tls://` URL then trusts the system's CAs).
    AuthError (one line) for a CA file that cannot be read."""
    ca = tls_ca_of(url)
    if ca is None:
        return None
    _quiet_tls_eof()
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as e:
        raise AuthError(f"CA file {ca}: {getattr(e, 'strerror', None) or e}") from None


def _split_one(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    params = parse_qsl(parts.query, keep_blank_values=True)
    path = next((v for k, v in params if k == CREDS_QUERY), None)
    rest = urlencode([(k, v) for k, v in params if k != CREDS_QUERY])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), path


def split_url(url: str) -> tuple[str, str | None]:
    """(the URL as NATS takes it, the credentials file it names or None).

    For a comma-separated list: the servers, still comma-separated, and the one file they
    name (AuthError if they name different ones: a connection has one identity)."""
    pairs = [_split_one(u) for u in server_list(url)]
    named = {p for _, p in pairs if p is not None}
    if len(named) > 1:
        raise AuthError("the URLs of one connection name different credentials files")
    return ",".join(s for s, _ in pairs), next(iter(named), None)


def creds_of(url: str) -> str | None:
    return split_url(url)[1]


def user_of(url: str) -> str | None:
    parts = urlsplit(server_list(url)[0])
    return unquote(parts.username) if parts.username else None


def redact(url: str) -> str:
    """The URL as logs and records show it: the server only (a password in it, never DQoES's own,
    becomes ***; a credentials or CA file it names is left out: a local path, of no use elsewhere).
    A list stays a comma-separated list."""
    return ",".join(_redact_one(u) for u in server_list(url))


def _redact_one(url: str) -> str:
    try:
        server = without_tls_ca(_split_one(url)[0])  # a local path, as the credentials file
        parts = urlsplit(server)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return server
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{parts.username}:***@{host}", parts.path, parts.query, parts.fragment))


def without_credentials(url: str) -> str:
    """The URL (or comma-separated list) without a user, password or credentials file in it."""
    out = []
    for one in server_list(split_url(url)[0]):
        parts = urlsplit(one)
        out.append(urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, parts.query,
                               parts.fragment)))
    return ",".join(out)


def resolve(url: str, creds_file: str | os.PathLike[str] | None) -> str:
    """The URL to connect with: the credentials file it names, else `creds_file`, else
    $DQOES_NATS_CREDS, else as given (anonymous). The file is read now, so a bad one is
    an AuthError here rather than a refusal later."""
    path = creds_file or os.environ.get(CREDS_ENV) or None
    if path is None or creds_of(url) is not None or user_of(url) is not None:
        return url
    return with_credentials(url, load(path))


# --- the command line: `dqoes auth ...` or, standard library only, `python3 -m shared.auth ...` ---


def describe(directory: str | os.PathLike[str]) -> dict[str, object]:
    """What a credentials directory holds: identities, their files and permissions (no seeds)."""
    d = Path(directory)
    nodes = nodes_of(d)
    out = []
    for i in identities(nodes):
        p = i.permissions
        out.append({"identity": i.name, "role": i.role, "node": i.node,
                    "creds": str(creds_path(d, i.name)), "exists": creds_path(d, i.name).exists(),
                    "inbox_prefix": inbox_prefix(i.name),
                    "publish": list(p.publish), "subscribe": list(p.subscribe)})
    return {"dir": str(d), "config": str(config_path(d)), "nodes": nodes, "identities": out}


def add_arguments(sub: object) -> None:
    """The `auth` sub-commands, on an argparse sub-parsers object."""
    import argparse

    assert isinstance(sub, argparse._SubParsersAction)
    p = sub.add_parser("auth", help="NATS credentials and permissions of a deployment (docs/guide/security.md)",
                       description="Create, list and rotate the per-role NATS credentials of a deployment "
                       "and the nats-server configuration that enforces their permissions.")
    add_actions(p)


def add_actions(p: object) -> None:
    import argparse

    assert isinstance(p, argparse.ArgumentParser)
    a = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, helptext in (
        ("init", "create what is missing: credentials for every role and node, the server config"),
        ("add-node", "add identities for NODE(s) (then reload the server: nats-server --signal reload)"),
        ("rotate", "new keys for every identity (then reload the server and restart every service)"),
        ("show", "list identities, their credentials files and permissions (never seeds)"),
    ):
        q = a.add_parser(name, help=helptext, description=helptext)
        q.add_argument("--dir", required=True, help="the credentials directory (dqoes up: <data dir>/auth)")
        if name in ("init", "add-node"):
            q.add_argument("--node", action="append", default=[], metavar="NODE",
                           help="a node name (repeatable)" + ("; at least one" if name == "add-node" else ""))
        q.add_argument("--json", action="store_true", help="print the directory's description as JSON")
        q.set_defaults(auth_action=name)


def run_command(args: Any) -> int:
    """Run a parsed `auth` sub-command; AuthError (or ValueError) on bad input."""
    action = args.auth_action
    directory = args.dir
    nodes = list(getattr(args, "node", []) or [])
    if action == "add-node" and not nodes:
        raise AuthError("add-node: give at least one --node NAME")
    if action in ("init", "add-node"):
        ensure(directory, nodes)
    elif action == "rotate":
        if not config_path(directory).exists():
            raise AuthError(f"{directory}: no credentials here to rotate (run `auth init` first)")
        ensure(directory, rotate=True)
    elif not config_path(directory).exists():
        raise AuthError(f"{directory}: no credentials here (run `auth init` first)")
    info = describe(directory)
    if getattr(args, "json", False):
        print(json.dumps(info))
        return 0
    print(f"credentials in {info['dir']} (server config: {info['config']}); nodes: "
          f"{', '.join(info['nodes']) or 'none'}")  # type: ignore[arg-type]
    for i in info["identities"]:  # type: ignore[attr-defined]
        print(f"  {i['identity']:<24} publishes {', '.join(i['publish'][:4])}{' ...' if len(i['publish']) > 4 else ''}")
    if action in ("add-node", "rotate"):
        print("now reload the server (nats-server --signal reload, or SIGHUP)"
              + ("; then restart every service with its new file" if action == "rotate" else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python3 -m shared.auth", description="DQoES NATS credentials")
    add_actions(ap)
    args = ap.parse_args(argv)
    try:
        return run_command(args)
    except (AuthError, ValueError) as e:
        print(f"auth: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
