"""Who may say what on the bus: identities per role, their NATS permissions, their credentials.

Why: DQoES moves the CPU of production hosts on the strength of what it reads
on NATS. An anonymous client that can publish a node state, a latency event,
an objective hand-over or a control message can steer it (issue 11 lists the
forgeries). So every deployment runs with authentication and per-user
subject permissions, enforced by nats-server itself:

| role               | publishes                                           | subscribes                                   |
|--------------------|-----------------------------------------------------|----------------------------------------------|
| `inference-<node>` | latency and training progress of its node's containers | nothing                                   |
| `worker-<node>`    | its node's decisions, state and training state; latency and progress of its node (the sim and cgroup runtimes publish for their containers); replies | its node's latency, progress, objectives, control and launches |
| `manager`          | objective hand-overs, launches, the cluster summary, the objectives bucket (JetStream API for that bucket only), replies | node and training states, targets, submits, cluster queries |
| `client`           | target requests (set, get, list, clear), submits, cluster queries | cluster summary, node and training states, decisions, latency, progress, replies |
| `admin`            | what a client does, and control messages            | what a client does                           |

A request's reply goes to the requester's `_INBOX.<random>`; responders get
`allow_responses` (they may answer what they were asked, nothing else), so
no role may publish on `_INBOX.>` at will.

Credentials: one user and random password per identity, generated at first
start into a directory (`<data dir>/auth/`, mode 0700, files 0600, never in
the repository): `<identity>.creds` (JSON: user, password) for each, and
`nats-server.conf`, the server's `authorization` block. A client reads its
file (`--creds FILE`, `$DQOES_NATS_CREDS`) and connects with the user and
password in its URL (`with_credentials`); logs show URLs with the password
replaced by `***` (`redact`). Adding a node: `ensure(dir, nodes=[...])`
writes the new identities and the new config (then reload the server);
rotating: `rotate(dir)` (docs/security.md).

Other subjects: a new subject's permissions are one line each in `_rules`
(who publishes, who subscribes, who replies); tests/integration/test_auth.py
checks each role against a real server.

Pure apart from reading and writing files in the given directory: no NATS
here (the bus is the only NATS client).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from shared import subjects

CREDS_ENV = "DQOES_NATS_CREDS"
"""Environment variable naming a credentials file (the `--creds` flag's default)."""

CONFIG_NAME = "nats-server.conf"
NODES_NAME = "nodes.json"
ROLES = ("admin", "manager", "client", "worker", "inference")
"""Roles; `worker` and `inference` identities are per node (`worker-<node>`)."""

PER_NODE = ("worker", "inference")


class AuthError(ValueError):
    """A credentials file or directory that cannot be used; the text says which and why."""


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str

    def to_json(self) -> str:
        return json.dumps({"user": self.user, "password": self.password}) + "\n"


@dataclass(frozen=True, slots=True)
class Permissions:
    """One identity's NATS permissions: subjects it may publish and subscribe to."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False


@dataclass
class Identity:
    name: str
    role: str
    node: str | None
    permissions: Permissions
    credentials: Credentials | None = field(default=None)


def identity_name(role: str, node: str | None = None) -> str:
    """`admin`, `manager`, `client`, or `worker-<node>` / `inference-<node>`."""
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


INBOX = "_INBOX.>"
P = subjects.PREFIX


def _rules(role: str, node: str | None, bucket: str) -> Permissions:
    """The permission table. Add a new subject here: who publishes, who subscribes."""
    client_pub = (subjects.TARGETS, subjects.TARGETS_ALL, subjects.CLUSTER_QUERY, subjects.CLUSTER_CONTAINERS,
                  subjects.SUBMIT)
    client_sub = (subjects.CLUSTER_STATE, subjects.STATE_ALL, subjects.DECISIONS_ALL,
                  subjects.LATENCY_ALL, subjects.TRAINING_ALL, subjects.PROGRESS_ALL, INBOX)
    if role == "admin":
        return Permissions(publish=(*client_pub, subjects.CONTROL_ALL), subscribe=(f"{P}.>", INBOX))
    if role == "client":
        return Permissions(publish=client_pub, subscribe=client_sub)
    if role == "manager":
        return Permissions(
            publish=(subjects.OBJECTIVES_ALL, subjects.CLUSTER_STATE, subjects.LAUNCH_ALL, *bucket_subjects(bucket)),
            subscribe=(subjects.STATE_ALL, subjects.TARGETS, subjects.TARGETS_ALL, subjects.CLUSTER_QUERY,
                       subjects.CLUSTER_CONTAINERS, subjects.CLUSTER_STATE, subjects.SUBMIT, subjects.TRAINING_ALL,
                       INBOX),
            allow_responses=True,
        )
    assert node is not None
    if role == "worker":
        return Permissions(
            publish=(subjects.decisions(node), subjects.state(node), subjects.latency_of_node(node),
                     subjects.training(node), subjects.progress_of_node(node)),
            subscribe=(subjects.latency_of_node(node), subjects.objectives(node), subjects.control(node),
                       subjects.progress_of_node(node), subjects.launch(node), INBOX),
            allow_responses=True,  # it acknowledges control requests (ControlReply)
        )
    if role == "inference":
        # The node's inference containers and training jobs: their own batches and epochs.
        return Permissions(publish=(subjects.latency_of_node(node), subjects.progress_of_node(node)), subscribe=())
    raise AuthError(f"unknown role {role!r}")


def identities(nodes: Iterable[str], bucket: str = subjects.KV_OBJECTIVES) -> list[Identity]:
    """Every identity of a deployment with these nodes, without credentials."""
    out = [Identity(r, r, None, _rules(r, None, bucket)) for r in ("admin", "manager", "client")]
    for node in sorted(set(nodes)):
        for role in PER_NODE:
            out.append(Identity(identity_name(role, node), role, node, _rules(role, node, bucket)))
    return out


# --- the server's configuration ----------------------------------------------------------


def _q(text: str) -> str:
    """A NATS config string: JSON quoting is valid there."""
    return json.dumps(text)


def _list(items: Iterable[str]) -> str:
    return "[" + ", ".join(_q(i) for i in items) + "]"


def server_config(ids: Iterable[Identity]) -> str:
    """The `authorization` block for nats-server (include it or pass it with -c)."""
    lines = ["# Generated by DQoES (shared/auth.py): one user per identity. Do not commit.",
             "authorization {", "  users = ["]
    for i in ids:
        if i.credentials is None:
            raise AuthError(f"identity {i.name} has no credentials")
        p = i.permissions
        sub = f"{{allow: {_list(p.subscribe)}}}" if p.subscribe else f"{{deny: {_list(['>'])}}}"
        resp = ", allow_responses: true" if p.allow_responses else ""
        lines.append(
            f"    {{user: {_q(i.credentials.user)}, password: {_q(i.credentials.password)}, "
            f"permissions: {{publish: {{allow: {_list(p.publish)}}}, subscribe: {sub}{resp}}}}}"
        )
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


# --- credentials on disk ----------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def load(path: str | os.PathLike[str]) -> Credentials:
    """Read a credentials file (JSON with user and password); AuthError naming the file."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except OSError as e:
        raise AuthError(f"credentials file {p}: {e.strerror or e}") from None
    except ValueError:
        raise AuthError(f"credentials file {p}: not JSON") from None
    if not (isinstance(obj, dict) and isinstance(obj.get("user"), str) and isinstance(obj.get("password"), str)
            and obj["user"] and obj["password"]):
        raise AuthError(f"credentials file {p}: expected {{\"user\": ..., \"password\": ...}}")
    return Credentials(obj["user"], obj["password"])


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

    Existing credentials are kept (unless `rotate`); nodes named before are
    kept too, so adding a node never removes another. `extra`: identities
    beyond the roles (the test suite's all-subjects user); not remembered.
    Returns the config path.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, stat.S_IRWXU)
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
        if path.exists() and not rotate:
            i.credentials = load(path)
        else:
            i.credentials = Credentials(i.name, secrets.token_urlsafe(24))
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


# --- URLs ---------------------------------------------------------------------------------


def with_credentials(url: str, creds: Credentials | None) -> str:
    """`url` with the user and password in it (how nats-py takes them); unchanged for None."""
    if creds is None:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"{quote(creds.user, safe='')}:{quote(creds.password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def user_of(url: str) -> str | None:
    parts = urlsplit(url)
    return unquote(parts.username) if parts.username else None


def redact(url: str) -> str:
    """The URL as logs may show it: a password becomes ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{parts.username}:***@{host}", parts.path, parts.query, parts.fragment))


def resolve(url: str, creds_file: str | os.PathLike[str] | None) -> str:
    """The URL to connect with: its own user and password if it has them, else those of
    `creds_file`, else of $DQOES_NATS_CREDS, else as given (anonymous)."""
    path = creds_file or os.environ.get(CREDS_ENV) or None
    if path is None or user_of(url) is not None:
        return url
    return with_credentials(url, load(path))


# --- the command line: `dqoes auth ...` or, standard library only, `python3 -m shared.auth ...` ---


def describe(directory: str | os.PathLike[str]) -> dict[str, object]:
    """What a credentials directory holds: identities, their files and permissions (no passwords)."""
    d = Path(directory)
    nodes = nodes_of(d)
    out = []
    for i in identities(nodes):
        p = i.permissions
        out.append({"identity": i.name, "role": i.role, "node": i.node,
                    "creds": str(creds_path(d, i.name)), "exists": creds_path(d, i.name).exists(),
                    "publish": list(p.publish), "subscribe": list(p.subscribe),
                    "allow_responses": p.allow_responses})
    return {"dir": str(d), "config": str(config_path(d)), "nodes": nodes, "identities": out}


def add_arguments(sub: object) -> None:
    """The `auth` sub-commands, on an argparse sub-parsers object."""
    import argparse

    assert isinstance(sub, argparse._SubParsersAction)
    p = sub.add_parser("auth", help="NATS credentials and permissions of a deployment (docs/security.md)",
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
        ("rotate", "new passwords for every identity (then reload the server and restart every service)"),
        ("show", "list identities, their credentials files and permissions (never passwords)"),
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
