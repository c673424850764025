"""Join tokens and the registry of joined nodes: how a host becomes a node of a control plane.

Why: with several hosts, copying a node's credentials from the control plane
by hand moves secrets over whatever channel the operator has, and every
copy is one more place a seed can leak. So a node makes its own keys (its
worker and inference nkeys, shared/auth.py) and only their public halves
leave it; the control plane admits them on the strength of a join token it
issued (`dqoes join-token create`, like `docker swarm join-token`).

A token is `DQJ1-<id>-<secret>`. The secret never travels: the node sends
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
responder and a `dqoes node revoke` never lose each other's change.

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


def parse_token(token: str) -> tuple[str, str]:
    """(id, secret) of `DQJ1-<id>-<secret>`; JoinError for anything else."""
    parts = token.strip().split("-", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1].isalnum() or len(parts[2]) < 16:
        raise JoinError(f"not a join token (expected {TOKEN_PREFIX}-<id>-<secret>, from `dqoes join-token create`)")
    return parts[1], parts[2]


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


def create_token(directory: str | os.PathLike[str], now: float, ttl_s: float = DEFAULT_TTL_S,
                 uses: int = 1) -> tuple[str, str]:
    """A new token: (its id, the whole token to give the node). Expired tokens are dropped meanwhile."""
    if ttl_s <= 0 or uses < 1:
        raise JoinError("a join token needs a lifetime > 0 s and at least one use")
    token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    with locked(directory) as d:
        tokens = {k: v for k, v in _read(d / TOKENS_NAME).items() if float(v["expires_at"]) > now}
        tokens[token_id] = {"secret": secret, "created_at": now, "expires_at": now + ttl_s, "uses_left": uses}
        _write(d / TOKENS_NAME, tokens)
    return token_id, f"{TOKEN_PREFIX}-{token_id}-{secret}"


def list_tokens(directory: str | os.PathLike[str], now: float) -> list[dict[str, Any]]:
    """The usable tokens (never their secrets): id, expires_at, uses_left."""
    with locked(directory) as d:
        tokens = _read(d / TOKENS_NAME)
    return [{"id": k, "expires_at": v["expires_at"], "uses_left": v["uses_left"]}
            for k, v in sorted(tokens.items()) if float(v["expires_at"]) > now and int(v["uses_left"]) > 0]


def revoke_token(directory: str | os.PathLike[str], token_id: str) -> None:
    with locked(directory) as d:
        tokens = _read(d / TOKENS_NAME)
        if tokens.pop(token_id, None) is None:
            raise JoinError(f"no join token {token_id!r} (see `dqoes join-token list`)")
        _write(d / TOKENS_NAME, tokens)


def accept(directory: str | os.PathLike[str], request: JoinRequest, now: float,
           reserved: frozenset[str] = frozenset()) -> JoinedNode:
    """Admit the node of `request` if its token is good: it enters the registry and the token loses a
    use. JoinError (one line) otherwise, and nothing changes. `reserved`: node names taken otherwise
    (the control plane's own identities)."""
    with locked(directory) as d:
        tokens = _read(d / TOKENS_NAME)
        entry = tokens.get(request.token_id)
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
        nodes = _read(d / NODES_NAME)
        known = nodes.get(node)
        same = known is not None and (known["worker_nkey"], known["inference_nkey"]) == (
            request.worker_nkey, request.inference_nkey)
        if node in reserved or (known is not None and not same):
            raise JoinError(f"join refused: node {node} is already joined (`dqoes node revoke {node}` first)")
        joined = JoinedNode(node, request.worker_nkey, request.inference_nkey, now, request.token_id)
        if not same:
            nodes[node] = asdict(joined)
            _write(d / NODES_NAME, nodes)
            assert entry is not None
            entry["uses_left"] = int(entry["uses_left"]) - 1
            _write(d / TOKENS_NAME, tokens)
        return joined


def joined_nodes(directory: str | os.PathLike[str]) -> dict[str, JoinedNode]:
    with locked(directory) as d:
        nodes = _read(d / NODES_NAME)
    return {k: JoinedNode(**v) for k, v in sorted(nodes.items())}


def remove_node(directory: str | os.PathLike[str], node: str) -> None:
    with locked(directory) as d:
        nodes = _read(d / NODES_NAME)
        if nodes.pop(node, None) is None:
            raise JoinError(f"no joined node {node!r} (see `dqoes node list`)")
        _write(d / NODES_NAME, nodes)
