"""`dqoes experiment real`: DQoES against default Docker on real inference containers, and the simulator's forecast.

Why: the simulator's results mean something only if a real node behaves the
same. This command runs the live system (a private nats-server, the manager,
one worker with the Docker runtime) on this machine's Docker engine with a
handful of real inference containers (image dqoes-workload:latest) carrying
objectives, first under DQoES and then under the default policy (no limits,
CFS fair share) on the same workload. It records the node's state over time
(|S|, limits, latencies) and each container's CPU use from its cgroup, then
simulates the same setup with the calibrated profiles (`dqoes calibrate`)
and writes both side by side (`--update docs/results.md`, `--plot`).

Only containers this command started are touched: they are named
`<prefix>-cNN` with a prefix unique to the run, carry `dqoes.node=<prefix>`,
and the worker runs with `--require-node-label` so it sees nothing else on a
shared engine. Containers are started with the `docker` command, as an
operator would; only the worker's runtime talks to the engine's API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from services.cli import svgplot
from services.cli.experiment import CliError, emit_json, update_section
from shared import subjects
from shared.bus import Bus, BusError
from shared.core.profiles import BUILTIN_PROFILES, ModelProfile
from shared.core.types import Cls
from shared.natsd import NatsServer
from shared.runtime import cgroupfs
from shared.schema import NodeState
from shared.sim.engine import plateau, simulate
from shared.sim.scenario import ContainerSpec, NodeSpec, Scenario, ScenarioError, load_profiles_file

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILES = REPO / "docs" / "calibration" / "profiles.toml"
BEGIN = "<!-- BEGIN generated: dqoes experiment real -->"
END = "<!-- END generated: dqoes experiment real -->"
FACTORS = (0.8, 3.0, 1.6, 5.0, 2.2, 8.0)
"""Objective = fastest-alone latency x factor, cycled over the containers: the first is
unachievable even alone; whether the others fit together on the node is the policies' business."""
ALPHA = 0.10


def busy_cores_s() -> float:
    """CPU-seconds the whole machine has been busy (all processes, /proc/stat), to tell our load from others'."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the plan ----------------------------------------------------------------------------------


def plan_containers(
    count: int, models: Sequence[str], profiles: dict[str, ModelProfile], cores: float,
    objectives: Sequence[float] | None = None,
) -> list[ContainerSpec]:
    """Containers c01.. cycling over `models`, objectives from FACTORS (or given), one thread each."""
    out = []
    for i in range(count):
        m = models[i % len(models)]
        if objectives:
            obj = float(objectives[i % len(objectives)])
        else:
            obj = round(profiles[m].with_threads(1).fastest_s(cores) * FACTORS[i % len(FACTORS)], 2)
        out.append(ContainerSpec(f"c{i + 1:02d}", m, obj, 0.0, threads=1))
    return out


def sim_scenario(specs: Sequence[ContainerSpec], profiles: dict[str, ModelProfile], cores: float,
                 duration_s: float, node: str = "node") -> Scenario:
    return Scenario(
        name="real-node-forecast", nodes=(NodeSpec(node, cores),),
        containers=tuple(ContainerSpec(c.name, c.model, c.objective_s, 0.0, node, threads=1) for c in specs),
        profiles=profiles, duration_s=duration_s,
        description="the real experiment's node and containers, simulated with the calibrated profiles",
    )


def forecast(sc: Scenario, policy: str, seed: int = 1) -> dict[str, Any]:
    """What the simulator predicts: |S| over time, the plateau, final latencies and CPU split."""
    res = simulate(sc, policy, seed)
    cores = sc.nodes[0].cores
    return {
        "policy": policy,
        "satisfied_final": res.satisfied_final,
        "oracle_satisfied": res.oracle_satisfied,
        "series": [(round(t, 1), n) for t, n in res.series],
        "final": {f.name: {"latency_s": f.latency_s, "limit": f.limit,
                           "cpu_cores": None if f.cpu_share is None else round(f.cpu_share * cores, 3),
                           "satisfied": f.satisfied} for f in res.final},
    }


# -- one real run ------------------------------------------------------------------------------


def _docker(*args: str, check: bool = True, timeout: float = 60) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise CliError(f"docker {args[0]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return done.stdout.strip()


class RealRun:
    """NATS + manager + one docker-runtime worker + the inference containers, for one policy."""

    def __init__(self, prefix: str, policy: str, specs: Sequence[ContainerSpec], *, cores: float, image: str,
                 batch: int, resolution_px: int, run_dir: Path) -> None:
        self.prefix, self.policy, self.specs = prefix, policy, list(specs)
        self.cores, self.image, self.batch, self.resolution_px = cores, image, batch, resolution_px
        self.run_dir = run_dir
        self.node = prefix
        self.nats: NatsServer | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[str] = []
        self.states: list[dict[str, Any]] = []
        self.cpu_samples: list[dict[str, Any]] = []
        self.t0 = 0.0

    def name(self, c: ContainerSpec) -> str:
        return f"{self.prefix}-{c.name}"

    def _spawn(self, what: str, args: list[str]) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with (self.run_dir / f"{what}.log").open("ab") as log:
            self.procs[what] = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True)

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.nats = NatsServer(jetstream=True, store_dir=str(self.run_dir / "jetstream"),
                               log_path=str(self.run_dir / "nats-server.out"))
        self.nats.start()
        url = self.nats.url
        self._spawn("manager", ["-m", "services.manager", "--nats", url, "--cluster-interval", "1"])
        self._spawn("worker", ["-m", "services.worker", "--nats", url, "--node", self.node, "--policy", self.policy,
                               "--runtime", "docker", "--cores", f"{self.cores:g}", "--state-interval", "2",
                               "--require-node-label"])
        time.sleep(1.0)
        for c in self.specs:
            name = self.name(c)
            _docker("run", "-d", "--name", name, "--init", "--network", "host",
                    "--label", "dqoes.managed=true", "--label", f"dqoes.node={self.node}",
                    "--label", f"dqoes.objective_s={c.objective_s:g}", "--label", f"dqoes.model={c.model}",
                    "--label", f"dqoes.run={self.prefix}",
                    "-e", f"DQOES_NODE={self.node}", "-e", f"DQOES_NATS_URL={url}",
                    "-e", f"DQOES_CONTAINER_NAME={name}", "-e", f"DQOES_MODEL={c.model}",
                    "-e", f"DQOES_BATCH={self.batch}", "-e", f"DQOES_RESOLUTION={self.resolution_px}",
                    "-e", "DQOES_THREADS=1",
                    "--entrypoint", "python", self.image, "-m", "services.inference")
            self.started.append(name)
        self.t0 = time.time()

    def groups(self) -> dict[str, cgroupfs.Group]:
        out = {}
        for name in self.started:
            cid = _docker("inspect", "-f", "{{.Id}}", name)
            with contextlib.suppress(OSError):
                out[name] = cgroupfs.docker_group(cgroupfs.DEFAULT_ROOT, cid)
        return out

    async def observe(self, duration_s: float, every_s: float, progress: Callable[[str], None]) -> None:
        assert self.nats is not None
        bus = await Bus.connect(self.nats.url, "dqoes-experiment-real", connect_timeout_s=5.0)

        def on_state(ns: NodeState, _: Any) -> None:
            row = {"t_s": round(ns.at - self.t0, 2), "satisfied": ns.satisfied, "round": ns.round,
                   "containers": {c.container.removeprefix(self.prefix + "-"): {
                       "cls": c.cls.value if c.cls else None, "latency_s": c.latency_s, "limit": c.limit,
                       "cpu_share": c.cpu_share, "objective_s": c.objective_s} for c in ns.containers}}
            self.states.append(row)

        await bus.subscribe(subjects.state(self.node), on_state, expect=NodeState)
        groups = self.groups()
        last = {n: cgroupfs.usage_s(g) for n, g in groups.items()}
        last_t = time.time()
        last_busy = busy_cores_s()
        next_print = 0.0
        try:
            while (now := time.time()) - self.t0 < duration_s:
                dead = {k: p.returncode for k, p in self.procs.items() if p.poll() is not None}
                if dead:
                    raise CliError(f"{', '.join(dead)} exited (logs in {self.run_dir})")
                await asyncio.sleep(min(every_s, max(0.1, duration_s - (now - self.t0))))
                now = time.time()
                busy = busy_cores_s()
                sample: dict[str, Any] = {"t_s": round(now - self.t0, 2), "loadavg_1m": os.getloadavg()[0],
                                          "machine_cores": round((busy - last_busy) / (now - last_t), 3),
                                          "cores": {}}
                last_busy = busy
                for n, g in groups.items():
                    with contextlib.suppress(OSError):
                        u = cgroupfs.usage_s(g)
                        sample["cores"][n.removeprefix(self.prefix + "-")] = round((u - last[n]) / (now - last_t), 3)
                        last[n] = u
                last_t = now
                sample["other_cores"] = round(max(0.0, sample["machine_cores"] - sum(sample["cores"].values())), 3)
                self.cpu_samples.append(sample)
                if now >= next_print:
                    s = self.states[-1] if self.states else None
                    sat = "-" if s is None else str(s["satisfied"])
                    lim = "" if s is None else " ".join(
                        f"{k}:{'-' if v['limit'] is None else format(v['limit'] * self.cores, '.2f')}"
                        for k, v in sorted(s["containers"].items()))
                    progress(f"{self.policy:<8} t = {now - self.t0:5.0f}/{duration_s:.0f} s  satisfied {sat}/"
                             f"{len(self.specs)}  limits (cores) {lim}  load {sample['loadavg_1m']:.2f}, "
                             f"others {sample['other_cores']:.2f} cores")
                    next_print = now + 30.0
        finally:
            with contextlib.suppress(BusError):
                await bus.close()

    def stop(self) -> None:
        # The worker first, so nothing re-limits a container while it goes.
        for what in ("worker", "manager"):
            p = self.procs.pop(what, None)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if self.started:
            _docker("rm", "-f", *self.started, check=False, timeout=120)
            self.started = []
        if self.nats is not None:
            self.nats.stop()
            self.nats = None


def summarize_real(run: RealRun, duration_s: float) -> dict[str, Any]:
    window = min(120.0, duration_s / 10)
    start = duration_s - window
    series = [(s["t_s"], s["satisfied"]) for s in run.states]
    meets = [(s["t_s"], sum(1 for v in s["containers"].values() if v["cls"] in (Cls.S.value, Cls.G.value)))
             for s in run.states]
    last = run.states[-1]["containers"] if run.states else {}
    final_cpu = {}
    for c in run.specs:
        vals = [s["cores"].get(c.name) for s in run.cpu_samples if s["t_s"] >= start and c.name in s["cores"]]
        final_cpu[c.name] = round(statistics.mean(vals), 3) if vals else None
    loads = [s["loadavg_1m"] for s in run.cpu_samples]
    others = [s["other_cores"] for s in run.cpu_samples if "other_cores" in s]
    return {
        "policy": run.policy,
        "satisfied_final": plateau(series, start, duration_s) if series else 0,
        "meets_final": plateau(meets, start, duration_s) if meets else 0,
        "final_window_s": window,
        "series": series,
        "meets_series": meets,
        "final": {c.name: {"latency_s": last.get(c.name, {}).get("latency_s"),
                           "cls": last.get(c.name, {}).get("cls"),
                           "limit": last.get(c.name, {}).get("limit"),
                           "cpu_cores": final_cpu[c.name]} for c in run.specs},
        "loadavg_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)} if loads else None,
        "total_cpu_cores_final": round(sum(v for v in final_cpu.values() if v is not None), 3),
        "other_cores_mean": round(statistics.mean(others), 3) if others else None,
    }


# -- rendering ---------------------------------------------------------------------------------


def render_markdown(d: dict[str, Any], plot_rel: str | None) -> str:
    cores = d["cores"]
    specs = d["containers"]
    lines = [BEGIN, ""]
    lines.append(f"Run {d['started_at']} with `{d['command']}`: {len(specs)} real inference containers "
                 f"(`{d['image']}`, {d['batch']} images × {d['resolution_px']} px a batch, one thread each) on this "
                 f"{cores:g}-core machine, {d['duration_s']:.0f} s per policy, the same containers and objectives "
                 f"under each. Profiles: `{d['profiles']}`.")
    lines.append("")
    lines.append("| container | model | objective (s) | fastest alone (s) | " + " | ".join(
        f"{p} latency (s) / class / limit / CPU (cores)" for p in d["real"]) + " |")
    lines.append("|---|---|---|---|" + "---|" * len(d["real"]))
    for c in specs:
        cells = []
        for r in d["real"].values():
            f = r["final"][c["name"]]
            lat = "-" if f["latency_s"] is None else f"{f['latency_s']:.2f}"
            lim = "none" if f["limit"] is None else f"{f['limit'] * cores:.2f}"
            cpu = "-" if f["cpu_cores"] is None else f"{f['cpu_cores']:.2f}"
            cells.append(f"{lat} / {f['cls'] or '-'} / {lim} / {cpu}")
        lines.append(f"| {c['name']} | {c['model']} | {c['objective_s']:g} | {c['fastest_s']:.2f} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Satisfied containers (|S|: latency within ±{ALPHA:.0%} of the objective, the simulator's ruler; "
                 f"plateau = lower median over the final {d['real'][next(iter(d['real']))]['final_window_s']:.0f} s), "
                 "and those at or under their objective's band (S or G):")
    lines.append("")
    lines.append("| policy | real: in S | real: S or G | simulator: in S | oracle bound | our containers' CPU at the end "
                 "(cores) | other processes' CPU, mean (cores) | load avg 1 min (min / median / max) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for p, r in d["real"].items():
        s = d["sim"].get(p, {})
        la = r["loadavg_1m"]
        la_s = "-" if not la else f"{la['min']:.2f} / {la['median']:.2f} / {la['max']:.2f}"
        oth = "-" if r.get("other_cores_mean") is None else f"{r['other_cores_mean']:.2f}"
        lines.append(f"| {p} | {r['satisfied_final']} | {r['meets_final']} | {s.get('satisfied_final', '-')} | "
                     f"{s.get('oracle_satisfied', '-')} | {r['total_cpu_cores_final']:.2f} | {oth} | {la_s} |")
    lines.append("")
    lines.append("Final CPU split (cores, mean over the final window; real from each container's cgroup, "
                 "simulated from the model):")
    lines.append("")
    cols = [(f"{p} real", d["real"][p]["final"]) for p in d["real"]] + [
        (f"{p} sim", d["sim"][p]["final"]) for p in d["sim"]]
    lines.append("| container | " + " | ".join(n for n, _ in cols) + " |")
    lines.append("|---|" + "---|" * len(cols))
    for c in specs:
        vals = []
        for _, f in cols:
            v = f.get(c["name"], {}).get("cpu_cores")
            vals.append("-" if v is None else f"{v:.2f}")
        lines.append(f"| {c['name']} | " + " | ".join(vals) + " |")
    lines.append("")
    if d.get("notes"):
        lines += [d["notes"], ""]
    if plot_rel:
        lines += [f"![satisfied containers over time and the final CPU split]({plot_rel})", ""]
    lines.append(END)
    return "\n".join(lines)


def render_plot(d: dict[str, Any]) -> str:
    colors = {"dqoes": svgplot.PALETTE[0], "default": svgplot.PALETTE[1]}
    series = []
    for p, r in d["real"].items():
        series.append(svgplot.Series(f"{p} real", [tuple(x) for x in r["series"]], colors.get(p), step=True,
                                     markers=False))
    for p, s in d["sim"].items():
        series.append(svgplot.Series(f"{p} simulated", [tuple(x) for x in s["series"]], colors.get(p), dashed=True,
                                     step=True, markers=False))
    names = [c["name"] for c in d["containers"]]
    bars = {f"{p} real": [r["final"][n]["cpu_cores"] or 0.0 for n in names] for p, r in d["real"].items()}
    bars.update({f"{p} sim": [s["final"][n]["cpu_cores"] or 0.0 for n in names] for p, s in d["sim"].items()})
    return svgplot.figure([
        svgplot.Panel("Satisfied containers |S| over time", "seconds", "containers in S",
                      series, y_min=0, y_max=len(names)),
        svgplot.Panel("Final CPU split", "container", "cores (mean, final window)", bars=bars,
                      bar_categories=[f"{c['name']} ({c['objective_s']:g} s)" for c in d["containers"]],
                      y_min=0, bar_colors={"dqoes real": colors["dqoes"], "dqoes sim": "#9ecae1",
                                           "default real": colors["default"], "default sim": "#fcae91"}),
    ], caption=f"dqoes experiment real: {len(names)} containers on {d['cores']:g} cores; dashed: the simulator's forecast")


# -- the command -------------------------------------------------------------------------------


def load_profiles(path: str | None) -> tuple[dict[str, ModelProfile], str]:
    p = path or os.environ.get("DQOES_PROFILES") or (str(DEFAULT_PROFILES) if DEFAULT_PROFILES.exists() else None)
    if p is None:
        return dict(BUILTIN_PROFILES), "built-in"
    try:
        loaded = load_profiles_file(p)
    except ScenarioError as e:
        raise CliError(str(e)) from None
    shown = os.path.relpath(p, REPO) if Path(p).resolve().is_relative_to(REPO) else p
    return {**BUILTIN_PROFILES, **loaded}, shown


def cmd_real(args: argparse.Namespace) -> int:
    if args.from_file:
        try:
            d = json.loads(Path(args.from_file).read_text())
        except (OSError, ValueError) as e:
            raise CliError(f"--from {args.from_file}: {e}") from None
    else:
        d = run_experiment(args)
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        Path(args.plot).write_text(render_plot(d))
        _log(f"plot written to {args.plot}")
    rel = None
    if args.plot and args.update:
        rel = os.path.relpath(Path(args.plot).resolve(), Path(args.update).resolve().parent)
    md = render_markdown(d, rel)
    if args.update:
        update_section(Path(args.update), md, BEGIN, END)
        _log(f"section updated in {args.update}")
    if args.json:
        emit_json({k: v for k, v in d.items()})
    elif not args.update:
        print(md)
    return 0


def run_experiment(args: argparse.Namespace) -> dict[str, Any]:
    if args.containers < 1:
        raise CliError("--containers must be >= 1")
    if args.duration_s < 30:
        raise CliError("--duration-s must be >= 30")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in ("dqoes", "default"):
            raise CliError(f"--policies: {p!r} is not dqoes or default")
    if shutil.which("docker") is None:
        raise CliError("the docker command is not installed")
    if os.geteuid() != 0:
        raise CliError("experiment real needs root (it reads the containers' cgroups)")
    if _docker("images", "-q", args.image, check=False) == "":
        raise CliError(f"image {args.image} not found (build it with compose/images/build.sh)")
    profiles, profiles_name = load_profiles(args.profiles)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in profiles:
            raise CliError(f"--models: no profile for {m!r}")
        p = profiles[m]
        if (p.batch_images, p.resolution_px) != (args.batch_size, args.resolution):
            _log(f"warning: profile {m} was measured at {p.batch_images} x {p.resolution_px} px, the containers "
                 f"run {args.batch_size} x {args.resolution} px: the forecast will not match")
    objectives = None
    if args.objectives:
        try:
            objectives = [float(x) for x in args.objectives.split(",")]
        except ValueError:
            raise CliError(f"--objectives: expected numbers, got {args.objectives!r}") from None
        if any(o <= 0 for o in objectives):
            raise CliError("--objectives: each must be > 0")
    cores = args.cores or float(os.cpu_count() or 1)
    specs = plan_containers(args.containers, models, profiles, cores, objectives)
    prefix = f"dqx-{uuid.uuid4().hex[:6]}"
    out_dir = Path(args.out or f"runs/real-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    _log(f"prefix {prefix}; {len(specs)} containers on {cores:g} cores; profiles {profiles_name}; records in {out_dir}")
    for c in specs:
        _log(f"  {c.name}: {c.model}, objective {c.objective_s:g} s "
             f"(fastest alone {profiles[c.model].with_threads(1).fastest_s(cores):.2f} s)")

    sc = sim_scenario(specs, profiles, cores, args.duration_s)
    sim = {p: forecast(sc, p, args.seed) for p in policies}
    for p, s in sim.items():
        _log(f"simulator: {p} {s['satisfied_final']} satisfied (oracle bound {s['oracle_satisfied']})")

    real: dict[str, Any] = {}
    interrupted = False
    for p in policies:
        run = RealRun(prefix, p, specs, cores=cores, image=args.image, batch=args.batch_size,
                      resolution_px=args.resolution, run_dir=out_dir / p)
        try:
            run.start()
            _log(f"{p}: {len(specs)} containers started")
            asyncio.run(run.observe(args.duration_s, args.sample_s, _log))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            run.stop()
        with (out_dir / f"{p}.jsonl").open("w") as f:
            for row in run.states:
                f.write(json.dumps({"kind": "state", **row}) + "\n")
            for row in run.cpu_samples:
                f.write(json.dumps({"kind": "cpu", **row}) + "\n")
        if interrupted:
            raise KeyboardInterrupt
        real[p] = summarize_real(run, args.duration_s)
        _log(f"{p}: {real[p]['satisfied_final']} satisfied at the plateau ({real[p]['meets_final']} in S or G)")
    d = {
        "command": command_line(args),
        "started_at": started_at,
        "prefix": prefix,
        "image": args.image,
        "cores": cores,
        "batch": args.batch_size,
        "resolution_px": args.resolution,
        "duration_s": args.duration_s,
        "profiles": profiles_name,
        "containers": [{"name": c.name, "model": c.model, "objective_s": c.objective_s,
                        "fastest_s": round(profiles[c.model].with_threads(1).fastest_s(cores), 3)} for c in specs],
        "real": real,
        "sim": sim,
    }
    (out_dir / "summary.json").write_text(json.dumps(d, indent=1))
    _log(f"summary written to {out_dir / 'summary.json'}")
    return d


def command_line(args: argparse.Namespace) -> str:
    parts = ["dqoes experiment real", f"--containers {args.containers}", f"--duration-s {args.duration_s:g}",
             f"--models {args.models}", f"--batch-size {args.batch_size}", f"--resolution {args.resolution}"]
    if args.objectives:
        parts.append(f"--objectives {args.objectives}")
    return " ".join(parts)


def add_parser(es: argparse._SubParsersAction) -> None:
    p = es.add_parser(
        "real", help="DQoES vs default on real inference containers here, with the simulator's forecast",
        description="Start a private NATS, the manager and a docker-runtime worker, run N real inference "
        "containers (dqoes-workload image) with objectives under DQoES, then under the default policy (no "
        "limits), record |S| over time, limits and CPU use, and compare with the simulator run on the same "
        "setup with the calibrated profiles. Needs root and Docker. Progress goes to stderr.")
    p.add_argument("--containers", type=int, default=5, help="how many inference containers (default 5)")
    p.add_argument("--duration-s", type=float, default=600.0, help="seconds per policy (default 600)")
    p.add_argument("--policies", default="dqoes,default", help="run in this order (default dqoes,default)")
    p.add_argument("--models", default="resnet50,mobilenetv2", help="cycled over the containers")
    p.add_argument("--objectives", help="seconds a batch, cycled (default: fastest-alone x 0.8, 3, 1.6, 5, 2.2, 8)")
    p.add_argument("--batch-size", type=int, default=10, help="images a batch (default 10, as calibrated)")
    p.add_argument("--resolution", type=int, default=224, help="image side in px (default 224, as calibrated)")
    p.add_argument("--cores", type=float, help="the node's cores (default: all of this machine's)")
    p.add_argument("--profiles", help="profiles file for the forecast (default: $DQOES_PROFILES, else "
                   "docs/calibration/profiles.toml, else the built-ins)")
    p.add_argument("--image", default="dqoes-workload:latest", help="inference image")
    p.add_argument("--seed", type=int, default=1, help="simulator seed")
    p.add_argument("--sample-s", type=float, default=5.0, help="CPU sampling period (default 5 s)")
    p.add_argument("--out", metavar="DIR", help="records (timelines, summary.json; default runs/real-<time>)")
    p.add_argument("--from", dest="from_file", metavar="JSON", help="run nothing: render a summary.json")
    p.add_argument("--update", metavar="MD", help="replace the generated section of this Markdown file")
    p.add_argument("--plot", metavar="SVG", help="write the figure")
    p.add_argument("--json", action="store_true", help="last line of stdout: one JSON object")
    p.set_defaults(func=cmd_real)
