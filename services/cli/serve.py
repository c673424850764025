"""`dqoes serve control-plane` and `dqoes serve node`: the roles a host takes, supervised as `dqoes up` is.

Why: `dqoes up` runs a whole deployment on one machine; a real one spans
hosts, each started by its service manager (packaging/systemd/). A host
takes one role, or both:

- control-plane: nats-server (JetStream, authentication, listening where the
  nodes reach it) and the manager, plus the registrar that admits joining
  nodes (services/cli/hosts.py). SIGHUP regenerates the NATS authorization
  from the registry of joined nodes and reloads the server (`dqoes node
  revoke` sends it). With `routes` (and `cluster_listen`) the host is one
  member of a control plane on several hosts: its nats-server joins the
  others' cluster, the join registry is replicated and the manager runs on
  the member holding the lease (services/cli/cpcluster.py). Listening
  beyond loopback it takes clients over TLS only, and its join tokens pin
  its CA (services/cli/cptls.py says why that is the default).
- node: this host's worker, with the credentials it made when it joined
  (`dqoes join`), on any runtime (docker: only the containers with the
  project's label on this host's engine), connected to the control plane's
  NATS URL or list of URLs (one per server of a cluster), over TLS verified
  against the CA its token pinned when the control plane serves TLS.
  Stopping the role (`systemctl stop` or `restart`) keeps the containers' limits by default
  (`on_stop = "keep"`): a restarted worker adopts the limits it finds, so a
  rolling restart for an upgrade changes no limit; `on_stop = "restore"`
  gives the containers back the limits they had before.

The processes are a `Stack` (services/cli/stack.py), so supervision is the
same code as `dqoes up`'s: a child that dies is restarted with a backoff, a
dead nats-server too, every child dies with the supervisor
(PR_SET_PDEATHSIG), the state directory is private and locked while the role
runs. Configuration: hostconfig.py (TOML file < environment < flags).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from services.cli import cpcluster, cptls, deployments, hostconfig, hosts
from services.cli.common import CliError, set_on_signals, signals_as_flag
from services.cli.stack import Stack, StackSpec
from shared import auth, authfiles
from shared.aio import wait_event
from shared.bus import Bus, BusError
from shared.core import registry
from shared.natsd import NatsServerError
from shared.runtime.base import RuntimeFailure
from shared.runtime.factory import default_node
from shared.scenarios.builtin import load
from shared.scenarios.spec import Scenario

SUPERVISE_EVERY_S = 0.25


def _empty(name: str) -> Scenario:
    """A scenario of no containers: a stack that runs only what a role starts."""
    return Scenario(name=name, nodes=(), containers=(), profiles={}, duration_s=0.0)


def _hold(root: Path) -> tuple[Path, int]:
    """The role's directory, private, and its lock (held while the process lives)."""
    try:
        root = authfiles.secure_dir(root)
        deployments.pointers_dir()
        return root, deployments.lock_data_dir(root)
    except (authfiles.UnsafePathError, deployments.DeploymentError) as e:
        raise CliError(str(e)) from None


def _say(line: str) -> None:
    print(line, flush=True)


async def _supervise(stack: Stack, stop: asyncio.Event, extra: Any = None) -> None:
    """Restart what died until `stop`; `extra()` (when given) runs on each round too."""
    while not stop.is_set():
        for line in stack.supervise():
            _say(f"supervisor: {stack.name}: {line}")
        if extra is not None:
            extra()
        await wait_event(stop, SUPERVISE_EVERY_S)


# --- control plane ---------------------------------------------------------------------------


def cmd_control_plane(args: argparse.Namespace) -> int:
    cfg = hostconfig.resolve(args, "control_plane")
    root, lock = _hold(hosts.role_dir(cfg, hosts.CONTROL_PLANE))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a revoke before the loop listens: the loop regenerates first
    clustered = cpcluster.clustered(cfg)
    try:
        stack = Stack(StackSpec(_empty(hosts.CONTROL_PLANE), label=hosts.CONTROL_PLANE,
                                nats_listen=cfg["listen"], nats_port=cfg["port"],
                                bucket_replicas=cpcluster.REPLICAS if clustered else None),
                      run_dir=root, auth_dir=hosts.auth_dir(root))
    except auth.AuthError as e:
        raise CliError(str(e)) from None
    hosts.write_authorization(root, cfg["accept_joins"])
    base = auth.config_path(hosts.auth_dir(root))
    if clustered:  # one member of several (services/cli/cpcluster.py)
        base = cpcluster.write_member_config(root, cfg)
        stack.spec.nats_config = str(base)
    tls = cptls.setup(root, cfg)
    if tls is not None:  # clients over TLS only, the CA pinned by join tokens (services/cli/cptls.py)
        stack.spec.nats_config = str(cptls.write_config(root, base, tls))
        stack.spec.client_tls_ca = str(tls.ca)
    with signals_as_flag() as early:
        try:
            try:
                stack.start_nats()
            except (OSError, NatsServerError) as e:
                raise CliError(f"control plane: NATS cannot listen on {cfg['listen']}:{cfg['port']}: {e}") from None
            if not clustered:
                stack.start_manager()  # a member of several starts it when it holds the lease
            assert stack.front is not None
            host = socket.gethostname() if cfg["listen"] in ("0.0.0.0", "") else cfg["listen"]
            advertise = cfg["advertise"] or f"{'tls' if tls else 'nats'}://{host}:{stack.front.port}"
            deployments.write_pointer(root, [{"name": hosts.CONTROL_PLANE, "nats_url": stack.plain_url,
                                              "run_dir": str(root), "auth_dir": str(stack.auth_dir)}])
            cpcluster.write_cluster_file(root, stack.plain_url if clustered else None)
            _say(f"control plane: NATS {stack.plain_url} (nodes join {advertise}), state {root}")
            if tls is not None:
                _say(f"  clients over TLS only; CA {tls.ca} (SHA-256 {tls.digest}), pinned by the join tokens")
            elif cfg["tls"] is False and cptls.enabled({**cfg, "tls": None}):
                _say("  TLS is off (tls = false): NATS traffic to and from other hosts travels in clear")
            if clustered:
                _say(f"  member {cpcluster.server_name(cfg)} of a NATS cluster: routes on {cfg['cluster_listen']} "
                     f"to {cfg['routes']}")
            if cfg["accept_joins"]:
                _say(f"  join a node: on this host `dqoes join-token create`, on the node "
                     f"`dqoes join {advertise} --token TOKEN`")
            asyncio.run(_control_plane_loop(stack, root, cfg, early, advertise if clustered else None))
            return 0
        finally:
            stack.stop()
            deployments.remove_pointer()
            os.close(lock)


async def _control_plane_loop(stack: Stack, root: Path, cfg: dict[str, Any], early: dict[str, bool],
                              advertise: str | None) -> None:
    """Answer joins, regenerate the authorization on SIGHUP; a member of several (`advertise` given)
    also mirrors the replicated registry and runs the manager while it holds the lease."""
    stop = set_on_signals(asyncio.Event(), early)
    reload_due = asyncio.Event()

    def regenerate() -> None:
        """Write the authorization from the registry and have the server re-read it."""
        hosts.write_authorization(root, cfg["accept_joins"])
        if stack.nats is not None and stack.nats.running:
            stack.nats.reload()

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload_due.set)
    regenerate()  # anything revoked while the role was starting
    log: list[str] = []
    member = None
    if advertise is not None:
        member = cpcluster.Member(root, cpcluster.server_name(cfg), advertise, regenerate, log)
    registrar = hosts.Registrar(root, regenerate, member)
    bus: Bus | None = None
    lead: asyncio.Task[None] | None = None
    try:
        bus = await Bus.connect(stack.url_for(auth.REGISTRAR), "dqoes-registrar", connect_timeout_s=10.0,
                                reconnect_wait_s=0.5)
        if member is None:
            await registrar.start(bus)
            _say("control plane: ready (the registrar answers join requests)" if cfg["accept_joins"]
                 else "control plane: ready (joins off)")
        else:
            lead = asyncio.get_running_loop().create_task(_member(member, registrar, bus, stack, stop,
                                                                     cfg["accept_joins"]))
    except BusError as e:
        _say(f"control plane: the registrar could not connect ({e}); joins are not answered")

    def each_round() -> None:
        while registrar.log:
            _say(f"registrar: {registrar.log.pop(0)}")
        while log:
            _say(f"member: {log.pop(0)}")
        if reload_due.is_set():
            reload_due.clear()
            try:
                regenerate()
                _say("control plane: authorization regenerated from the registry; nats-server reloaded")
            except CliError as e:
                _say(f"control plane: authorization not regenerated: {e}")

    try:
        await _supervise(stack, stop, each_round)
    finally:
        if lead is not None:
            lead.cancel()
        if bus is not None:
            await bus.close()


async def _member(member: cpcluster.Member, registrar: hosts.Registrar, bus: Bus, stack: Stack,
                  stop: asyncio.Event, registrar_answers: bool) -> None:
    """Join the replicated buckets (again until the cluster has the quorum to make them), answer joins,
    then run the manager on this member while it holds the lease (services/cli/cpcluster.py)."""
    while not stop.is_set():
        try:
            await member.start(bus)
            break
        except (BusError, CliError) as e:
            _say(f"member {member.name}: the replicated buckets are not reachable yet ({e}); trying again")
            await wait_event(stop, cpcluster.RENEW_EVERY_S)
    if stop.is_set():
        return
    await registrar.start(bus)
    joins = "the registrar answers join requests" if registrar_answers else "joins off"
    _say(f"control plane: ready (member {member.name} of a NATS cluster; {joins})")
    while not stop.is_set():
        held = await member.hold_lease()
        try:
            await member.resync()
        except BusError as e:
            _say(f"member {member.name}: the join registry cannot be read now ({e})")
        if held and "manager" not in stack.procs:
            stack.start_manager()
            _say(f"member {member.name}: holds the manager lease; manager started")
        elif not held and "manager" in stack.procs:
            stack.stop_process("manager")
            _say(f"member {member.name}: lost the manager lease; manager stopped")
        await wait_event(stop, cpcluster.RENEW_EVERY_S)


# --- node --------------------------------------------------------------------------------------


def cmd_node(args: argparse.Namespace) -> int:
    cfg = hostconfig.resolve(args, "node")
    root, lock = _hold(hosts.role_dir(cfg, hosts.NODE))
    try:
        record = hosts.read_record(root)
        token = (cfg["join_token"] or _token_from_file(cfg["join_token_file"])) if record is None else None
        if record is None and token:
            if not cfg["control_plane"]:
                raise CliError("node: a join token needs the control plane's URL (node.control_plane, "
                               "--control-plane)")
            record = hosts.join(root, cfg["control_plane"], token, cfg["name"] or _default_name(cfg))
            _say(f"node {record['node']}: joined {record['control_plane']}")
        elif record is not None:
            _say(f"node {record['node']}: joined {record['control_plane']} before; its keys in {root} are reused")
        if record is None:
            raise CliError("node: this host has not joined a control plane: run `dqoes join URL --token TOKEN` "
                           "or give a join token (node.join_token, --join-token)")
        node = record["node"]
        if cfg["name"] and cfg["name"] != node:
            raise CliError(f"node: this host joined as {node}, not {cfg['name']} (revoke it and join again to rename)")
        url = cfg["control_plane"] or record["control_plane"]
        if record["tls_ca"]:  # the CA its join token pinned: tls:// verified against it alone
            url = auth.with_tls_ca(url, record["tls_ca"])
        if cfg["apps_creds"]:
            _export_inference_creds(root, node, Path(cfg["apps_creds"]))
        stack = _node_stack(root, node, url, cfg)
        with signals_as_flag() as early:
            try:
                stack.spawn(f"worker-{node}", _worker_args(root, node, url, cfg), auth.identity_name("worker", node))
                _say(f"node {node}: worker on the {cfg['runtime']} runtime, control plane {url}, state {root}")

                async def loop() -> None:
                    await _supervise(stack, set_on_signals(asyncio.Event(), early))

                asyncio.run(loop())
                return 0
            finally:
                stack.stop()
    finally:
        os.close(lock)


def _token_from_file(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as e:
        raise CliError(f"node: join token file {path}: {e.strerror or e}") from None


def _default_name(cfg: dict[str, Any]) -> str:
    """The name a node joins as when given none: with the docker runtime the engine's (`docker info`
    Name, a Swarm node's hostname: in a container the hostname is the container's id), else the host's."""
    if cfg["runtime"] != "docker":
        return hosts.default_node_name()
    try:
        return default_node("docker", cfg["docker_url"])
    except RuntimeFailure as e:
        raise CliError(f"node: no node name given and {e}") from None


def _export_inference_creds(root: Path, node: str, target: Path) -> None:
    """This node's inference credentials at `target`, for its application containers to mount."""
    source = auth.creds_path(hosts.auth_dir(root), auth.identity_name("inference", node))
    try:
        authfiles.write_private(target, authfiles.read_private(source))
    except (OSError, authfiles.UnsafePathError) as e:
        raise CliError(f"node: cannot write the inference credentials to {target}: {e}") from None


def _node_stack(root: Path, node: str, url: str, cfg: dict[str, Any]) -> Stack:
    scenario = _empty(node)
    if cfg["runtime"] == "sim":
        if not cfg["scenario"]:
            raise CliError("node: the sim runtime needs a scenario (node.scenario, --scenario)")
        scenario = load(cfg["scenario"], 1)
    stack = Stack(StackSpec(scenario, policy=cfg["policy"], label=node, runtime=cfg["runtime"],
                            time_scale=cfg["time_scale"]), run_dir=root, nats_url=url)
    stack.auth_dir = hosts.auth_dir(root)  # this node's own credentials (made by `dqoes join`), no others
    return stack


def _worker_args(root: Path, node: str, url: str, cfg: dict[str, Any]) -> list[str]:
    if cfg["policy"] not in registry.names():
        raise CliError(f"node: unknown policy {cfg['policy']!r} (policies: {', '.join(registry.names())})")
    args = ["-m", "services.worker", "--nats", url, "--node", node, "--policy", cfg["policy"],
            "--runtime", cfg["runtime"], "--state-dir", str(root), "--on-stop", cfg["on_stop"]]
    if cfg["require_node_label"]:
        args.append("--require-node-label")
    if cfg["runtime"] == "sim":
        args += ["--scenario", cfg["scenario"], "--time-scale", str(cfg["time_scale"]),
                 "--start-at", repr(time.time() + 1.0)]
    if cfg["docker_url"]:
        args += ["--docker-url", cfg["docker_url"]]
    if cfg["cores"] is not None:
        args += ["--cores", str(cfg["cores"])]
    return args


# --- parsers -----------------------------------------------------------------------------------


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run one role of a multi-host deployment here (control-plane, node)",
                       description="Run a role of a deployment that spans hosts, supervised (children restarted, "
                       "gone with this process), configured from a TOML file (docs/guide/install.md).")
    roles = p.add_subparsers(dest="role", required=True, metavar="ROLE")
    cp = roles.add_parser("control-plane", help="NATS (JetStream, authentication), the manager, join answers",
                          description="NATS with JetStream and per-identity permissions, the manager, and the "
                          "registrar admitting nodes that join with a token. SIGHUP reloads the authorization. "
                          "With routes: one member of a control plane on several hosts (one NATS cluster, the "
                          "join registry and objectives replicated, one manager under a lease).")
    hostconfig.add_flags(cp, "control_plane")
    cp.set_defaults(func=cmd_control_plane)
    nd = roles.add_parser("node", help="this host's worker, with the credentials it made when it joined",
                          description="The worker of this host (docker: only containers with the project's label "
                          "on this host's engine), connected to the control plane this host joined.")
    hostconfig.add_flags(nd, "node")
    nd.set_defaults(func=cmd_node)
