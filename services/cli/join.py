"""`dqoes join-token`, `dqoes join` and `dqoes node`: adding a host to a control plane and cutting it off.

Why: a node's credentials must be made on the node and admitted by the
control plane, never copied from it (shared/joining.py has the token and
proof; services/cli/hosts.py the exchange). On the control plane's host:
`dqoes join-token create` prints a token (one use, 24 h by default; `list`,
`revoke`), `dqoes node list` the joined nodes and `dqoes node revoke NAME`
removes a node's identities and has the running control plane reload its
server (its connections are closed, new ones refused). On the node:
`dqoes join URL --token TOKEN`, then `dqoes serve node`. A control plane
serving TLS makes tokens that pin its CA (services/cli/cptls.py); `dqoes join`
then checks the CA the server shows before it writes or sends anything. On a member of a
control plane spread over hosts the same commands change the replicated
registry through the member running here, and every member applies the
change (services/cli/cpcluster.py).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from services.cli import cpcluster, cptls, hostconfig, hosts
from services.cli.common import CliError, emit_json
from shared import authfiles, joining


def _parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `24h`, `7d` as seconds; CliError otherwise."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise CliError(f"--ttl: expected a duration such as 30m, 24h or 7d, got {text!r}") from None
    if value <= 0:
        raise CliError("--ttl must be > 0")
    return value


def _control_plane_root(args: argparse.Namespace) -> Any:
    cfg = hostconfig.resolve(args, "control_plane")
    root = hosts.role_dir(cfg, hosts.CONTROL_PLANE)
    try:
        return authfiles.secure_dir(root)
    except authfiles.UnsafePathError as e:
        raise CliError(str(e)) from None


def _joining(fn: Any, *a: Any) -> Any:
    try:
        return fn(*a)
    except joining.JoinError as e:
        raise CliError(str(e)) from None


def _registry_op(root: Any, on_files: Any, on_registry: Any, *a: Any) -> Any:
    """`on_files(join_dir, *a)` on a single control plane; `on_registry(registry, *a)` on the
    replicated registry when this control plane is a member of several."""
    if cpcluster.cluster_url(root) is not None:
        return cpcluster.on_member(root, lambda reg: on_registry(reg, *a))
    return _joining(on_files, hosts.join_dir(root), *a)


def cmd_token(args: argparse.Namespace) -> int:
    root = _control_plane_root(args)
    now = time.time()
    if args.token_action == "create":
        ttl_s = _parse_duration(args.ttl)
        if args.uses < 1:
            raise CliError("--uses must be at least 1")
        token_id, token = _registry_op(root, joining.create_token, joining.new_token, now, ttl_s, args.uses)
        digest = cptls.pinned_digest(root)
        if digest is not None:  # the control plane serves TLS: the token pins its CA (services/cli/cptls.py)
            token = _joining(joining.pin_token, token, digest)
        if args.json:
            emit_json({"id": token_id, "token": token, "expires_at": now + ttl_s, "uses": args.uses})
        elif args.quiet:
            print(token)
        else:
            print(f"join token {token_id} ({args.uses} use(s), expires in {args.ttl}); on the node run:")
            print(f"  dqoes join NATS_URL --token {token}")
        return 0
    if args.token_action == "list":
        tokens = _registry_op(root, joining.list_tokens, joining.usable_tokens, now)
        if args.json:
            emit_json({"tokens": tokens})
        else:
            for t in tokens:
                print(f"{t['id']}  uses left {t['uses_left']}  expires in {(t['expires_at'] - now) / 60:.0f} min")
            if not tokens:
                print("no usable join tokens")
        return 0
    _registry_op(root, joining.revoke_token, joining.drop_token, args.id)
    print(f"join token {args.id} revoked")
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    root = _control_plane_root(args)
    if args.node_action == "list":
        nodes = _registry_op(root, joining.joined_nodes, joining.nodes_in)
        if args.json:
            emit_json({"nodes": [{"node": n.node, "joined_at": n.joined_at, "token_id": n.token_id,
                                  "worker_nkey": n.worker_nkey} for n in nodes.values()]})
        else:
            for n in nodes.values():
                print(f"{n.node}  joined {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(n.joined_at))}  "
                      f"worker key {n.worker_nkey[:12]}...")
            if not nodes:
                print("no joined nodes")
        return 0
    node = _registry_op(root, joining.joined_nodes, joining.nodes_in).get(args.name)
    if node is None:
        raise CliError(f"no joined node {args.name!r} (see `dqoes node list`)")
    _registry_op(root, joining.remove_node, joining.drop_node, args.name)
    if cpcluster.cluster_url(root) is not None:
        # Every member's watch of the registry regenerates its own authorization; this one's is checked.
        if not hosts.wait_config_without(root, node.worker_nkey):
            raise CliError(f"node {args.name} removed from the replicated registry, but the member here did "
                           f"not regenerate its authorization; see its log")
        print(f"node {args.name} revoked on every member of the control plane")
        return 0
    pid = hosts.signal_control_plane(root)
    if pid is None:
        print(f"node {args.name} revoked; no control plane runs on {root}: the next start leaves it out")
        return 0
    if not hosts.wait_config_without(root, node.worker_nkey):
        raise CliError(f"node {args.name} removed from the registry, but the control plane (PID {pid}) did not "
                       f"regenerate its authorization; see its log, or restart it")
    print(f"node {args.name} revoked; the control plane (PID {pid}) reloaded its authorization")
    return 0


def cmd_join(args: argparse.Namespace) -> int:
    cfg = hostconfig.resolve(args, "node")
    root = hosts.role_dir(cfg, hosts.NODE)
    urls = hostconfig.nats_urls(args.url, "dqoes join")
    # A token that pins a CA: the server must show that CA before anything is written or sent.
    ca_pem = hosts.pinned_ca(urls, args.token)
    try:
        root = authfiles.secure_dir(root)
    except authfiles.UnsafePathError as e:
        raise CliError(str(e)) from None
    record = hosts.read_record(root)
    name = cfg["name"] or hosts.default_node_name()
    if record is not None and record["node"] != name:
        raise CliError(f"this host joined {record['control_plane']} as {record['node']} already "
                       f"(remove {root / hosts.NODE_RECORD} to join anew)")
    record = hosts.join(root, urls, args.token, name, ca_pem=ca_pem)
    if args.json:
        emit_json({**record, "state_dir": str(root)})
    else:
        print(f"joined {record['control_plane']} as node {record['node']} (credentials in {hosts.auth_dir(root)}, "
              f"made here); start it: dqoes serve node")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("join-token", help="tokens that let a host join this control plane (create, list, revoke)",
                       description="Join tokens of the control plane on this host (its state directory).")
    ta = t.add_subparsers(dest="token_action", required=True, metavar="ACTION")
    c = ta.add_parser("create", help="a new token (printed; give it to the node's `dqoes join`)")
    c.add_argument("--ttl", default="24h", help="lifetime: 30m, 24h, 7d... (default 24h)")
    c.add_argument("--uses", type=int, default=1, help="how many nodes may join with it (default 1)")
    c.add_argument("--quiet", "-q", action="store_true", help="print only the token")
    ls = ta.add_parser("list", help="usable tokens (ids, uses left, expiry; never the secrets)")
    rv = ta.add_parser("revoke", help="make a token unusable")
    rv.add_argument("id", help="the token's id (`list`; the part after DQJ1-)")
    for q in (c, ls, rv):
        hostconfig.add_flags(q, "control_plane", only=("state_dir",))
        q.add_argument("--json", action="store_true", help="one JSON object on stdout")
        q.set_defaults(func=cmd_token)

    n = sub.add_parser("node", help="nodes joined to this control plane (list, revoke)",
                       description="The nodes that joined the control plane on this host.")
    na = n.add_subparsers(dest="node_action", required=True, metavar="ACTION")
    nl = na.add_parser("list", help="joined nodes")
    nr = na.add_parser("revoke", help="remove a node's identities; the running control plane reloads NATS "
                       "(the node's connections are closed, new ones refused)")
    nr.add_argument("name", help="the node's name")
    for q in (nl, nr):
        hostconfig.add_flags(q, "control_plane", only=("state_dir",))
        q.add_argument("--json", action="store_true", help="one JSON object on stdout")
        q.set_defaults(func=cmd_node)

    j = sub.add_parser("join", help="join this host to a control plane as a node (keys made here)",
                       description="Make this node's keys here, send their public halves with the token's proof "
                       "to the control plane, and record it for `dqoes serve node`.")
    j.add_argument("url", help="the control plane's NATS URL (nats://HOST:4222), or its NATS servers' URLs, "
                   "comma-separated (the node keeps the list and reconnects to a surviving server)")
    j.add_argument("--token", required=True, help="from `dqoes join-token create` on the control plane")
    hostconfig.add_flags(j, "node", only=("state_dir", "name"))
    j.add_argument("--json", action="store_true", help="one JSON object on stdout")
    j.set_defaults(func=cmd_join)
