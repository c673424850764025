"""`dqoes up`: run a whole deployment on this machine (talking to one is `services.cli.operate`).

`dqoes up` starts a private nats-server (JetStream; or three clustered ones,
`--nats-servers 3`, docs/guide/nats-cluster.md), the manager and one
worker per node of a scenario, and the web dashboard following them
(`dashboard.launch`; --no-dashboard leaves it out), prints how to reach them
and stops everything cleanly on Ctrl-C. It records where its NATS server
is, so `dqoes status`, `target` and `control` find it without --nats.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dashboard import launch
from dashboard.config import DEFAULT_RUNS_DIR
from services.cli import deployments
from services.cli.common import (
    CliError,
    connect,
    emit_json,
    set_on_signals,
    signals_as_flag,
    state_dir,
)
from services.cli.stack import Stack, StackSpec
from shared import auth, authfiles, subjects
from shared.aio import wait_event
from shared.core import registry
from shared.core.measures import plateau
from shared.scenarios.builtin import load
from shared.schema import NodeState

# -- observing a running stack -------------------------------------------------------


@dataclass
class Observed:
    """What one stack's node states said over time (scenario seconds)."""

    stack: Stack
    series: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    met_series: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    cpu_series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    latest: dict[str, NodeState] = field(default_factory=dict)

    def on_state(self, ns: NodeState) -> None:
        self.latest[ns.node] = ns
        t = self.stack.scenario_time_s(ns.at)
        self.series.setdefault(ns.node, []).append((t, ns.satisfied))
        if ns.met is not None:
            self.met_series.setdefault(ns.node, []).append((t, ns.met))
        if ns.cpu_cores_used is not None:
            self.cpu_series.setdefault(ns.node, []).append((t, ns.cpu_cores_used))

    def satisfied_now(self) -> int:
        return sum(s.satisfied for s in self.latest.values())

    def met_now(self) -> int:
        return sum(s.met or 0 for s in self.latest.values())

    def cpu_now(self) -> float:
        return sum(s.cpu_cores_used or 0.0 for s in self.latest.values())

    def summary(self, end_s: float, window_s: float = 120.0) -> dict[str, Any]:
        """The simulator's measures over the final window, per node and in total.

        met and in band: plateau (lower median) of each count; CPU spent: the
        mean of the cores the managed containers used, and what was left idle.
        """
        start = max(0.0, end_s - min(window_s, end_s / 10))
        nodes = self.stack.spec.scenario.nodes
        per_node = {n.name: plateau(sorted(self.series.get(n.name, [])), start, end_s) for n in nodes}
        met = {n.name: plateau(sorted(self.met_series.get(n.name, [])), start, end_s) for n in nodes}
        cpu = 0.0
        for n in nodes:
            window = [c for t, c in self.cpu_series.get(n.name, []) if start <= t <= end_s]
            cpu += sum(window) / len(window) if window else 0.0
        cores = sum(n.cores for n in nodes)
        return {"met_final": sum(met.values()), "met_per_node": met,
                "satisfied_final": sum(per_node.values()), "satisfied_per_node": per_node,
                "cpu_cores_final": round(cpu, 3), "cpu_cores_idle": round(max(0.0, cores - cpu), 3),
                "cores_total": cores, "final_window_s": end_s - start}


def _on_state(o: Observed) -> Callable[[NodeState, Any], None]:
    """A state handler bound to one observed stack."""
    return lambda m, _: o.on_state(m)


async def observe(stacks: list[Stack], until_s: float | None, *, quiet: bool, every_s: float = 5.0,
                  stop: asyncio.Event | None = None) -> list[Observed]:
    obs = [Observed(s) for s in stacks]
    buses = []
    for o in obs:
        bus = await connect(o.stack.client_url, "dqoes-up")
        await bus.subscribe(subjects.STATE_ALL, _on_state(o), expect=NodeState)
        buses.append(bus)
    stop = stop or asyncio.Event()
    next_print = 0.0
    try:
        while not stop.is_set():
            t = stacks[0].scenario_time_s()
            for s in stacks:  # restart what died, with a backoff; one line each (docs/guide/operations.md)
                for line in s.supervise():
                    print(f"supervisor: {s.name}: {line}", file=sys.stderr if quiet else sys.stdout, flush=True)
            if until_s is not None and t >= until_s:
                break
            if not quiet and time.monotonic() >= next_print and t >= 0:
                parts = []
                for o in obs:
                    per = "/".join(str(o.latest[n.name].satisfied) if n.name in o.latest else "-"
                                   for n in o.stack.spec.scenario.nodes)
                    parts.append(f"{o.stack.name}: met {o.met_now():>3}, in band {o.satisfied_now():>3} ({per}), "
                                 f"CPU {o.cpu_now():5.1f}")
                print(f"t = {t:7.0f} s   " + "   |   ".join(parts), flush=True)
                next_print = time.monotonic() + every_s
            await wait_event(stop, 0.25)
    finally:
        for b in buses:
            await b.close()
    return obs


# -- commands -------------------------------------------------------------------------


INFERENCE_MODELS = ("resnet50", "vgg16", "mobilenetv2", "nasnetmobile", "inceptionv3", "xception")
"""What `services.inference --model` runs (nasnetmobile is its MobileNetV2 stand-in)."""


def cgroup_up_problem(scenario: Any, *, compare: bool, policy: str, euid: int, has_torch: bool) -> str | None:
    """Why `dqoes up --runtime cgroup` cannot run this, or None."""
    if euid != 0:
        return "--runtime cgroup starts real inference processes in cgroups and needs root (run it with sudo)"
    if not has_torch:
        return "--runtime cgroup runs real torch models: install them with pip install '.[workloads]'"
    if compare:
        return ("--runtime cgroup cannot --compare: the stacks would share this machine's cores; "
                "run one --policy after the other")
    if registry.spec(policy).needs_curves:
        return f"--policy {policy} needs every container's latency curve: only with --runtime sim"
    unknown = sorted({c.model for c in scenario.containers} - set(INFERENCE_MODELS))
    if unknown:
        return f"--runtime cgroup: no real model for {', '.join(unknown)} (have: {', '.join(INFERENCE_MODELS)})"
    return None


def compared_policies(args: argparse.Namespace) -> list[str]:
    """The policies `dqoes up` runs side by side: --compare's list, --twin's pair, else --policy."""
    if args.compare is None:
        return ["dqoes", "default"] if args.twin else [args.policy]
    if args.twin:
        raise CliError("--twin is --compare dqoes,default: give one of them")
    names = [n.strip() for n in args.compare.split(",") if n.strip()]
    unknown = [n for n in names if n not in registry.names()]
    if unknown or not names or len(set(names)) != len(names):
        raise CliError(f"--compare takes distinct policies separated by commas, from {', '.join(registry.names())}; "
                       f"got {args.compare!r}")
    return names


def cmd_up(args: argparse.Namespace) -> int:
    policies = compared_policies(args)
    scenario = load(args.scenario, args.seed)
    if args.nodes is not None:
        scenario = _with_nodes(scenario, args.nodes, args.seed)
    if args.runtime == "cgroup":
        import importlib.util

        problem = cgroup_up_problem(scenario, compare=len(policies) > 1, policy=policies[0], euid=os.geteuid(),
                                    has_torch=importlib.util.find_spec("torch") is not None)
        if problem:
            raise CliError(problem)
        args.time_scale = 1.0  # real processes run in real time
    if args.batch < 1 or (args.resolution is not None and args.resolution < 32):
        raise CliError("--batch must be >= 1 and --resolution >= 32 pixels")
    # A stable data directory: objectives (JetStream) and credentials outlive a `dqoes up`.
    run_root = Path(args.run_dir) if args.run_dir else state_dir() / "up"
    try:  # ours alone: another user's directory is refused, a second `dqoes up` on it too
        run_root = authfiles.secure_dir(run_root)
        deployments.pointers_dir()
        lock = deployments.lock_data_dir(run_root)  # held until this process ends
    except (authfiles.UnsafePathError, deployments.DeploymentError) as e:
        raise CliError(str(e)) from None
    try:
        if args.fresh:
            for p in policies:
                shutil.rmtree(run_root / p / "jetstream", ignore_errors=True)
        try:
            stacks = _stacks(scenario, policies, args, run_root)
        except auth.AuthError as e:
            raise CliError(str(e)) from None
        return _run(stacks, scenario, args, run_root)
    finally:
        os.close(lock)


def _stacks(scenario: Any, policies: list[str], args: argparse.Namespace, run_root: Path) -> list[Stack]:
    return [
        Stack(StackSpec(scenario, policy=p, seed=args.seed, time_scale=args.time_scale, label=p,
                        runtime=args.runtime, workload_batch=args.batch, workload_resolution=args.resolution,
                        metrics=not args.no_metrics, on_stop=args.on_stop, nats_servers=args.nats_servers),
              run_dir=run_root / p, auth_dir=run_root / "auth")
        for p in policies
    ]


def _run(stacks: list[Stack], scenario: Any, args: argparse.Namespace, run_root: Path) -> int:
    policies = [s.spec.policy for s in stacks]
    stopped = False
    board: subprocess.Popen[bytes] | None = None
    # Signals are a flag from before the stacks start: one that came while they were starting
    # still stops every process they started.
    with signals_as_flag() as early:
        try:
            start_at = time.time() + 2.0 + 0.5 * len(stacks) * (len(scenario.nodes) + 1)
            for s in stacks:  # one scenario clock for every stack of a comparison
                s.start(start_at)
            deployments.write_pointer(run_root, _pointer(stacks))
            if not args.json:
                print(f"data directory: {run_root} (objectives, credentials, logs; --fresh forgets objectives)")
                print(f"DQoES up: scenario {scenario.name} ({len(scenario.containers)} containers on "
                      f"{len(scenario.nodes)} node(s)), seed {args.seed}, time x{args.time_scale:g}")
                for s in stacks:
                    print(f"  {s.name:<8} NATS {s.plain_url}   logs and JetStream data: {s.run_dir}")
                    _print_metrics(s)
                u = stacks[0].plain_url
                print(f"  try:  dqoes status --nats {u}   |   dqoes target set {scenario.containers[0].name} 30 --nats {u}")
            if args.json:
                for s in stacks:
                    _print_metrics(s, sys.stderr)
            board = start_dashboard(stacks, args)
            if not args.json:
                print("  Ctrl-C stops everything.", flush=True)
            until = scenario.duration_s if args.duration is None else args.duration
            until = None if args.forever else until
            stop = asyncio.Event()

            async def main() -> list[Observed]:
                set_on_signals(stop, early)  # early: stopped while the stacks were starting
                return await observe(stacks, until, quiet=args.json, stop=stop)

            obs = asyncio.run(main())
            stopped = stop.is_set()
            end = min(stacks[0].scenario_time_s(), until or stacks[0].scenario_time_s())
            result = {"scenario": scenario.name, "seed": args.seed, "time_scale": args.time_scale,
                      "containers": len(scenario.containers), "nodes": len(scenario.nodes),
                      "scenario_time_s": round(end, 1), "interrupted": stopped,
                      "policies": {o.stack.name: o.summary(end) for o in obs},
                      "metrics": {o.stack.name: o.stack.metrics_urls for o in obs}}
            res = result["policies"]
            for p in [p for p in policies if p != "default" and "default" in res]:
                d, b = res[p]["satisfied_final"], res["default"]["satisfied_final"]
                result[f"ratio_{p}_to_default"] = None if b == 0 else round(d / b, 2)
                d, b = res[p]["met_final"], res["default"]["met_final"]
                result[f"met_ratio_{p}_to_default"] = None if b == 0 else round(d / b, 2)
            if args.json:
                emit_json(result)
            else:
                print(f"final (plateau of the last {obs[0].summary(end)['final_window_s']:.0f} s of scenario time):")
                for name, r in result["policies"].items():
                    per = "  ".join(f"{k}: {v}" for k, v in r["satisfied_per_node"].items())
                    print(f"  {name:<8} met {r['met_final']:>3}   in band {r['satisfied_final']:>3} ({per})   "
                          f"CPU spent {r['cpu_cores_final']:.1f} of {r['cores_total']:g} cores")
                for p in [p for p in policies if p != "default" and "default" in res]:
                    print(f"  {'DQoES' if p == 'dqoes' else p} / default Swarm: " + ", ".join(
                        f"{what} {_ratio(res[p][key], res['default'][key])}"
                        for what, key in (("met", "met_final"), ("in band", "satisfied_final"))))
                if board is not None and not args.forever:
                    print("  the dashboard stops with this run: add --forever to keep the run and the "
                          "dashboard up until Ctrl-C", flush=True)
            return 0
        finally:
            if board is not None:
                launch.stop(board)
            for s in stacks:
                s.stop()
            deployments.remove_pointer()


def _ratio(a: int, b: int) -> str:
    """a / b as people read it; a denominator of 0 or 1 says so."""
    if b == 0:
        return f"no ratio ({a} vs 0)"
    return f"{a / b:.2f}x" + (f" ({a} vs 1)" if b == 1 else "")


def _print_metrics(s: Stack, out: Any = None) -> None:
    if s.metrics_urls:
        print(f"  {'':<8} metrics: " + "  ".join(f"{k} {u}" for k, u in s.metrics_urls.items()),
              file=out or sys.stdout, flush=True)


def start_dashboard(stacks: list[Stack], args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    """The dashboard following `stacks` (labelled by policy); prints `  dashboard: URL`.

    With --json the line goes to stderr, so stdout's last line stays the
    summary. A dashboard that cannot start is a warning, not a failed run.
    """
    if args.no_dashboard:
        return None
    out = sys.stderr if args.json else sys.stdout
    try:
        proc, url = launch.start([(s.name, s.plain_url) for s in stacks], port=args.dashboard_port,
                                 creds=str(stacks[0].creds_file("client")) if stacks[0].auth_dir else None,
                                 runs_dir=args.runs or DEFAULT_RUNS_DIR,
                                 log_path=str(stacks[0].run_dir / "dashboard.log"))
    except launch.LaunchError as e:
        print(f"  dashboard: not started: {e}", file=out, flush=True)
        return None
    print(f"  dashboard: {url}", file=out, flush=True)
    return proc


def _with_nodes(scenario: Any, nodes: int, seed: int) -> Any:
    from shared.scenarios.builtin import cluster

    if nodes < 1:
        raise CliError("--nodes must be at least 1")
    return cluster(nodes, seed)


def _pointer(stacks: list[Stack]) -> list[dict[str, Any]]:
    """What `dqoes status` and the others need to find this deployment (services.cli.deployments)."""
    return [{"name": s.name, "nats_url": s.plain_url, "run_dir": str(s.run_dir),
             "auth_dir": str(s.auth_dir) if s.auth_dir else None} for s in stacks]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="run a whole deployment here (private NATS, manager, workers)",
                       description="Start a private nats-server with JetStream, the manager and one worker per "
                       "node of a scenario (simulated containers publishing over real NATS). Ctrl-C stops all.")
    p.add_argument("--scenario", default="paper-cluster-40", help="built-in name or file (default: paper-cluster-40)")
    p.add_argument("--nodes", type=int, help="instead: a random cluster of N nodes, 10 containers each")
    p.add_argument("--policy", choices=registry.names(), default="learned",
                   help="allocation policy (default learned; dqoes: the paper's algorithm): "
                   + "; ".join(f"{n}: {registry.spec(n).summary}" for n in registry.names()))
    p.add_argument("--compare", metavar="P1,P2,...",
                   help="several policies side by side, same workload and seed, one deployment each "
                   "(e.g. default,dqoes,learned); ends with each one's met, in band and CPU")
    p.add_argument("--twin", action="store_true", help="the same as --compare dqoes,default")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--time-scale", type=float, default=10.0, help="scenario seconds per wall second (default 10)")
    p.add_argument("--runtime", choices=("sim", "cgroup"), default="sim",
                   help="sim: simulated containers (default); cgroup: real torch inference processes in cgroups "
                   "on this machine (root; pip install '.[workloads]'; real time)")
    p.add_argument("--batch", type=int, default=100, help="--runtime cgroup: images a batch (default 100)")
    p.add_argument("--resolution", type=int, help="--runtime cgroup: image side in pixels (default: the model's)")
    p.add_argument("--duration", type=float, help="stop after this many scenario seconds (default: the scenario's)")
    p.add_argument("--forever", action="store_true", help="keep running until Ctrl-C")
    p.add_argument("--run-dir", "--data-dir", dest="run_dir",
                   help="where JetStream data (objectives), credentials (auth/) and logs go "
                   "(default: $DQOES_STATE_DIR/up, else ~/.local/state/dqoes/up); printed at start")
    p.add_argument("--fresh", action="store_true", help="forget the objectives stored by earlier runs")
    p.add_argument("--on-stop", choices=("keep", "restore"), default="restore",
                   help="on a clean stop, restore the CPU limits the containers had before (kept across worker "
                   "crashes; the default) or keep those in force (docs/guide/operations.md)")
    p.add_argument("--nats-servers", type=int, choices=(1, 3), default=1,
                   help="1: one nats-server (default); 3: a NATS cluster on this machine, each server "
                   "supervised, the objectives in 3 replicas: losing any one server loses nothing "
                   "(docs/guide/nats-cluster.md)")
    p.add_argument("--json", action="store_true", help="no progress lines; last line of stdout: the final summary")
    p.add_argument("--no-dashboard", action="store_true", help="do not start the web dashboard")
    p.add_argument("--no-metrics", action="store_true",
                   help="do not serve Prometheus metrics (default: the manager and every worker serve "
                   "/metrics on a free local port, printed at start; docs/reference/metrics.md)")
    p.add_argument("--dashboard-port", type=int, help="port of the web dashboard (default: a free one)")
    p.add_argument("--runs", metavar="DIR",
                   help=f"folder of timeline files the dashboard lists (default: ./{DEFAULT_RUNS_DIR})")
    p.set_defaults(func=cmd_up)
