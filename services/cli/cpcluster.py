"""A control plane on several hosts: each member one nats-server of one NATS cluster, one registry.

Why: with a single control-plane host, losing it stops objective changes and
joins. Three hosts each run `dqoes serve control-plane` with `cluster_listen`
and `routes` (the other members): their nats-servers form one cluster
(shared/natscluster.py writes each member's config; the routes authenticate
with the password every member reads from `cluster_secret_file`, inside TLS
with both ends' certificates verified when `cluster_tls_*` are given, so
neither that password nor the replicated registry crosses the network in
clear), JetStream
keeps the objectives bucket in three replicas, and a node given every
member's URL reconnects to a survivor by itself.

What must be the same on every member is kept in a replicated key-value
bucket (`subjects.KV_CONTROL`, R3), written only by the members' registrar
identity:
- `registry`: the join registry (tokens and joined nodes; shared/joining.py's
  pure operations applied with a compare-and-set on the entry's revision, so
  two members admitting at once never lose each other's change). Each member
  watches it, mirrors it into its own join/ files and regenerates its
  server's authorization from them, then reloads its server: a node admitted
  by one member may connect to all, a node revoked on any is cut off by all
  (a reload closes the connections of users it no longer lists). The first
  member to start with an empty bucket seeds it from its files, so a single
  control plane becomes the first member of several without losing a node.
- `member.<name>`: each member's client URL; a join's answer lists them all,
  and the node keeps the list (`dqoes serve node` connects to any of them).

One manager for the whole control plane, not one per member. The manager
keeps the objectives in memory, loaded from the bucket at start and updated
by the requests it answers; two managers would both answer every objective
request (plain subscriptions) and both write it, so each would hand workers
its own revision of the same objective; a queue group instead would give
each request to one of them and leave the others' memories stale. So the
members hold a lease (`subjects.KV_LEADER`, R3, values forgotten after
`LEASE_TTL_S`): the member that creates key `manager` runs the manager and
renews the key every `RENEW_EVERY_S` with a compare-and-set on its revision;
the others try to create it. When the holder's host dies its lease lapses and
another member starts a manager, which loads every objective from the
replicated bucket. A holder that cannot renew for `LEASE_TTL_S` (cut off
from the quorum) stops its manager, so two managers overlap at most that long.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from services.cli import hostconfig, hosts
from services.cli.common import CliError, state_field
from shared import auth, authfiles, joining, natscluster, subjects
from shared.bus import KV, Bus, BusError, KVConflict, KVEntry

REGISTRY_KEY = "registry"
MEMBER_PREFIX = "member."
LEASE_KEY = "manager"
LEASE_TTL_S = 4.0
RENEW_EVERY_S = 1.0
REPLICAS = 3
CLUSTER_FILE = "cluster.json"
"""In the control plane's directory while it is a member of several: its local URL, for `dqoes node
revoke` and `dqoes join-token` to change the replicated registry through it."""
CONFIG_NAME = "nats-member.conf"
CAS_TRIES = 20

T = TypeVar("T")


# --- configuration -----------------------------------------------------------------------------


def clustered(cfg: dict[str, Any]) -> bool:
    return bool(cfg.get("routes"))


def server_name(cfg: dict[str, Any]) -> str:
    if cfg.get("server_name"):
        return subjects.validate_id(cfg["server_name"], "server_name")
    port = cfg["cluster_listen"].rpartition(":")[2]
    return subjects.validate_id(f"{socket.gethostname().split('.')[0] or 'cp'}-{port}", "server_name")


def write_member_config(root: Path, cfg: dict[str, Any]) -> Path:
    """This member's nats-server config (0600: it holds the route password): its name, its cluster
    listen address, routes to the others, the authorization block of `root`'s auth/."""
    if not cfg.get("cluster_listen"):
        raise CliError("control plane: routes need cluster_listen (HOST:PORT the routes listen on)")
    routes = hostconfig.route_list(cfg["routes"], "control_plane.routes")
    tls = route_tls(cfg)
    try:
        secret = natscluster.route_secret(hosts.auth_dir(root), cfg.get("cluster_secret_file"))
        path = root / CONFIG_NAME
        authfiles.write_private(path, natscluster.server_config(
            server_name(cfg), auth_config=auth.config_path(hosts.auth_dir(root)).resolve(),
            config_dir=root.resolve(), secret=secret, listen=cfg["cluster_listen"], advertise=None,
            routes=routes, tls=tls))
        return path
    except (auth.AuthError, authfiles.UnsafePathError) as e:
        raise CliError(f"control plane: {e}") from None


def route_tls(cfg: dict[str, Any]) -> tuple[str, str, str] | None:
    """(certificate, key, CA) of the routes' TLS, absolute paths; None when none is given. CliError
    for some of the three but not all, a file that cannot be read, or a key others may read."""
    keys = ("cluster_tls_cert", "cluster_tls_key", "cluster_tls_ca")
    given = [cfg.get(k) for k in keys]
    if not any(given):
        return None
    if not all(given):
        raise CliError("control plane: route TLS needs all of cluster_tls_cert, cluster_tls_key, cluster_tls_ca")
    paths = [Path(str(g)).resolve() for g in given]
    for key, path in zip(keys, paths, strict=True):
        if not path.is_file():
            raise CliError(f"control plane: {key}: {path} is not a readable file")
    if paths[1].stat().st_mode & 0o077:
        raise CliError(f"control plane: cluster_tls_key: {paths[1]} is readable by others (chmod 600 it)")
    return str(paths[0]), str(paths[1]), str(paths[2])


def write_cluster_file(root: Path, url: str | None) -> None:
    """Record (or, `url` None, remove) that this control plane is a member of several."""
    path = root / CLUSTER_FILE
    if url is None:
        path.unlink(missing_ok=True)
        return
    authfiles.write_private(path, json.dumps({"nats_url": url}) + "\n")


def cluster_url(root: Path) -> str | None:
    """The local member's URL if `root` is a member of several, else None."""
    return state_field(root / CLUSTER_FILE, "nats_url")


# --- the replicated registry ---------------------------------------------------------------------


def _decode(entry: KVEntry | None) -> joining.Registry:
    if entry is None or entry.value is None:
        return joining.empty_registry()
    try:
        return joining.registry_from(json.loads(entry.value))
    except ValueError as e:
        raise joining.JoinError(f"the replicated join registry is unreadable: {e}") from None


async def change_registry(kv: KV, fn: Callable[[joining.Registry], T]) -> T:
    """Apply `fn` (one of shared/joining.py's operations) to the replicated registry with a
    compare-and-set, again on a conflict; `fn`'s result. JoinError from `fn` changes nothing."""
    for _ in range(CAS_TRIES):
        entry = await kv.get_entry(REGISTRY_KEY)
        reg = _decode(entry)
        before = json.dumps(reg, sort_keys=True)
        result = fn(reg)
        after = json.dumps(reg, sort_keys=True)
        if after == before:
            return result
        try:
            if entry is None:
                await kv.create(REGISTRY_KEY, after.encode())
            else:
                await kv.update(REGISTRY_KEY, after.encode(), last=entry.revision)
            return result
        except KVConflict:
            continue
    raise BusError(f"the join registry changed {CAS_TRIES} times while this change was made; try again")


async def read_registry(kv: KV) -> joining.Registry:
    return _decode(await kv.get_entry(REGISTRY_KEY))


async def open_control(bus: Bus) -> KV:
    return await bus.kv(subjects.KV_CONTROL, history=5, replicas=REPLICAS)


class Member:
    """This member's part: the registry mirrored into its files, its URL listed, the manager's lease."""

    def __init__(self, root: Path, name: str, advertise: str, on_change: Callable[[], None],
                 log: list[str]) -> None:
        self.root = root
        self.name = name
        self.advertise = advertise
        self.on_change = on_change
        """Regenerate the authorization from the join/ files and reload the server."""
        self.log = log
        self.control: KV | None = None
        self.lease: KV | None = None
        self._lease_rev: int | None = None
        self._renewed_at = 0.0
        self.mirrored = 0
        """The registry revision last written into the join/ files."""

    async def start(self, bus: Bus) -> None:
        self.control = await open_control(bus)
        self.lease = await bus.kv(subjects.KV_LEADER, history=1, replicas=REPLICAS, ttl_s=LEASE_TTL_S)
        if await self.control.get_entry(REGISTRY_KEY) is None:
            try:
                local = joining.read_registry(hosts.join_dir(self.root))
            except joining.JoinError as e:
                raise CliError(str(e)) from None
            try:
                await self.control.create(REGISTRY_KEY, json.dumps(local, sort_keys=True).encode())
                self.log.append(f"seeded the replicated join registry from this member's files "
                                f"({len(local['nodes'])} node(s))")
            except KVConflict:
                pass  # another member seeded it first
        await self.control.put(MEMBER_PREFIX + self.name, self.advertise.encode())
        watch = await self.control.watch(self._mirror, keys=REGISTRY_KEY)
        await watch.ready.wait()

    def _mirror(self, entry: KVEntry) -> None:
        if entry.revision == self.mirrored:
            return
        self.mirrored = entry.revision
        try:
            joining.write_registry(hosts.join_dir(self.root), _decode(entry))
            self.on_change()
            self.log.append(f"join registry revision {entry.revision} mirrored; authorization regenerated")
        except (joining.JoinError, CliError) as e:
            self.log.append(f"join registry revision {entry.revision} not applied: {e}")

    async def resync(self) -> None:
        """Mirror the registry if the watch missed a revision (a watch does not outlive every loss of
        its server); cheap when nothing changed."""
        assert self.control is not None
        entry = await self.control.get_entry(REGISTRY_KEY)
        if entry is not None and entry.revision != self.mirrored:
            self._mirror(entry)

    async def change(self, fn: Callable[[joining.Registry], T]) -> T:
        assert self.control is not None
        return await change_registry(self.control, fn)

    async def servers(self) -> list[str]:
        """Every member's client URL, this one's first."""
        assert self.control is not None
        urls = [self.advertise]
        for key in await self.control.keys():
            if key.startswith(MEMBER_PREFIX):
                value = await self.control.get(key)
                if value and value.decode() not in urls:
                    urls.append(value.decode())
        return urls

    async def hold_lease(self, now: float | None = None) -> bool:
        """Renew this member's lease on the manager, or take it if free; whether it holds it."""
        assert self.lease is not None
        now = time.monotonic() if now is None else now
        try:
            if self._lease_rev is not None:
                try:
                    self._lease_rev = await self.lease.update(LEASE_KEY, self.name.encode(), last=self._lease_rev)
                except KVConflict:
                    self._lease_rev = None  # it lapsed and another member took it
            else:
                try:
                    self._lease_rev = await self.lease.create(LEASE_KEY, self.name.encode())
                except KVConflict:
                    pass
            if self._lease_rev is not None:
                self._renewed_at = now
        except BusError as e:
            # Not renewed: keep the manager only while the lease may still be ours.
            if self._lease_rev is not None and now - self._renewed_at >= LEASE_TTL_S:
                self._lease_rev = None
                self.log.append(f"manager lease not renewed for {LEASE_TTL_S:g} s ({e})")
        return self._lease_rev is not None


# --- the commands' end (`dqoes join-token`, `dqoes node` on a member) ------------------------------


def on_member(root: Path, fn: Callable[[joining.Registry], T], timeout_s: float = 10.0) -> T:
    """Apply `fn` to the replicated registry through the member running at `root` (as its registrar);
    CliError when none runs there or the cluster cannot be reached."""
    url = cluster_url(root)
    assert url is not None
    creds = auth.creds_path(hosts.auth_dir(root), auth.REGISTRAR)

    async def go() -> T:
        bus = await Bus.connect(url, "dqoes-registry", creds=creds, connect_timeout_s=timeout_s)
        try:
            return await change_registry(await bus.kv(subjects.KV_CONTROL, replicas=REPLICAS, wait_s=timeout_s), fn)
        finally:
            await bus.close()

    try:
        return asyncio.run(go())
    except BusError as e:
        raise CliError(f"this control plane is a member of several and its replicated registry cannot be "
                       f"reached through {url} ({e}): is `dqoes serve control-plane` running here?") from None
    except joining.JoinError as e:
        raise CliError(str(e)) from None
