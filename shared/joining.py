"""Join tokens and the registry of joined nodes: how a host becomes a node of a control plane.

Why: with several hosts, copying a node's credentials from the control plane
by hand moves secrets over whatever channel the operator has, and every
copy is one more place a seed can leak. So a node makes its own keys (its
worker and inference nkeys, shared/auth.py) and only their public halves
leave it; the control plane admits them on the strength of a join token it
issued (`dqoes join-token create`, like `docker swarm join-token`).

A token is `DQJ1-<id>-<secret>`, or `DQJ2-<digest>-<id>-<secret>` when the
control plane serves TLS: `<digest>` is the SHA-256 (hex) of its CA
certificate, which the node checks before it sends anything and then trusts
alone (shared/tlspin.py), as `docker swarm join` does with its token's CA
digest. The secret never travels: the node sends
the token's id, its node name, its two public keys and an HMAC-SHA256 of
those with the secret as key (`proof`). The control plane recomputes it and
compares in constant time (`hmac.compare_digest`). A request read off the
wire cannot be turned into another node's admission (the proof binds the
keys, whose seeds stay on the node); replaying it admits the same keys
again, of no use to whoever lacks their seeds. Tokens expire (`expires_at`),
have a number of uses (one by default) and can be revoked; every refusal is
the same line, whatever the reason, and changes nothing.

Files, in the control plane's `join/` directory (0700, files 0600 through
shared/authfiles.py): `tokens.json` (id -> secret, expiry, uses left) and
`nodes.json` (node -> its public keys): the registry the server's
authorization is generated from (`shared.auth.control_plane_config`). Every
read-modify-write holds an exclusive flock on `join.lock`, so the join
responder and a `dqoes node revoke` never lose each other's change. The
operations themselves (`new_token`, `admit`, `drop_node`...) are pure functions
of a registry dict, so a control plane spread over hosts applies the same ones
to its replicated copy (services/cli/cpcluster.py) and mirrors it into these
files.

Standard library only and no NATS: time is passed in (`now`), the wire
format is JSON bytes (`encode_request`, `decode_request`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shared import authfiles, subjects

TOKEN_PREFIX = "DQJ1"
PINNED_PREFIX = "DQJ2"
"""A token that also pins the control plane's CA by its SHA-256."""
TOKENS_NAME = "tokens.json"
NODES_NAME = "nodes.json"
LOCK_NAME = "join.lock"
DEFAULT_TTL_S = 24 * 3600.0
REFUSED = "join refused: invalid, expired, revoked or used-up join token"
"""The one line every bad token gets, whatever the reason (nothing to learn from it)."""


class JoinError(ValueError):
    """A join that cannot be made, a token or node that does not exist; one line."""


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """What a joining node sends: no secret, only public keys and the proof that it holds the token."""

    token_id: str
    node: str
    worker_nkey: str
    inference_nkey: str
    proof: str


@dataclass(frozen=True, slots=True)
class JoinedNode:
    node: str
    worker_nkey: str
    inference_nkey: str
    joined_at: float
    token_id: str


def _is_digest(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def parse_token(token: str) -> tuple[str, str]:
    """(id, secret) of `DQJ1-<id>-<secret>` or `DQJ2-<digest>-<id>-<secret>`; JoinError for anything else."""
    text = token.strip()
    if text.startswith(PINNED_PREFIX + "-"):
        head, _, rest = text[len(PINNED_PREFIX) + 1:].partition("-")
        text = f"{TOKEN_PREFIX}-{rest}" if _is_digest(head) else ""
    parts = text.split("-", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1].isalnum() or len(parts[2]) < 16:
        raise JoinError(f"not a join token (expected {TOKEN_PREFIX}-<id>-<secret> or {PINNED_PREFIX}-<CA digest>-"
                        "<id>-<secret>, from `dqoes join-token create`)")
    return parts[1], parts[2]


def token_pin(token: str) -> str | None:
    """The CA digest a `DQJ2` token pins, None for a `DQJ1` token; JoinError for a malformed one."""
    parse_token(token)
    text = token.strip()
    return text.split("-", 2)[1] if text.startswith(PINNED_PREFIX + "-") else None


def pin_token(token: str, ca_digest: str) -> str:
    """`DQJ1-<id>-<secret>` as `DQJ2-<ca_digest>-<id>-<secret>`."""
    token_id, secret = parse_token(token)
    if not _is_digest(ca_digest):
        raise JoinError(f"not a SHA-256 digest: {ca_digest!r}")
    return f"{PINNED_PREFIX}-{ca_digest}-{token_id}-{secret}"


def _message(node: str, worker_nkey: str, inference_nkey: str) -> bytes:
    return f"dqoes-join-v1\n{node}\n{worker_nkey}\n{inference_nkey}".encode()


def proof(secret: str, node: str, worker_nkey: str, inference_nkey: str) -> str:
    """HMAC-SHA256 (hex) of the node and its public keys, keyed by the token's secret."""
    return hmac.new(secret.encode(), _message(node, worker_nkey, inference_nkey), hashlib.sha256).hexdigest()


def make_request(token: str, node: str, worker_nkey: str, inference_nkey: str) -> JoinRequest:
    token_id, secret = parse_token(token)
    subjects.validate_id(node, "node")
    return JoinRequest(token_id, node, worker_nkey, inference_nkey, proof(secret, node, worker_nkey, inference_nkey))


def encode_request(r: JoinRequest) -> bytes:
    return json.dumps(asdict(r)).encode()


def decode_request(data: bytes) -> JoinRequest:
    """The request in `data`; JoinError (one line) for anything malformed."""
    try:
        obj = json.loads(data)
        fields = {k: obj[k] for k in JoinRequest.__dataclass_fields__}
    except (ValueError, TypeError, KeyError):
        raise JoinError("join refused: malformed request") from None
    if not all(isinstance(v, str) and 0 < len(v) <= 256 for v in fields.values()):
        raise JoinError("join refused: malformed request")
    return JoinRequest(**fields)


# --- the registry: pure operations on {"tokens": {...}, "nodes": {...}} ----------------------------
# The same operations serve both storages: the control plane's join/ files (one member) and the
# replicated key-value entry of a control plane on several hosts (services/cli/cpcluster.py), which
# applies them with a compare-and-set on the entry's revision.

Registry = dict[str, dict[str, Any]]


def empty_registry() -> Registry:
    return {"tokens": {}, "nodes": {}}


def registry_from(obj: Any) -> Registry:
    """`obj` (decoded JSON) as a registry; JoinError for anything else."""
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k, {}), dict) for k in ("tokens", "nodes")):
        raise JoinError("join registry: expected {\"tokens\": {...}, \"nodes\": {...}}")
    return {"tokens": dict(obj.get("tokens", {})), "nodes": dict(obj.get("nodes", {}))}


def new_token(reg: Registry, now: float, ttl_s: float = DEFAULT_TTL_S, uses: int = 1) -> tuple[str, str]:
    """Add a new token to `reg` (expired ones dropped): (its id, the whole token to give the node)."""
    if ttl_s <= 0 or uses < 1:
        raise JoinError("a join token needs a lifetime > 0 s and at least one use")
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    reg["tokens"] = {k: v for k, v in reg["tokens"].items() if float(v["expires_at"]) > now}
    reg["tokens"][token_id] = {"secret": secret, "created_at": now, "expires_at": now + ttl_s, "uses_left": uses}
    return token_id, f"{TOKEN_PREFIX}-{token_id}-{secret}"


def usable_tokens(reg: Registry, now: float) -> list[dict[str, Any]]:
    """The usable tokens of `reg` (never their secrets): id, expires_at, uses_left."""
    return [{"id": k, "expires_at": v["expires_at"], "uses_left": v["uses_left"]}
            for k, v in sorted(reg["tokens"].items()) if float(v["expires_at"]) > now and int(v["uses_left"]) > 0]


def drop_token(reg: Registry, token_id: str) -> None:
    if reg["tokens"].pop(token_id, None) is None:
        raise JoinError(f"no join token {token_id!r} (see `dqoes join-token list`)")


def admit(reg: Registry, request: JoinRequest, now: float, reserved: frozenset[str] = frozenset()) -> JoinedNode:
    """Admit the node of `request` into `reg` if its token is good: it enters the nodes and the token
    loses a use. JoinError (one line) otherwise, and `reg` is unchanged. `reserved`: node names taken
    otherwise (the control plane's own identities)."""
    entry = reg["tokens"].get(request.token_id)
    good = entry is not None and float(entry["expires_at"]) > now and int(entry["uses_left"]) > 0
    expected = proof(str(entry["secret"]) if entry else "x" * 43, request.node, request.worker_nkey,
                     request.inference_nkey)
    if not (hmac.compare_digest(expected, request.proof) and good):
        raise JoinError(REFUSED)
    try:
        node = subjects.validate_id(request.node, "node")
    except ValueError as e:
        raise JoinError(f"join refused: {e}") from None
    for key in (request.worker_nkey, request.inference_nkey):
        if not (key.startswith("U") and len(key) == 56 and key.isalnum()):
            raise JoinError("join refused: a public key is not a user nkey")
    known = reg["nodes"].get(node)
    same = known is not None and (known["worker_nkey"], known["inference_nkey"]) == (
        request.worker_nkey, request.inference_nkey)
    if node in reserved or (known is not None and not same):
        raise JoinError(f"join refused: node {node} is already joined (`dqoes node revoke {node}` first)")
    joined = JoinedNode(node, request.worker_nkey, request.inference_nkey, now, request.token_id)
    if not same:
        assert entry is not None
        reg["nodes"][node] = asdict(joined)
        reg["tokens"][request.token_id] = {**entry, "uses_left": int(entry["uses_left"]) - 1}
    return joined


def nodes_in(reg: Registry) -> dict[str, JoinedNode]:
    return {k: JoinedNode(**v) for k, v in sorted(reg["nodes"].items())}


def drop_node(reg: Registry, node: str) -> None:
    if reg["nodes"].pop(node, None) is None:
        raise JoinError(f"no joined node {node!r} (see `dqoes node list`)")


# --- files ----------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """The join directory, created private and checked, under its exclusive lock."""
    try:
        d = authfiles.secure_dir(directory)
    except authfiles.UnsafePathError as e:
        raise JoinError(str(e)) from None
    fd = os.open(d / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield d
    finally:
        os.close(fd)


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        obj = json.loads(authfiles.read_private(path))
    except (OSError, ValueError, authfiles.UnsafePathError) as e:
        raise JoinError(f"{path}: unreadable ({e})") from None
    if not isinstance(obj, dict):
        raise JoinError(f"{path}: expected a JSON object")
    return obj


def _write(path: Path, obj: dict[str, Any]) -> None:
    try:
        authfiles.write_private(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")
    except authfiles.UnsafePathError as e:
        raise JoinError(str(e)) from None


def read_registry(directory: str | os.PathLike[str]) -> Registry:
    """The registry held in the join directory's files."""
    with locked(directory) as d:
        return {"tokens": _read(d / TOKENS_NAME), "nodes": _read(d / NODES_NAME)}


def write_registry(directory: str | os.PathLike[str], reg: Registry) -> None:
    """Replace the files' registry with `reg` (a member of a replicated control plane mirrors it)."""
    with locked(directory) as d:
        _write(d / TOKENS_NAME, reg["tokens"])
        _write(d / NODES_NAME, reg["nodes"])


@contextlib.contextmanager
def _changing(directory: str | os.PathLike[str]) -> Iterator[Registry]:
    """The files' registry, written back if the body returns (not if it raises)."""
    with locked(directory) as d:
        reg = {"tokens": _read(d / TOKENS_NAME), "nodes": _read(d / NODES_NAME)}
        before = {k: json.dumps(v, sort_keys=True) for k, v in reg.items()}
        yield reg
        for key, name in (("tokens", TOKENS_NAME), ("nodes", NODES_NAME)):
            if json.dumps(reg[key], sort_keys=True) != before[key]:
                _write(d / name, reg[key])


def create_token(directory: str | os.PathLike[str], now: float, ttl_s: float = DEFAULT_TTL_S,
                 uses: int = 1) -> tuple[str, str]:
    """A new token: (its id, the whole token to give the node). Expired tokens are dropped meanwhile."""
    with _changing(directory) as reg:
        return new_token(reg, now, ttl_s, uses)


def list_tokens(directory: str | os.PathLike[str], now: float) -> list[dict[str, Any]]:
    """The usable tokens (never their secrets): id, expires_at, uses_left."""
    return usable_tokens(read_registry(directory), now)


def revoke_token(directory: str | os.PathLike[str], token_id: str) -> None:
    with _changing(directory) as reg:
        drop_token(reg, token_id)


def accept(directory: str | os.PathLike[str], request: JoinRequest, now: float,
           reserved: frozenset[str] = frozenset()) -> JoinedNode:
    """`admit` on the files' registry, under their lock."""
    with _changing(directory) as reg:
        return admit(reg, request, now, reserved)


def joined_nodes(directory: str | os.PathLike[str]) -> dict[str, JoinedNode]:
    return nodes_in(read_registry(directory))


def remove_node(directory: str | os.PathLike[str], node: str) -> None:
    with _changing(directory) as reg:
        drop_node(reg, node)
