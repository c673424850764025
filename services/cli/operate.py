"""`dqoes status | target | control | watch`: what an operator reads and changes on a running deployment.

Why apart from `live` (which runs a deployment): these commands speak only
the bus contract, so they work the same against `dqoes up`, compose or Swarm,
and a person can check every one of them against docs/reference/api.md with the `nats`
CLI. `status`, `target` and `watch` use the public JSON subjects
(`dqoes.cluster.*`, `dqoes.targets[.get|list|clear]`); `control` is the
operator's request on `dqoes.control.<node>` (msgpack `ControlMsg`, answered
with a `ControlReply` by the worker). The NATS URL comes from --nats, else
$DQOES_NATS_URL, else the running `dqoes up` on this machine (--deployment
when several run), else localhost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import Any

import msgspec
import orjson

from services.cli.common import (
    CliError,
    add_deployment_flag,
    connect,
    emit_json,
    parse_assignments,
    resolve_url,
    set_on_signals,
)
from shared import auth, subjects
from shared.bus import Bus, BusError, NoResponders, RequestTimeout
from shared.core import registry
from shared.public import (
    ClusterState,
    ContainerInfo,
    TargetRequest,
    parse_containers_reply,
    parse_submit,
    parse_target_reply,
)
from shared.schema import ControlMsg, ControlReply, SchemaError, decode_as, encode

REQUEST_TIMEOUT_S = 3.0


async def _request(bus: Bus, subject: str, payload: bytes, what: str = "manager") -> bytes:
    try:
        return await bus.request(subject, payload, timeout_s=REQUEST_TIMEOUT_S)
    except (NoResponders, RequestTimeout):
        raise CliError(f"no {what} answers on {bus.url} ({subject})") from None
    except BusError as e:
        raise CliError(str(e)) from None


async def fetch_cluster(bus: Bus) -> ClusterState:
    data = await _request(bus, subjects.CLUSTER_QUERY, b"")
    try:
        return ClusterState.from_json(data)
    except SchemaError as e:
        raise CliError(f"unreadable cluster state: {e}") from None


async def fetch_containers(bus: Bus, node: str | None = None) -> list[ContainerInfo]:
    body = orjson.dumps({"node": node}) if node else b""
    data = await _request(bus, subjects.CLUSTER_CONTAINERS, body)
    try:
        return parse_containers_reply(data)
    except SchemaError as e:
        raise CliError(str(e)) from None


# -- status ------------------------------------------------------------------------------


def _num(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _yes(x: bool | None) -> str:
    return "-" if x is None else ("yes" if x else "no")


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    s = max(0.0, now - at)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def _n(x: int | None) -> str:
    return "-" if x is None else str(x)


def _cores(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def cluster_lines(cs: ClusterState, node: str | None = None) -> list[str]:
    """The node table: the three numbers (met, in band, CPU used and idle), then classes and Q sums."""
    lines = [f"{'node':<14}{'policy':<9}{'met':>5}{'in band':>9}{'CPU used':>10}{'idle':>7}"
             f"{'G':>4}{'S':>4}{'B':>4}{'pend':>6}{'Q_G (s)':>10}{'Q_B (s)':>10}{'interval':>10}"]
    for name, n in cs.nodes.items():
        if node is None or name == node:
            lines.append(f"{name:<14}{n.policy:<9}{_n(n.met):>5}{n.satisfied:>9}{_cores(n.cpu_cores_used):>10}"
                         f"{_cores(n.cpu_cores_idle):>7}{n.G:>4}{n.S:>4}{n.B:>4}{n.pending:>6}"
                         f"{n.slack_sum_g_s:>10.1f}{n.slack_sum_b_s:>10.1f}{n.interval_s:>9.0f}s")
    if node is None:
        lines.append(f"{'total':<23}{_n(cs.met_total):>5}{cs.satisfied_total:>9}{_cores(cs.cpu_cores_used_total):>10}"
                     f"{_cores(cs.cpu_cores_idle_total):>7}{cs.G:>4}{cs.S:>4}{cs.B:>4}{cs.pending:>6}"
                     f"{cs.slack_sum_g_s:>10.1f}{cs.slack_sum_b_s:>10.1f}   ({cs.containers_total} containers)")
    return lines


CONTAINER_HEADER = ("NODE", "CONTAINER", "MODEL", "OBJECTIVE", "FROM", "ALPHA", "LATENCY", "MET", "IN BAND",
                    "CLASS", "LIMIT", "CPU USED", "THROTTLED", "LAST BATCH")


def objective_text(objective_s: float | None, percentile: float | None, window_s: float | None) -> str:
    """`0.2 s` (per batch) or `p95 0.2 s/30s` (a percentile over a window)."""
    if objective_s is None:
        return "-"
    if percentile is None:
        return f"{objective_s:g} s"
    return f"p{percentile:g} {objective_s:g} s/" + ("source" if window_s is None else f"{window_s:g}s")


def objective_from(r: ContainerInfo) -> str:
    """Where a container's objective comes from: `target` (its own, stored), `service api` (its service's,
    stored), `label` (its dqoes.objective_s label)."""
    if r.objective_source is None:
        return "-"
    if r.objective_source == "label":
        return "label"
    return f"service {r.objective_selector}" if r.objective_selector else "target"


def container_table(rows: list[ContainerInfo], now: float) -> list[str]:
    """Like `docker ps`: one line per container, columns sized to their contents."""
    body = [
        (r.node, r.container, r.model or "-", objective_text(r.objective_s, r.percentile, r.window_s),
         objective_from(r),
         _num(r.alpha, ".2f"), _num(r.latency_s, ".2f") + ("s" if r.latency_s else ""), _yes(r.met),
         _yes(r.in_band), r.cls or ("pending" if r.managed else "unmanaged"),
         _num(r.cpu_limit_cores, ".2f", "none"), _num(r.cpu_used_cores, ".2f"),
         "-" if r.throttled_ratio is None else f"{100 * r.throttled_ratio:.0f}%", _ago(r.last_batch_at, now))
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(CONTAINER_HEADER)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*CONTAINER_HEADER).rstrip()] + [fmt.format(*b).rstrip() for b in body]


def status_json(cs: ClusterState, rows: list[ContainerInfo], node: str | None) -> dict[str, Any]:
    out = orjson.loads(cs.to_json())
    if node is not None:
        out["nodes"] = {k: v for k, v in out["nodes"].items() if k == node}
    out["containers"] = [msgspec.to_builtins(r) for r in rows]
    return out


async def _status_once(bus: Bus, node: str | None) -> tuple[ClusterState, list[ContainerInfo]]:
    cs = await fetch_cluster(bus)
    if node is not None and node not in cs.nodes:
        known = ", ".join(cs.nodes) or "none"
        raise CliError(f"no node {node!r} reports to the manager (nodes: {known})")
    return cs, await fetch_containers(bus, node)


def cmd_status(args: argparse.Namespace) -> int:
    if args.every <= 0:
        raise CliError("--every must be > 0 seconds")

    async def go() -> None:
        bus = await connect(resolve_url(args.nats, args.creds, deployment=args.deployment), "dqoes-status")
        stop = set_on_signals(asyncio.Event())
        shown = 0
        try:
            while True:
                cs, rows = await _status_once(bus, args.node)
                if args.json:
                    emit_json(status_json(cs, rows, args.node))
                else:
                    lines = cluster_lines(cs, args.node) + [""] + container_table(rows, time.time())
                    if args.watch and sys.stdout.isatty():
                        sys.stdout.write("\x1b[H\x1b[2J")  # refresh in place
                    elif args.watch:
                        lines.insert(0, f"-- {time.strftime('%H:%M:%S')}")
                    print("\n".join(lines), flush=True)
                shown += 1
                if not args.watch or (args.count and shown >= args.count):
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.every)
                if stop.is_set():
                    return
        finally:
            await bus.close()

    asyncio.run(go())
    return 0


# -- target set | get | list | clear ---------------------------------------------------------


async def _public_request(args: argparse.Namespace, subject: str, body: bytes) -> dict[str, Any]:
    bus = await connect(resolve_url(args.nats, args.creds, deployment=args.deployment), "dqoes-target")
    try:
        data = await _request(bus, subject, body)
    finally:
        await bus.close()
    try:
        return parse_target_reply(data)
    except SchemaError as e:
        raise CliError(str(e)) from None


def _refused(reply: dict[str, Any], as_json: bool) -> int:
    if as_json:
        emit_json(reply)
    else:
        print(f"refused: {reply['error']}", file=sys.stderr)
    return 1


def _subject(args: argparse.Namespace) -> dict[str, str]:
    """{"container": ...} or {"service": ...}, from CONTAINER or --service (one of them)."""
    if (args.container is None) == (args.service is None):
        raise CliError("give a CONTAINER or --service NAME (a Swarm or compose service, or key=value), one of them")
    return {"service": args.service} if args.service is not None else {"container": args.container}


def cmd_target_set(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {**_subject(args), "objective": args.seconds}
    for key in ("alpha", "percentile", "window_s"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    try:  # the same checks the manager makes, before anything is sent
        TargetRequest.build(container=body.get("container"), service=body.get("service"), objective_s=args.seconds,
                            alpha=args.alpha, percentile=args.percentile, window_s=args.window_s)
    except SchemaError as e:
        raise CliError(str(e)) from None
    reply = asyncio.run(_public_request(args, subjects.TARGETS, orjson.dumps(body)))
    if not reply["ok"]:
        return _refused(reply, args.json)
    if args.json:
        emit_json(reply)
    elif reply.get("service") is not None:
        governed = reply.get("containers") or []
        print(f"objective for service {reply['service']}: "
              f"{objective_text(reply['objective_s'], reply.get('percentile'), reply.get('window_s'))} "
              f"(governs {len(governed)} container(s) now and every replica that joins, "
              f"revision {reply.get('revision')})")
    else:
        where = reply.get("node") or "no node yet"
        state = "running" if reply.get("running") else "expected"
        print(f"objective for {reply['container']}: {reply['objective_s']:g} s a batch "
              f"({state} on {where}, revision {reply.get('revision')})")
    return 0


# -- submit: a training job placed by the manager ------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    body = {k: v for k, v in (("model", args.model), ("name", args.name), ("epochs", args.epochs),
                              ("node", args.node), ("image", args.image), ("threads", args.threads),
                              ("seed", args.seed)) if v is not None}
    data = orjson.dumps(body)
    try:  # the manager's own checks, before anything is sent
        parse_submit(data)
    except SchemaError as e:
        raise CliError(str(e)) from None

    async def go() -> dict[str, Any]:
        bus = await connect(resolve_url(args.nats, args.creds, deployment=args.deployment), "dqoes-submit")
        try:
            reply = await bus.request(subjects.SUBMIT, data, timeout_s=args.timeout)
        except (NoResponders, RequestTimeout):
            raise CliError(f"no manager answers on {subjects.SUBMIT}") from None
        finally:
            await bus.close()
        try:
            return parse_target_reply(reply)
        except SchemaError as e:
            raise CliError(str(e)) from None

    reply = asyncio.run(go())
    if not reply["ok"]:
        return _refused(reply, args.json)
    if args.json:
        emit_json(reply)
    else:
        print(f"training job {reply['job']} ({reply['model']}) started on {reply['node']} "
              f"({reply['policy']} placement: {reply['why']})")
    return 0


TARGET_HEADER = ("FOR", "OBJECTIVE", "ALPHA", "FROM", "WHERE", "REVISION")


def _target_row(t: dict[str, Any]) -> tuple[str, ...]:
    alpha = "default" if t.get("alpha") is None else f"{t['alpha']:g}"
    objective = objective_text(t["objective_s"], t.get("percentile"), t.get("window_s"))
    if t.get("service") is not None:
        governed = t.get("containers") or []
        return (t["service"], objective, alpha, "service", f"{len(governed)} container(s)"
                + (f": {', '.join(governed)}" if governed else ""), str(t["revision"]))
    where = t.get("node") or "no node yet"
    state = "running" if t.get("running") else "not running"
    return (t["container"], objective, alpha, "container", f"{state} on {where}", str(t["revision"]))


def target_table(targets: list[dict[str, Any]]) -> list[str]:
    """Stored objectives, for services and for containers: FROM says which kind each is."""
    body = [_target_row(t) for t in targets]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(TARGET_HEADER)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*TARGET_HEADER).rstrip()] + [fmt.format(*b).rstrip() for b in body]


def _target_line(t: dict[str, Any]) -> str:
    return "  ".join(_target_row(t)[:5]) + f"  (revision {t['revision']})"


def in_force(row: ContainerInfo | None) -> dict[str, Any] | None:
    """The objective a container's worker has in force and where it comes from, or None."""
    if row is None or row.objective_s is None:
        return None
    out = {"node": row.node, "objective_s": row.objective_s, "alpha": row.alpha, "source": row.objective_source}
    # A service's or a percentile objective says so; a container's own per-batch one reads as before.
    extra = {"service": row.objective_selector, "percentile": row.percentile, "window_s": row.window_s}
    return out | {k: v for k, v in extra.items() if v is not None}


SOURCES = {"target": "from the objective store (dqoes target set)",
           "label": "from its dqoes.objective_s label", None: "source not reported"}


def cmd_target_get(args: argparse.Namespace) -> int:
    if args.service is not None:
        return _service_target_get(args)

    async def go() -> tuple[dict[str, Any], ContainerInfo | None]:
        reply = await _public_request(args, subjects.TARGETS_GET, orjson.dumps(_subject(args)))
        bus = await connect(resolve_url(args.nats, args.creds), "dqoes-target")
        try:  # what its worker has in force: the store's objective wins over the container's label
            rows = [r for r in await fetch_containers(bus) if r.container == args.container]
        except CliError:
            rows = []
        finally:
            await bus.close()
        return reply, (rows[0] if rows else None)

    reply, row = asyncio.run(go())
    force = in_force(row)
    if args.json:
        emit_json({**reply, "in_force": force})
        return 0 if reply["ok"] else 1
    if reply["ok"]:
        print(_target_line(reply["target"]))
    else:
        print(f"refused: {reply['error']}", file=sys.stderr)
    if force is not None:
        origin = (f"from the objective stored for service {force['service']}" if force.get("service")
                  else SOURCES.get(force["source"]))
        print(f"in force on {force['node']}: "
              f"{objective_text(force['objective_s'], force.get('percentile'), force.get('window_s'))}, {origin}")
    elif row is not None:
        print(f"in force on {row.node}: no objective (unmanaged)")
    return 0 if reply["ok"] else 1


def _service_target_get(args: argparse.Namespace) -> int:
    reply = asyncio.run(_public_request(args, subjects.TARGETS_GET, orjson.dumps(_subject(args))))
    if not reply["ok"]:
        return _refused(reply, args.json)
    if args.json:
        emit_json(reply)
    else:
        for line in target_table([reply["target"]]):
            print(line)
    return 0


def cmd_target_list(args: argparse.Namespace) -> int:
    reply = asyncio.run(_public_request(args, subjects.TARGETS_LIST, b"{}"))
    if not reply["ok"]:
        return _refused(reply, args.json)
    if args.json:
        emit_json(reply)
    elif not reply["targets"]:
        print("no objectives stored")
    else:
        for line in target_table(reply["targets"]):
            print(line)
    return 0


def cmd_target_clear(args: argparse.Namespace) -> int:
    reply = asyncio.run(_public_request(args, subjects.TARGETS_CLEAR, orjson.dumps(_subject(args))))
    if not reply["ok"]:
        return _refused(reply, args.json)
    if args.json:
        emit_json(reply)
    elif reply.get("service") is not None:
        print(f"objective for service {reply['service']} cleared (was {reply['previous_objective_s']:g} s): "
              "its containers fall back to their own objectives or labels, or become unmanaged")
    else:
        print(f"objective for {reply['container']} cleared (was {reply['previous_objective_s']:g} s): "
              "unmanaged now, its CPU limit released (unless it carries its own dqoes.objective_s label)")
    return 0


# -- control -------------------------------------------------------------------------------


def check_against_registry(policy: str, asked: dict[str, float]) -> None:
    """The worker's own check, made before anything is sent: names and values of `policy`'s params."""
    try:
        registry.spec(policy)
    except ValueError:
        return  # a policy this CLI does not know: the worker checks
    try:
        registry.check_names(policy, asked)
    except ValueError as e:
        raise CliError(str(e)) from None
    try:
        registry.params_for(policy, asked)
    except ValueError as e:
        raise CliError(f"policy {policy}: {e}") from None


def split_policy(items: list[str]) -> tuple[str | None, list[str]]:
    """`policy=NAME` out of the NAME=VALUE list: the registered policy asked for (None: none), the rest."""
    asked = [x.split("=", 1)[1].strip() for x in items if x.split("=", 1)[0].strip() == "policy" and "=" in x]
    if len(asked) > 1:
        raise CliError("policy=NAME given more than once")
    if asked and asked[0] not in registry.names():
        raise CliError(f"unknown policy {asked[0]!r} (choose from {', '.join(registry.names())}); nothing changed")
    return (asked[0] if asked else None), [x for x in items if x.split("=", 1)[0].strip() != "policy"]


async def control_nodes(bus: Bus, nodes: list[str], asked: dict[str, float],
                        policy: str | None = None) -> list[ControlReply]:
    try:
        msg = ControlMsg.build(params=asked, policy=policy)
    except SchemaError as e:  # a name no policy can have (the registry's check passes unknown policies)
        raise CliError(str(e)) from None
    replies = []
    for node in nodes:
        bus_reply = await _request(bus, subjects.control(node), encode(msg, bus.name), f"worker for {node}")
        try:
            replies.append(decode_as(bus_reply, ControlReply))
        except SchemaError as e:
            raise CliError(f"unreadable reply from {node}: {e}") from None
    return replies


def cmd_control(args: argparse.Namespace) -> int:
    policy, rest = split_policy(args.set)
    asked = parse_assignments(rest)

    async def go() -> list[ControlReply]:
        bus = await connect(resolve_url(args.nats, args.creds, identity="admin", deployment=args.deployment), "dqoes-control")
        try:
            cs = await fetch_cluster(bus)
            nodes = list(cs.nodes) if args.node is None else [args.node]
            if args.node is not None and args.node not in cs.nodes:
                raise CliError(f"no node {args.node!r} reports to the manager (nodes: {', '.join(cs.nodes) or 'none'})")
            if not nodes:
                raise CliError("no node reports to the manager yet")
            for n in nodes:  # all checked before any is changed
                check_against_registry(policy or cs.nodes[n].policy, asked)
            return await control_nodes(bus, nodes, asked, policy)
        finally:
            await bus.close()

    replies = asyncio.run(go())
    ok = all(r.ok for r in replies)
    if args.json:
        emit_json({"ok": ok, "nodes": {r.node: {"ok": r.ok, "error": r.error or None, "policy": r.policy,
                                                 "params": r.params, "changed": list(r.changed)}
                                        for r in replies}})
    else:
        for r in replies:
            params = "  ".join(f"{k}={v:g}" for k, v in sorted(r.params.items()))
            head = f"{r.node:<14}{r.policy:<9}"
            if not r.ok:
                print(f"{head}refused: {r.error}", file=sys.stderr)
            print(f"{head}{'set ' + ', '.join(r.changed) + ';  ' if r.changed else ''}{params}")
    return 0 if ok else 1


# -- watch ---------------------------------------------------------------------------------


def cmd_watch(args: argparse.Namespace) -> int:
    async def go() -> None:
        bus = await connect(resolve_url(args.nats, args.creds, deployment=args.deployment), "dqoes-watch")
        stop = set_on_signals(asyncio.Event())
        last = [0.0]
        shown = [0]

        def on_cluster(inc: Any) -> None:
            if inc.reply or not inc.data:
                return
            try:
                cs = ClusterState.from_json(inc.data)
            except SchemaError:
                return
            if time.monotonic() - last[0] < args.every:
                return
            last[0] = time.monotonic()
            shown[0] += 1
            if args.json:
                emit_json(orjson.loads(cs.to_json()))
            else:
                per = "  ".join(f"{k}: {v.satisfied}/{v.containers}" for k, v in cs.nodes.items())
                print(f"{time.strftime('%H:%M:%S')}  met {_n(cs.met_total):>3}  in band {cs.satisfied_total:>3} "
                      f"of {cs.containers_total:<3} CPU {_cores(cs.cpu_cores_used_total)} cores "
                      f"(idle {_cores(cs.cpu_cores_idle_total)})  G {cs.G:<3} S {cs.S:<3} B {cs.B:<3}  {per}", flush=True)
            if args.count and shown[0] >= args.count:
                stop.set()

        await bus.subscribe_raw(subjects.CLUSTER_STATE, on_cluster)
        try:
            if args.count:
                t_end = args.count * max(args.every, 0.5) + 5
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), t_end)
            else:
                await stop.wait()
        finally:
            await bus.close()

    asyncio.run(go())
    return 0


# -- parsers -------------------------------------------------------------------------------


def add_parsers(sub: argparse._SubParsersAction) -> None:
    nats_help = "NATS URL (default: $DQOES_NATS_URL, the running `dqoes up`, localhost)"
    creds_help = (f"credentials file, client role (default: ${auth.CREDS_ENV}, else the running `dqoes up`'s; "
                  "docs/guide/security.md)")
    p = sub.add_parser("status", help="the cluster: one row per node, then one per container",
                       description="The cluster summary (met, in band and CPU per node, G/S/B, Q values, interval) and, "
                       "like `docker ps`, every container: node, model, objective and alpha, latest latency, "
                       "whether it meets its objective and is in band, class, CPU limit and use (cores), "
                       "throttled share of CFS periods, last batch.")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help=creds_help)
    p.add_argument("--node", help="only this node and its containers")
    p.add_argument("--json", action="store_true",
                   help="print the cluster state JSON with a \"containers\" list (one object per refresh)")
    p.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    p.add_argument("--every", type=float, default=2.0, help="--watch: seconds between refreshes (default 2)")
    p.add_argument("--count", type=int, default=0, help="--watch: stop after N refreshes (0: until Ctrl-C)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("submit", help="start a training job where the manager places it (FlowCon's Algorithm 4)",
                       description="Ask the manager (dqoes.submit) to start a training job: it picks the node "
                       "(Algorithm 4 under FlowCon, spread under default, or --node) and the node's worker starts "
                       "it (a process in a cgroup, or a container of --image with Docker). Prints the node.")
    p.add_argument("model", help="vae, cnn, mlp, lstm or gru")
    p.add_argument("--epochs", type=int, help="epochs to run (default: the workload's)")
    p.add_argument("--name", help="the job's name (default: made up by the manager)")
    p.add_argument("--node", help="start it on this node instead of letting the manager choose")
    p.add_argument("--image", help="Docker workers: the image (default dqoes-workload)")
    p.add_argument("--threads", type=int, help="pin the job's intra-op threads")
    p.add_argument("--seed", type=int, help="data and weights seed")
    p.add_argument("--timeout", type=float, default=40.0, help="seconds to wait for the reply (default 40)")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help=creds_help)
    p.add_argument("--json", action="store_true", help="print the reply as one JSON object")
    p.set_defaults(func=cmd_submit)

    t = sub.add_parser("target", help="set, read, list or clear containers' objectives",
                       description="The objective lifecycle over the public subjects dqoes.targets and "
                       "dqoes.targets.get|list|clear (docs/reference/api.md).").add_subparsers(
        dest="action", required=True, metavar="ACTION")
    p = t.add_parser("set", help="set CONTAINER's (or --service NAME's) objective to SECONDS",
                     description="Send {container|service, objective[, alpha, percentile, window_s]} to "
                     "dqoes.targets and print the reply. SECONDS per batch by default; with --percentile, "
                     "that percentile of the latencies over --window-s. A service objective governs every "
                     "container of the service, present and future replicas; a container's own wins over it.")
    p.add_argument("container", nargs="?", help="the container (or give --service)")
    p.add_argument("seconds", type=float)
    p.add_argument("--service", help="a Swarm or compose service name (api), or a label selector (app=api)")
    p.add_argument("--percentile", type=float, help="govern this percentile of the latencies (0 < P < 100)")
    p.add_argument("--window-s", type=float, help="over this window in seconds (> 0; needs --percentile)")
    p.add_argument("--alpha", type=float, help="this container's tolerance band (0 < alpha < 1)")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help=creds_help)
    p.add_argument("--json", action="store_true", help="print the manager's JSON reply")
    p.set_defaults(func=cmd_target_set)

    p = t.add_parser("get", help="CONTAINER's stored objective, and the one in force with where it comes from",
                     description="Request {container} on dqoes.targets.get and print the stored objective, then "
                     "the objective its worker has in force and where that comes from: the store (dqoes target "
                     "set), which wins, or the container's dqoes.objective_s label. With --service: the "
                     "service's stored objective and the containers it governs. Exit status 1 when none is "
                     "stored.")
    p.add_argument("container", nargs="?", help="the container (or give --service)")
    p.add_argument("--service", help="a service name or label selector whose objective to read")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help=creds_help)
    p.add_argument("--json", action="store_true", help="print the manager's JSON reply, with in_force: {node, objective_s, alpha, source} or null")
    p.set_defaults(func=cmd_target_get)

    p = t.add_parser("list", help="every stored objective, for services and containers",
                     description="Request dqoes.targets.list and print one line per stored objective: what it "
                     "is for, the objective (p95 0.2 s/30s for a percentile over a window), FROM (service or "
                     "container) and where it applies.")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help=creds_help)
    p.add_argument("--json", action="store_true", help="print the manager's JSON reply")
    p.set_defaults(func=cmd_target_list)

    p = t.add_parser("clear", help="remove CONTAINER's (or --service NAME's) objective",
                     description="Request {container} (or {service}) on dqoes.targets.clear: the objective is "
                     "deleted from the store, the worker stops controlling the container (or falls back to its "
                     "service's objective or its dqoes.objective_s label) and lifts its CPU limit.")
    p.add_argument("container", nargs="?", help="the container (or give --service)")
    p.add_argument("--service", help="a service name or label selector whose objective to clear")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help=creds_help)
    p.add_argument("--json", action="store_true", help="print the manager's JSON reply")
    p.set_defaults(func=cmd_target_clear)

    p = sub.add_parser("control", help="read or switch the policy and set its parameters, per node or cluster-wide",
                       description="Without NAME=VALUE: print each node's policy and parameters in force. With "
                       "them: set them (any parameter of the node's policy by name: alpha, beta, "
                       "initial_interval_s, max_interval_s, and each policy's own), checked against the policy "
                       "registry before anything is sent, then by the worker, which acknowledges with the "
                       "parameters now in force. policy=NAME switches to another registered policy first (the "
                       "other parameters then apply to it). Every node unless --node.",
                       epilog="examples: dqoes control policy=dqoes;  dqoes control --node worker-1 alpha=0.15 beta=0.2")
    p.add_argument("set", nargs="*", metavar="NAME=VALUE",
                   help="parameters to set, or policy=NAME (none: read)")
    p.add_argument("--node", help="only this node (default: every node reporting to the manager)")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help="credentials file of an admin identity: only an admin may publish control "
                   f"(default: ${auth.CREDS_ENV}, else the running `dqoes up`'s admin.creds; docs/guide/security.md)")
    p.add_argument("--json", action="store_true", help="print every node's reply as one JSON object")
    p.set_defaults(func=cmd_control)

    p = sub.add_parser("watch", help="follow the cluster summary live")
    p.add_argument("--nats", help=nats_help)
    add_deployment_flag(p)
    p.add_argument("--creds", help=creds_help)
    p.add_argument("--every", type=float, default=1.0, help="at most one line per N seconds")
    p.add_argument("--count", type=int, default=0, help="stop after about N lines (0: until Ctrl-C)")
    p.add_argument("--json", action="store_true", help="one cluster state JSON object per line")
    p.set_defaults(func=cmd_watch)
