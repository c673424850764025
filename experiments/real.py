"""`dqoes experiment real`: DQoES against default Docker on real inference containers, and the simulator's forecast.

Why: the simulator's results mean something only if a real node behaves the
same. This command runs the live system (a private nats-server, the manager,
one worker with the Docker runtime) on this machine's Docker engine with a
handful of real inference containers (image dqoes-workload:latest) carrying
objectives, first under DQoES and then under the default policy (no limits,
CFS fair share) on the same workload. It records the node's state over time
(|S|, limits, latencies) and each container's CPU use from its cgroup, then
simulates the same setup with the calibrated profiles (`dqoes calibrate`)
and writes both side by side (`--update FILE`, `--plot`).

Only containers this command started are touched: they are named
`<prefix>-cNN` with a prefix unique to the run, carry `dqoes.node=<prefix>`,
and the worker runs with `--require-node-label` so it sees nothing else on a
shared engine. Containers are started with the `docker` command, as an
operator would; only the worker's runtime talks to the engine's API.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.calibrate import CalibrationOptions, calibrate, parse_models
from experiments.common import (
    ExperimentError,
    PrivateNats,
    batch_finished_s,
    busy_cores_s,
    check_interrupted,
    checked_entry,
    read_back_json,
    read_record,
    reading_back,
    record_stem,
    update_section,
)
from shared import auth, children, subjects
from shared.bus import Bus, BusError
from shared.core import registry
from shared.core.measures import plateau, time_mean
from shared.core.oracle import OracleItem, expected_plan, plan_node
from shared.core.policy import BaseParams
from shared.core.profiles import BUILTIN_PROFILES, ModelProfile, at_batch
from shared.core.types import Cls, classify, is_met, is_satisfied
from shared.runtime import cgroupfs
from shared.scenarios.spec import (
    ContainerSpec,
    NodeSpec,
    Scenario,
    ScenarioError,
    load_profiles_file,
    parse_profiles,
    scenario_to_dict,
)
from shared.schema import DecisionMsg, LatencyEvent, NodeState
from shared.settings import policy_entry
from shared.sim.engine import simulate

DEFAULT_PROFILES = Path(__file__).with_name("profiles.toml")
"""The profiles measured on the project's 2-core machine (package data; docs/guide/calibration.md)."""
DEFAULT_PROFILES_NAME = "experiments/profiles.toml"
"""How a summary names them: the same wherever the package is installed."""
OLD_DEFAULT_PROFILES_NAMES = ("docs/calibration/profiles.toml",)
"""Where summaries written before the profiles became package data found the same file."""
BEGIN = "<!-- BEGIN generated: dqoes experiment real -->"
END = "<!-- END generated: dqoes experiment real -->"
FACTORS = (0.8, 3.0, 1.6, 5.0, 2.2, 8.0)
"""Objective = fastest-alone latency x factor, cycled over the containers: the first is
unachievable even alone; whether the others fit together on the node is the policies' business."""
ALPHA = 0.10
STAMP_DIGITS = 3
"""Record times to the millisecond: whether a batch began before its limit changed (the policy
discounts such a batch) can turn on a few ms, and a replay decides it from these stamps."""


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
                 duration_s: float, node: str = "node", follows: bool = False) -> Scenario:
    """The run's node in the simulator. `follows`: each workload runs max(1, floor(limit)) threads, as the
    real ones do, each doing a core's work of its one-thread profile; else one thread whatever the limit
    (how runs before 26 Nov 2026 were forecast, and what their summaries' bounds assume)."""
    threads = max(1, math.floor(cores)) if follows else 1
    if follows:
        profiles = {m: p.with_threads(p.threads, follows_limit=True) for m, p in profiles.items()}
    return Scenario(
        name="real-node-forecast", nodes=(NodeSpec(node, cores),),
        containers=tuple(ContainerSpec(c.name, c.model, c.objective_s, 0.0, node, threads=threads) for c in specs),
        profiles=profiles, duration_s=duration_s,
        description="the real experiment's node and containers, simulated with the calibrated profiles",
    )


def forecast(sc: Scenario, policy: str, seed: int = 1) -> dict[str, Any]:
    """What the simulator predicts: |S| over time, the plateau, final latencies and CPU split."""
    res = simulate(sc, policy, seed)
    cores = sc.nodes[0].cores
    return {
        "policy": policy,
        "met_final": res.met_final,
        "satisfied_final": res.satisfied_final,
        "cpu_cores_final": round(res.cpu_cores_final, 3),
        "oracle_met": res.oracle_met,
        "oracle_satisfied": res.oracle_satisfied,
        "series": [(round(t, 1), n) for t, n in res.series],
        "met_series": [(round(t, 1), n) for t, n in res.met_series],
        "final": {f.name: {"latency_s": f.latency_s, "limit": f.limit,
                           "cpu_cores": None if f.cpu_share is None else round(f.cpu_share * cores, 3),
                           "satisfied": f.satisfied} for f in res.final},
    }


# -- one real run ------------------------------------------------------------------------------


def _docker(*args: str, check: bool = True, timeout: float = 60) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise ExperimentError(f"docker {args[0]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return done.stdout.strip()


class RealRun:
    """NATS + manager + one worker + the inference workloads, for one policy.

    `runtime` "docker": real containers of the workload image, started with
    the `docker` command; "cgroup": real inference processes the worker's
    cgroup runtime starts itself from a scenario file (no Docker needed).
    """

    def __init__(self, prefix: str, policy: str, specs: Sequence[ContainerSpec], *, cores: float, image: str,
                 batch: int, resolution_px: int, run_dir: Path, runtime: str = "docker",
                 settings: dict[str, float] | None = None, cpu_weights: bool = True) -> None:
        self.prefix, self.policy, self.specs = prefix, policy, list(specs)
        self.cpu_weights = cpu_weights
        """The worker sets each container's CPU weight from its limit (`--cpu-weights`)."""
        self.settings = dict(settings or {})
        """The policy's parameters, given to the worker with `--param` (the defaults where empty)."""
        self.label = policy_entry(policy, self.settings)
        self.cores, self.image, self.batch, self.resolution_px = cores, image, batch, resolution_px
        self.run_dir = run_dir
        self.runtime = runtime
        self.node = prefix
        self.nats: PrivateNats | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[str] = []
        self.states: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        """Every round the worker published: each container's old and new limit and the reason."""
        self.batches: list[dict[str, Any]] = []
        """Every batch the workloads reported: what the policy saw, so a run can be replayed."""
        self.cpu_samples: list[dict[str, Any]] = []
        self.t0 = 0.0

    def name(self, c: ContainerSpec) -> str:
        return f"{self.prefix}-{c.name}" if self.runtime == "docker" else c.name

    def _spawn(self, what: str, args: list[str], identity: str) -> None:
        assert self.nats is not None
        args = [*args, "--creds", str(self.nats.creds(identity))]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with (self.run_dir / f"{what}.log").open("ab") as log:
            self.procs[what] = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True,
                                                preexec_fn=children.die_with_parent())
        check_interrupted()  # a SIGTERM during the fork is dropped there

    def worker_args(self, url: str) -> list[str]:
        """The worker's arguments every runtime shares (python's, from -m on)."""
        args = ["-m", "services.worker", "--nats", url, "--node", self.node, "--policy", self.policy,
                "--cores", f"{self.cores:g}", "--state-interval", "2"]
        args.append("--cpu-weights" if self.cpu_weights else "--no-cpu-weights")
        if self.settings:
            args += ["--param", ",".join(f"{k}={v!r}" for k, v in sorted(self.settings.items()))]
        return args

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Authentication and per-role permissions, the credentials outside the records (common.py).
        self.nats = PrivateNats([self.node], self.run_dir / "nats-server.out")
        url = self.nats.start()
        self._spawn("manager", ["-m", "services.manager", "--nats", url, "--cluster-interval", "1",
                                "--store-creds", str(self.nats.creds("store"))], "manager")
        common = self.worker_args(url)
        if self.runtime == "cgroup":
            scenario = self.run_dir / "scenario.json"
            scenario.write_text(json.dumps(scenario_to_dict(Scenario(
                name="real", nodes=(NodeSpec(self.node, self.cores),),
                containers=tuple(dataclasses.replace(c, node=self.node) for c in self.specs),
                profiles=BUILTIN_PROFILES, duration_s=1e9))))
            self._spawn("worker", [*common, "--runtime", "cgroup", "--scenario", str(scenario),
                                   "--workload-batch", str(self.batch), "--workload-resolution",
                                   str(self.resolution_px)], auth.identity_name("worker", self.node))
            self.started = [c.name for c in self.specs]
            self.t0 = time.time()
            return
        self._spawn("worker", [*common, "--runtime", "docker", "--require-node-label"],
                    auth.identity_name("worker", self.node))
        inference_creds = self.nats.creds(auth.identity_name("inference", self.node)).resolve()  # docker -v: absolute
        time.sleep(1.0)
        for c in self.specs:
            _docker(*self.docker_run_args(c, url, inference_creds))
            self.started.append(self.name(c))
            check_interrupted()
        self.t0 = time.time()

    def docker_run_args(self, c: ContainerSpec, url: str, creds: Path) -> list[str]:
        """`docker run` for one workload: labelled for the worker, its threads left to follow its limit
        (max(1, floor(limit)), as the forecast and the bounds model them and as under the cgroup runtime)."""
        name = self.name(c)
        return ["run", "-d", "--name", name, "--init", "--network", "host",
                "--label", "dqoes.managed=true", "--label", f"dqoes.node={self.node}",
                "--label", f"dqoes.objective_s={c.objective_s:g}", "--label", f"dqoes.model={c.model}",
                "--label", f"dqoes.run={self.prefix}",
                "-e", f"DQOES_NODE={self.node}", "-e", f"DQOES_NATS_URL={url}",
                "-v", f"{creds}:/run/dqoes/nats.creds:ro",
                "-e", "DQOES_NATS_CREDS=/run/dqoes/nats.creds",
                "-e", f"DQOES_CONTAINER_NAME={name}", "-e", f"DQOES_MODEL={c.model}",
                "-e", f"DQOES_BATCH={self.batch}", "-e", f"DQOES_RESOLUTION={self.resolution_px}",
                "--entrypoint", "python", self.image, "-m", "services.inference"]

    def groups(self) -> dict[str, cgroupfs.Group]:
        out = {}
        if self.runtime == "cgroup":
            for name in self.started:
                g = cgroupfs.group_at(cgroupfs.DEFAULT_ROOT, f"dqoes-{self.node}/{name}")
                for _ in range(100):  # the runtime creates it when the process starts
                    if cgroupfs.exists(g):
                        out[name] = g
                        break
                    check_interrupted()
                    time.sleep(0.1)
            return out
        for name in self.started:
            cid = _docker("inspect", "-f", "{{.Id}}", name)
            with contextlib.suppress(OSError):
                out[name] = cgroupfs.docker_group(cgroupfs.DEFAULT_ROOT, cid)
        return out

    async def observe(self, duration_s: float, every_s: float, progress: Callable[[str], None]) -> None:
        assert self.nats is not None
        bus = await Bus.connect(self.nats.url_as("client"),
                                "dqoes-experiment-real", connect_timeout_s=5.0)

        def on_state(ns: NodeState, _: Any) -> None:
            row = {"t_s": round(ns.at - self.t0, STAMP_DIGITS), "satisfied": ns.satisfied, "round": ns.round,
                   "params": dict(ns.params),
                   "containers": {c.container.removeprefix(self.prefix + "-"): {
                       "cls": c.cls.value if c.cls else None, "latency_s": c.latency_s, "limit": c.limit,
                       "cpu_share": c.cpu_share, "objective_s": c.objective_s, "alpha": c.alpha}
                       for c in ns.containers}}
            self.states.append(row)

        def on_decision(d: DecisionMsg, _: Any) -> None:
            self.decisions.append({
                "t_s": round(d.at - self.t0, STAMP_DIGITS), "round": d.round, "event": d.event, "interval_s": d.interval_s,
                "containers": {c.container.removeprefix(self.prefix + "-"): {
                    "old_limit": c.old_limit, "new_limit": c.new_limit, "latency_s": c.latency_s,
                    "cpu_share": c.cpu_share, "reason": c.reason} for c in d.containers}})

        def on_batch(e: LatencyEvent, _: Any) -> None:
            self.batches.append({"t_s": round(time.time() - self.t0, STAMP_DIGITS),
                                 **({} if e.finished_at is None else
                                    {"finished_s": round(e.finished_at - self.t0, STAMP_DIGITS)}),
                                 "container": e.container.removeprefix(self.prefix + "-"),
                                 "latency_s": e.latency_s, "cpu_s": e.cpu_s, "batch": e.batch,
                                 "model": e.model, "images": e.images,
                                 **({"follows_limit": True} if e.follows_limit else {})})

        await bus.subscribe(subjects.state(self.node), on_state, expect=NodeState)
        await bus.subscribe(subjects.decisions(self.node), on_decision, expect=DecisionMsg)
        await bus.subscribe(subjects.latency_of_node(self.node), on_batch, expect=LatencyEvent)
        groups = self.groups()
        last = {n: cgroupfs.usage_s(g) for n, g in groups.items()}
        last_t = time.time()
        last_busy = busy_cores_s()
        next_print = 0.0
        try:
            while (now := time.time()) - self.t0 < duration_s:
                dead = {k: p.returncode for k, p in self.procs.items() if p.poll() is not None}
                if dead:
                    raise ExperimentError(f"{', '.join(dead)} exited (logs in {self.run_dir})")
                check_interrupted()
                await asyncio.sleep(min(every_s, max(0.1, duration_s - (now - self.t0))))
                now = time.time()
                busy = busy_cores_s()
                sample: dict[str, Any] = {"t_s": round(now - self.t0, STAMP_DIGITS), "loadavg_1m": os.getloadavg()[0],
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
                    progress(f"{self.label:<8} t = {now - self.t0:5.0f}/{duration_s:.0f} s  satisfied {sat}/"
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
        if self.started and self.runtime == "docker":
            _docker("rm", "-f", *self.started, check=False, timeout=120)
            self.started = []
        if self.nats is not None:
            self.nats.close()
            self.nats = None


DEFAULT_ALPHA = BaseParams().alpha
"""The band of a recorded state that does not name one (every policy's default)."""


def latest_counts(state: dict[str, Any], alpha: float) -> tuple[int, int]:
    """(met, in band) of one recorded node state, from each container's latest batch.

    The worker's classes and `satisfied` are those of its last round; a policy that runs a round
    every minute or two (the learned allocator, once settled) would be counted on old news, while
    every state carries each container's latest batch latency (what a client counts)."""
    met = in_band = 0
    for v in state["containers"].values():
        objective, latency = v.get("objective_s"), v.get("latency_s")
        a = v.get("alpha") or alpha
        met += is_met(objective, latency, a)
        in_band += is_satisfied(objective, latency, a)
    return met, in_band


def summarize_real(run: RealRun, duration_s: float, alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    window = min(120.0, duration_s / 10)
    start = duration_s - window
    counts = [(s["t_s"], *latest_counts(s, alpha)) for s in run.states]
    series = [(t, band) for t, _, band in counts]
    meets = [(t, met) for t, met, _ in counts]
    last = run.states[-1]["containers"] if run.states else {}
    final_cpu = {}
    for c in run.specs:
        vals = [s["cores"].get(c.name) for s in run.cpu_samples if s["t_s"] >= start and c.name in s["cores"]]
        final_cpu[c.name] = round(statistics.mean(vals), 3) if vals else None
    loads = [s["loadavg_1m"] for s in run.cpu_samples]
    others = [s["other_cores"] for s in run.cpu_samples if "other_cores" in s]
    return {
        "policy": run.label,
        "settings": run.settings,
        "satisfied_final": plateau(series, start, duration_s) if series else 0,
        "met_final": plateau(meets, start, duration_s) if meets else 0,
        "final_window_s": window,
        "met_mean_second_half": time_mean(meets, duration_s / 2, duration_s),
        "satisfied_mean_second_half": time_mean(series, duration_s / 2, duration_s),
        "series": series,
        "met_series": meets,
        "final": {c.name: {"latency_s": last.get(c.name, {}).get("latency_s"),
                           "cls": last.get(c.name, {}).get("cls"),
                           "limit": last.get(c.name, {}).get("limit"),
                           "cpu_cores": final_cpu[c.name]} for c in run.specs},
        "loadavg_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)} if loads else None,
        "total_cpu_cores_final": round(sum(v for v in final_cpu.values() if v is not None), 3),
        "other_cores_mean": round(statistics.mean(others), 3) if others else None,
    }


NOISE_MIN_BATCHES = 3
"""Batches at one unchanged limit before their spread counts towards a run's noise."""


def _window_batches(rows: Sequence[dict[str, Any]], from_s: float) -> Iterator[tuple[dict[str, Any], float]]:
    """The batch rows that finished from `from_s` on, each with when it finished: warm-ups (which load
    the model) and batches without a positive latency left out. One window for every per-batch measure
    of a run, so that they count the same batches."""
    for r in rows:
        if r.get("kind") != "batch" or r.get("batch", 1) == 0 or not r["latency_s"] > 0:
            continue
        end = batch_finished_s(r)
        if end >= from_s:
            yield r, end


def _steady_batches(rows: Sequence[dict[str, Any]],
                    from_s: float) -> Iterator[tuple[dict[str, Any], int, float | None]]:
    """The batches of `_window_batches` whose limit no decision changed while they ran, each with the
    stretch of one limit it ran in (0: before its container's first decision) and that limit (a fraction
    of the node; None: none, or not known yet)."""
    changes: dict[str, list[tuple[float, Any]]] = {}
    for r in sorted((r for r in rows if r.get("kind") == "decision"), key=lambda r: r["t_s"]):
        for name, c in r["containers"].items():
            seq = changes.setdefault(name, [])
            if not seq or seq[-1][1] != c["new_limit"]:
                seq.append((r["t_s"], c["new_limit"]))
    for r, end in _window_batches(rows, from_s):
        seq = changes.get(r["container"], [])
        start = end - r["latency_s"]
        if any(start < t <= end for t, _ in seq):
            continue  # its limit changed while it ran
        stretch = sum(1 for t, _ in seq if t <= start)
        yield r, stretch, seq[stretch - 1][1] if stretch else None


def measured_noise(rows: Sequence[dict[str, Any]], from_s: float) -> dict[str, Any] | None:
    """The batch-to-batch noise a run saw: the pooled standard deviation of log latency between
    batches of one container at one unchanged limit, over batches that finished from `from_s` on.

    `rows` are the run's records (decision and batch rows, as `--out` writes them). A batch counts
    when no decision changed its container's limit while it ran, and not the first of its container
    (the warm-up loads the model); each stretch of one limit with NOISE_MIN_BATCHES or more such
    batches gives its deviations from its own mean, so moving limits add nothing to the spread.
    None when no stretch has enough batches."""
    groups: dict[tuple[str, int], list[float]] = {}
    for r, stretch, _ in _steady_batches(rows, from_s):
        groups.setdefault((r["container"], stretch), []).append(math.log(r["latency_s"]))
    sq, n, used = 0.0, 0, 0
    for ys in groups.values():
        if len(ys) < NOISE_MIN_BATCHES:
            continue
        mean = statistics.fmean(ys)
        sq += sum((y - mean) ** 2 for y in ys)
        n += len(ys) - 1
        used += len(ys)
    if n < 2:
        return None
    return {"sd": round(math.sqrt(sq / n), 4), "batches": used}


def batches_by_container(d: dict[str, Any], rows: Sequence[dict[str, Any]], from_s: float,
                         alpha: float = DEFAULT_ALPHA) -> dict[str, dict[str, Any]]:
    """Each container's batches that finished from `from_s` on, as its client saw them one by one:
    how many, the share met, in band, and faster than its band, and the median latency over the
    objective. Warm-ups (which load the model) are left out.

    Why: the plateau counts only each container's latest batch, and the second-half means only the
    node's states; what a client of one container lived through is every batch it got, which is what
    says whether a count was lost to the noise (in band one batch in three, met nine in ten) or to a
    limit (never met)."""
    objective = {c["name"]: c["objective_s"] for c in d["containers"]}
    seen: dict[str, list[float]] = {}
    for r, _ in _window_batches(rows, from_s):
        if r.get("container") not in objective:
            continue
        seen.setdefault(r["container"], []).append(float(r["latency_s"]))
    out = {}
    for name, lats in sorted(seen.items()):
        o = objective[name]
        n = len(lats)
        # DQoES's classes of each batch: faster than its band (G), in band (S), late (B); met is not B.
        cls = Counter(classify(o, x, alpha) for x in lats)
        out[name] = {"batches": n,
                     "met": round((n - cls[Cls.B]) / n, 3),
                     "in_band": round(cls[Cls.S] / n, 3),
                     "faster": round(cls[Cls.G] / n, 3),
                     "median_to_objective": round(statistics.median(lats) / o, 3)}
    return out


def _nearest(knots: Sequence[float], cores: float) -> int:
    """The index of the knot nearest to `cores`."""
    return min(range(len(knots)), key=lambda k: abs(knots[k] - cores))


def _oracle_items(d: dict[str, Any], profiles: dict[str, ModelProfile], alpha: float) -> list[OracleItem]:
    """The run's containers as the oracle sees them, each with its profile from `profiles`."""
    specs = [ContainerSpec(c["name"], c["model"], c["objective_s"], 0.0, "node", threads=1) for c in d["containers"]]
    sc = sim_scenario(specs, profiles, d["cores"], d["duration_s"], follows=d.get("threads_follow") is True)
    return [OracleItem(c.name, float(c.objective_s), alpha, sc.profile_of(c))
            for c in sc.containers if c.objective_s is not None]


def oracle_under_noise(d: dict[str, Any], profiles: dict[str, ModelProfile], sd: float,
                       alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """The oracle on the run's node and containers (the calibrated profiles as the truth) under
    log-normal noise of `sd`: the allocation that expects the most met + in band, and the lower median
    of its met and in-band counts (the statistic a run's plateau reports), beside their expectations, and
    the most met, and the most in band, that any allocation can expect (each alone)."""
    ex = expected_plan(_oracle_items(d, profiles, alpha), d["cores"], sd)
    return {"met": ex.met_median, "in_band": ex.in_band_median,
            "met_expected": round(ex.met, 2), "in_band_expected": round(ex.in_band, 2),
            "met_ceiling": round(ex.met_ceiling, 2), "in_band_ceiling": round(ex.in_band_ceiling, 2)}


WORK_MIN_BATCHES = 10
"""Steady batches near one point of a profile's quota curve (or under no quota) before their median
CPU-seconds stand for what a batch cost there in the run; a point with fewer takes the ratio to the
profile of the nearest one that has them."""


def measured_work(d: dict[str, Any], rows: Sequence[dict[str, Any]],
                  profiles: Mapping[str, ModelProfile]) -> dict[str, ModelProfile]:
    """Each model's profile as one policy's run measured it: what a batch cost under no quota
    (`work_cpu_s`) and what a quota cost on top (`efficiency`), from the CPU-seconds of its batches and
    the limit each ran under. Warm-ups (which load the model), batches without a CPU reading and batches
    whose limit changed while they ran are left out; a model no batch measured, or one without a
    profile, is not in it.

    Why: the oracle's bound comes from calibrated profiles, measured once, maybe on another machine of
    the same kind; on the 16-core host a batch took about 10-35 % less CPU in the runs than in
    calibration, and the runs differed among themselves by about a tenth. A batch's CPU-seconds already
    hold what its quota cost, so the run's median is not the work before the quota: taken for it (as
    until 1 Dec), the oracle applied the profile's quota cost a second time, and where that cost did not
    hold either (the 16-core host's profile has ResNet-50 at 1.38 x its work under half a core; its
    runs, about 1.1 x) it asked for more cores than the runs needed. Here each batch counts towards the
    point of the profile's quota curve nearest its limit (or towards no quota, at or above its threads),
    and each point with WORK_MIN_BATCHES batches takes the run's median there (points that read cheaper
    under a smaller quota pooled); the others keep the profile's shape from the nearest measured point.
    With no point that well measured, every batch scales the profile alike (the median of its
    CPU-seconds over what the profile says at its limit)."""
    model = {c["name"]: c["model"] for c in d["containers"]}
    seen: dict[str, list[tuple[float | None, float]]] = {}
    for r, stretch, limit in _steady_batches(rows, 0.0):
        cpu_s = r.get("cpu_s")
        if not stretch:
            continue  # before its container's first decision: its limit is not known
        if isinstance(cpu_s, int | float) and math.isfinite(cpu_s) and cpu_s > 0 and model.get(r["container"]) in profiles:
            seen.setdefault(model[r["container"]], []).append((None if limit is None else limit * d["cores"], float(cpu_s)))
    return {m: _fitted_profile(profiles[m], batches) for m, batches in sorted(seen.items())}


def _fitted_profile(p: ModelProfile, batches: Sequence[tuple[float | None, float]]) -> ModelProfile:
    """`p` with its work and quota curve from `batches` ((cores of limit or None, CPU-seconds)), as
    `measured_work` says."""
    knots = [c for c, _ in p.efficiency]
    # Point index per batch: len(knots) stands for "no quota held it".
    groups: dict[int, list[float]] = {}
    for cores, cpu_s in batches:
        free = cores is None or cores >= p.threads_at(cores) or not knots
        g = len(knots) if free or cores is None else _nearest(knots, cores)
        groups.setdefault(g, []).append(cpu_s)
    profile_cost = [p.work_cpu_s * m for _, m in p.efficiency] + [p.work_cpu_s]
    well = sorted(g for g, v in groups.items() if len(v) >= WORK_MIN_BATCHES)
    if not well:
        ratio = statistics.median(cpu_s / (p.work_cpu_s * p.cpu_multiplier(cores)) for cores, cpu_s in batches)
        return dataclasses.replace(p, work_cpu_s=round(p.work_cpu_s * ratio, 4))
    costs = _never_cheaper_under_less([statistics.median(groups[g]) for g in well], [len(groups[g]) for g in well])
    measured = {g: c / profile_cost[g] for g, c in zip(well, costs, strict=True)}
    said = [measured[min(measured, key=lambda h: (abs(h - g), -h))] for g in range(len(knots) + 1)]
    work = p.work_cpu_s * said[-1]
    mult = [max(1.0, m * said[k] / said[-1]) for k, (_, m) in enumerate(p.efficiency)]
    for k in range(len(mult) - 2, -1, -1):
        mult[k] = max(mult[k], mult[k + 1])  # a smaller quota never costs less
    return dataclasses.replace(p, work_cpu_s=round(work, 4),
                               efficiency=tuple((c, round(m, 4)) for c, m in zip(knots, mult, strict=True)))


def _never_cheaper_under_less(costs: Sequence[float], weights: Sequence[int]) -> list[float]:
    """`costs` (a batch's CPU-seconds at points of rising limit) made never to rise with the limit, as
    close to them as that allows (pool adjacent violators, each point weighted by its batches).

    Why: a quota never makes a batch cheaper, so a point that reads cheaper than one of a larger limit
    is noise or the host's speed moving between the two (on 1 Dec a fresh 2-core machine's MobileNetV2
    batches cost 0.22 CPU-s during calibration and 0.15-0.17 through the runs half an hour later; the
    eleven batches a run had at half a core came early, and the 1,600 at 0.2-0.3 cores, later, cost a
    quarter less). Pooled, the many batches decide; read apart, the few set the work and the many were
    clamped up to it."""
    blocks: list[list[float]] = []  # [weighted sum, weight, points]
    for c, w in zip(costs, weights, strict=True):
        blocks.append([c * w, float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s2, w2, n2 = blocks.pop()
            blocks[-1][0] += s2
            blocks[-1][1] += w2
            blocks[-1][2] += n2
    return [b[0] / b[1] for b in blocks for _ in range(int(b[2]))]


PROFILE_OFF = 0.25
"""A model's work per batch measured by a run more than this far (relative) from its profile's is
reported: the objectives and the forecast came from a profile that does not hold on this machine."""


def profiles_off(d: dict[str, Any]) -> list[str]:
    """Per model whose measured work per batch (any policy's run) is off its profile's by more than
    PROFILE_OFF: "model measured X-Y CPU-s a batch, its profile Z"; empty where none is or nothing was
    measured."""
    seen: dict[str, list[float]] = {}
    profile: dict[str, float] = {}
    for r in d.get("real", {}).values():
        mw = r.get("oracle_measured_work") or {}
        for m, w in (mw.get("work_cpu_s") or {}).items():
            ref = (mw.get("profile_work_cpu_s") or {}).get(m)
            if isinstance(ref, int | float) and ref > 0:
                seen.setdefault(m, []).append(float(w))
                profile[m] = float(ref)
    out = []
    for m, ws in sorted(seen.items()):
        if any(abs(w / profile[m] - 1) > PROFILE_OFF for w in ws):
            span = f"{min(ws):.3g}" if min(ws) == max(ws) else f"{min(ws):.3g}-{max(ws):.3g}"
            out.append(f"{m} measured {span} CPU-s a batch, its profile {profile[m]:.3g}")
    return out


def oracle_with_work(d: dict[str, Any], profiles: dict[str, ModelProfile], fitted: Mapping[str, ModelProfile],
                     sd: float | None, alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """The oracle on the run's node with each model's profile as a run measured it (`measured_work`):
    its noise-free bound (met / in band) and, with `sd`, the oracle under that noise (as
    `oracle_under_noise`, with these profiles)."""
    fitted = {m: f for m, f in fitted.items() if m in profiles}
    measured = {m: fitted.get(m, p) for m, p in profiles.items()}
    plan = plan_node(_oracle_items(d, measured, alpha), d["cores"])
    return {"work_cpu_s": {m: f.work_cpu_s for m, f in fitted.items()},
            "profile_work_cpu_s": {m: round(profiles[m].work_cpu_s, 4) for m in fitted},
            "efficiency": {m: [list(x) for x in f.efficiency] for m, f in fitted.items()},
            "profile_efficiency": {m: [list(x) for x in profiles[m].efficiency] for m in fitted},
            "met": plan.met_count, "in_band": plan.count,
            "under_noise": None if sd is None else oracle_under_noise(d, measured, sd, alpha)}


def add_noise_bounds(d: dict[str, Any], records: Mapping[str, Sequence[dict[str, Any]]],
                     profiles: dict[str, ModelProfile]) -> None:
    """Into each policy's summary that lacks them: the noise its run saw over the second half
    (`noise`), the oracle under that noise (`oracle_under_noise`), the same oracle with the work
    per batch the run measured (`oracle_measured_work`), and each container's second-half batches
    one by one (`second_half_batches`)."""
    for p, r in d["real"].items():
        if p not in records:
            continue
        try:
            if "noise" not in r:
                r["noise"] = measured_noise(records[p], d["duration_s"] / 2)
                if r["noise"] is not None:
                    r["oracle_under_noise"] = oracle_under_noise(d, profiles, r["noise"]["sd"])
            # Recomputed where an older summary has it: until 1 Dec it took a batch's CPU-seconds for
            # the work before any quota, and the oracle counted the quota twice (`measured_work`).
            work = None if "efficiency" in (r.get("oracle_measured_work") or {}) else measured_work(
                d, records[p], profiles)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ExperimentError(f"the record of {p} is not as `dqoes experiment real --out` writes it "
                                  f"({type(e).__name__}: {e})") from None
        if work:
            r["oracle_measured_work"] = oracle_with_work(d, profiles, work, (r.get("noise") or {}).get("sd"))
        if "second_half_batches" not in r:
            r["second_half_batches"] = batches_by_container(d, records[p], d["duration_s"] / 2)


def read_records(run_dir: str | Path, policies: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The JSON-lines records `--out` wrote, per policy label found in `run_dir`."""
    out = {}
    for p in policies:
        f = Path(run_dir) / f"{record_stem(p)}.jsonl"
        if f.is_file():
            try:
                out[p] = read_record(f)
            except ValueError as e:
                raise ExperimentError(f"--records: {e}") from None
    if not out:
        raise ExperimentError(f"--records {run_dir}: no record of {', '.join(policies)} there "
                              "(a directory written by `dqoes experiment real --out`)")
    return out


# -- rendering ---------------------------------------------------------------------------------


def met_final(r: dict[str, Any]) -> Any:
    """Met at the plateau, None where not recorded (records written before it had its name called it
    meets_final)."""
    return r.get("met_final", r.get("meets_final"))


def _met(r: dict[str, Any]) -> Any:
    met = met_final(r)
    return "-" if met is None else met


def _second_half(r: dict[str, Any], duration_s: float) -> str:
    """Met / in band, time-weighted over the run's second half: as summarize_real stored them, or, in
    a summary written before it stored them, from the recorded series."""
    half = (duration_s / 2, duration_s)
    met = (r["met_mean_second_half"] if "met_mean_second_half" in r
           else time_mean(r.get("met_series", r.get("meets_series", [])), *half))
    band = r["satisfied_mean_second_half"] if "satisfied_mean_second_half" in r else time_mean(r.get("series", []), *half)
    return " / ".join("-" if v is None else f"{v:.1f}" for v in (met, band))


def _under_noise(r: dict[str, Any]) -> str:
    o, n = r.get("oracle_under_noise"), r.get("noise")
    return "-" if not o or not n else f"{o['met']} / {o['in_band']} (σ {n['sd']:.2f})"


def _profiles_sentence(d: dict[str, Any]) -> str:
    """Where the profiles behind the objectives, the forecast and the bounds came from."""
    if d.get("profiles_measured"):
        when = (d.get("calibration") or {}).get("measured_at", "")
        return ("Profiles for the objectives, the forecast and the bounds: measured on this machine in the same "
                f"call, before the runs (`dqoes calibrate`{', ' + when if when else ''}; kept in the summary)")
    return f"Profiles for the forecast: `{d['profiles']}`"


QUOTA_COST_SHOWN = 0.02
"""A run's quota cost at a point is named beside its profile's where the two differ by this much (the
cost of a batch there by 2 %); every point is in the summary."""


def _quota_cost(mw: dict[str, Any], model: str) -> str:
    """", x1.06 under 0.5 cores (profile x1.38)" for each point of a model's quota curve that a run's
    batches moved off its profile's by QUOTA_COST_SHOWN or more; empty where none did or the summary
    has no curve."""
    got = dict(map(tuple, (mw.get("efficiency") or {}).get(model, [])))
    said = dict(map(tuple, (mw.get("profile_efficiency") or {}).get(model, [])))
    moved = [f"x{m:.3g} under {c:g} core{'' if c == 1 else 's'} (profile x{said[c]:.3g})" for c, m in got.items()
             if c in said and abs(m - said[c]) >= QUOTA_COST_SHOWN]
    return "" if not moved else ", " + ", ".join(moved)


def render_markdown(d: dict[str, Any], plot_rel: str | None, begin: str = BEGIN, end: str = END) -> str:
    cores = d["cores"]
    specs = d["containers"]
    runtime = d.get("runtime", "docker")
    what = (f"real inference containers (`{d['image']}`" if runtime == "docker"
            else "real inference processes in cgroups (the worker's cgroup runtime, no Docker")
    lines = [begin, ""]
    lines.append(f"Run {d['started_at']} with `{d['command']}`: {len(specs)} {what}, {d['batch']} images × "
                 f"{d['resolution_px']} px a batch, threads following each limit) on a node of "
                 f"{cores:g} cores, {d['duration_s']:.0f} s per policy, the same workloads and objectives under "
                 f"each. " + _profiles_sentence(d)
                 + ("; the forecast and the oracle run each workload's threads as it does, one a whole core of "
                    "limit, each doing the profile's one-thread work a second." if d.get("threads_follow") is True
                    else ".")
                 + (" The worker set each container's CPU weight from its limit as well as its quota (`--cpu-weights`)."
                    if d.get("cpu_weights") else ""))
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
    window = d["real"][next(iter(d["real"]))]["final_window_s"]
    lines.append(f"Three numbers per policy, each the plateau (lower median) over the final {window:.0f} s: "
                 f"**met** (latest batch at or under (1 + {ALPHA:g}) × objective), **in band** (|S|, within "
                 f"±{ALPHA:.0%}), and the **CPU spent** by our workloads (cores, from their cgroups). The "
                 "simulator ran the same node, workloads and objectives with the calibrated profiles; the "
                 "oracle bound is the most any steady allocation could keep met / in band there. "
                 "Beside them, met / in band averaged over the run's second half (time-weighted, from the "
                 "node states every 2 s): how much of the time those counts held, where the plateau of a "
                 "short window is one draw. The oracle bound knows no noise; real batches vary at a fixed "
                 "limit, so beside it is the oracle under the noise each run saw (σ: the pooled standard "
                 "deviation of log latency between batches at one unchanged limit, second half): the lower "
                 "median of its met / in band counts, the statistic the plateau reports.")
    lines.append("")
    lines.append("| policy | real: met | real: in band | real: CPU spent (cores) | real: met / in band, mean over "
                 "the second half | simulator: met / in band | oracle bound: met / in band | oracle under the run's "
                 "noise: met / in band (σ) | other processes' CPU, mean (cores) | load avg 1 min (min / median / max) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for p, r in d["real"].items():
        s = d["sim"].get(p, {})
        la = r["loadavg_1m"]
        la_s = "-" if not la else f"{la['min']:.2f} / {la['median']:.2f} / {la['max']:.2f}"
        oth = "-" if r.get("other_cores_mean") is None else f"{r['other_cores_mean']:.2f}"
        lines.append(f"| {p} | {_met(r)} | {r['satisfied_final']} | {r['total_cpu_cores_final']:.2f} | "
                     f"{_second_half(r, d['duration_s'])} | "
                     f"{_met(s)} / {s.get('satisfied_final', '-')} | {s.get('oracle_met', '-')} / "
                     f"{s.get('oracle_satisfied', '-')} | {_under_noise(r)} | {oth} | {la_s} |")
    lines.append("")
    measured = [(p, r["oracle_measured_work"]) for p, r in d["real"].items() if r.get("oracle_measured_work")]
    if measured:
        parts = []
        for p, mw in measured:
            calibrated = mw.get("profile_work_cpu_s", {})
            works = ", ".join(f"{m} {w:.3g} s" + (f" (profile {calibrated[m]:.3g})" if m in calibrated else "")
                              + _quota_cost(mw, m) for m, w in mw["work_cpu_s"].items())
            o = mw.get("under_noise")
            noisy = "" if not o else (f", under its noise {o['met']} / {o['in_band']} "
                                      f"({o['met_expected']:.2f} / {o['in_band_expected']:.2f} expected)")
            parts.append(f"{p}: {works}; bound {mw['met']} / {mw['in_band']}{noisy}")
        if all("efficiency" in mw for _, mw in measured):
            how = ("with each model's profile as each run's batches measured it (the CPU-seconds of a batch "
                   "under no quota, and the cost of a quota on top where it differs from the profile's, "
                   "from each batch and the limit it ran under; warm-ups and batches whose limit changed "
                   "left out)")
        else:  # a summary written before 1 Dec, read back without its records
            how = ("with the work per batch each run measured (the median CPU-seconds of a batch, warm-ups "
                   "left out)")
        lines.append(f"The oracle again, {how} in place of the profiles', met / in band: " + "; ".join(parts) + ".")
        lines.append("")
    per_batch = [(p, r["second_half_batches"]) for p, r in d["real"].items() if r.get("second_half_batches")]
    if per_batch:
        lines.append("Batch by batch over the second half (every batch each container finished then, warm-ups "
                     "left out): the share met, in band and faster than its band, the median latency over "
                     "the objective, and how many batches:")
        lines.append("")
        lines.append("| container | objective (s) | " + " | ".join(
            f"{p}: met / in band / faster / median ÷ objective (batches)" for p, _ in per_batch) + " |")
        lines.append("|---|---|" + "---|" * len(per_batch))
        for c in specs:
            cells = []
            for _, b in per_batch:
                x = b.get(c["name"])
                cells.append("-" if x is None else f"{x['met']:.0%} / {x['in_band']:.0%} / {x['faster']:.0%} / "
                                                   f"{x['median_to_objective']:.2f} ({x['batches']})")
            lines.append(f"| {c['name']} | {c['objective_s']:g} | " + " | ".join(cells) + " |")
        lines.append("")
    if off := profiles_off(d):
        lines.append(f"The profiles do not hold on this machine ({'; '.join(off)}): the objectives and the "
                     "simulator's forecast came from them. `dqoes calibrate` measures them again "
                     "(docs/guide/calibration.md).")
        lines.append("")
    lines.append("Final CPU split (cores, mean over the final window; real from each workload's cgroup, "
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
        lines += [f"![containers in band over time and the final CPU split]({plot_rel})", ""]
    lines.append(end)
    return "\n".join(lines)


def real_figure(d: dict[str, Any]) -> Any:
    """|S| over time, real and simulated, per policy, and the final CPU split: the dashboard's figures."""
    series = []
    for p, r in d["real"].items():
        series += [{"t_s": t, "count": n, "run": f"{p} real"} for t, n in r["series"]]
    for p, s in d["sim"].items():
        series += [{"t_s": t, "count": n, "run": f"{p} simulated"} for t, n in s["series"]]
    split = []
    for c in d["containers"]:
        label = f"{c['name']} ({c['objective_s']:g} s)"
        for p, r in d["real"].items():
            split.append({"container": label, "run": f"{p} real", "cpu_cores": r["final"][c["name"]]["cpu_cores"] or 0.0})
        for p, s in d["sim"].items():
            split.append({"container": label, "run": f"{p} simulated",
                          "cpu_cores": s["final"][c["name"]]["cpu_cores"] or 0.0})
    n = len(d["containers"])
    from dashboard import views  # figures need altair: imported only to draw

    return views.runs_figure(
        pd.DataFrame(series), pd.DataFrame(split),
        title=f"dqoes experiment real: {n} containers on {d['cores']:g} cores (simulated: the forecast)",
        count_title="containers in band |S|", count_max=n,
    )


# -- the command -------------------------------------------------------------------------------


def load_profiles(path: str | None) -> tuple[dict[str, ModelProfile], str]:
    p = path or os.environ.get("DQOES_PROFILES") or (str(DEFAULT_PROFILES) if DEFAULT_PROFILES.exists() else None)
    if p is None:
        return dict(BUILTIN_PROFILES), "built-in"
    try:
        loaded = load_profiles_file(p)
    except ScenarioError as e:
        raise ExperimentError(str(e)) from None
    shown = DEFAULT_PROFILES_NAME if Path(p).resolve() == DEFAULT_PROFILES.resolve() else p
    return {**BUILTIN_PROFILES, **loaded}, shown


def batch_profiles(profiles: Mapping[str, ModelProfile], images: int, resolution_px: int) -> dict[str, ModelProfile]:
    """Every profile for the run's batches (`images` of `resolution_px`): what the containers run is
    what the forecast, the objectives and the bounds are worked out from."""
    return {m: at_batch(p, images, resolution_px) for m, p in profiles.items()}


def profiles_named(shown: str) -> dict[str, ModelProfile]:
    """The profiles a summary names (as load_profiles showed them: "built-in", the packaged default by its
    name, or a path)."""
    if shown == "built-in":
        return dict(BUILTIN_PROFILES)
    if shown in (DEFAULT_PROFILES_NAME, *OLD_DEFAULT_PROFILES_NAMES):
        return load_profiles(str(DEFAULT_PROFILES))[0]
    return load_profiles(shown)[0]


def summary_profiles(d: dict[str, Any]) -> dict[str, ModelProfile]:
    """The profiles a summary's objectives, forecast and bounds came from: those its run measured
    (`--calibrate`, kept in the summary itself, so that it reads back wherever it is copied), else the
    file it names."""
    measured = d.get("profiles_measured")
    if measured:
        try:
            return {**BUILTIN_PROFILES, **parse_profiles({"models": measured}, "profiles_measured: ")}
        except ScenarioError as e:
            raise ExperimentError(str(e)) from None
    return profiles_named(d["profiles"])


def calibrate_here(opts: RealOptions, models: Sequence[str], out_dir: Path) -> tuple[dict[str, Any], Path]:
    """`--calibrate`: this machine's profiles for the run's models at its batches (`dqoes calibrate`,
    one model and one limit at a time, before any policy runs), written to OUT/profiles.toml.

    Why: the objectives (fastest-alone x a factor), the forecast and the bounds are worked out from the
    profiles; profiles measured on another day or machine make them what the experiment does not mean
    (on this machine's Docker node of 29 Nov 2026 a ResNet-50 batch took 1.42-1.45 CPU-s where its
    profile of that month said 1.16). Returns the fitted models (as a profiles file has them) and the file."""
    base = opts.calibration or CalibrationOptions()
    path = out_dir / "profiles.toml"
    # Containers of the workload image run under jemalloc: measured without it, a profile does not hold
    # there. The cgroup runtime's workloads run on this host, under what the calibration runs under.
    cal = dataclasses.replace(base, models=",".join(dict.fromkeys(models)), batch_size=opts.batch_size,
                              resolution=opts.resolution, out=str(path), from_file=None, plot=None, update=None,
                              require_jemalloc=base.require_jemalloc or opts.runtime == "docker")
    parse_models(cal.models)  # an unknown model is refused before anything is said or measured
    _log(f"calibrating {cal.models} at {cal.batch_size} x {cal.resolution} px before the runs "
         f"(`dqoes calibrate`, limits {cal.limits} cores)")
    res = calibrate(cal, _log)
    return {"models": res.summary["models"], "calibration": res.summary["calibration"]}, path


@dataclass(frozen=True, slots=True)
class RealOptions:
    """What `dqoes experiment real` runs and where it writes (the flags, as data)."""

    containers: int = 5
    duration_s: float = 600.0
    policies: str = "dqoes,default,learned"
    runtime: str = "docker"
    """docker: containers of the workload image; cgroup: inference processes in cgroups (no Docker)."""
    section: str = ""
    """Which generated section of the Markdown file to replace ("" the default one; a name: another)."""
    models: str = "resnet50,mobilenetv2"
    objectives: str | None = None
    batch_size: int = 10
    resolution: int = 224
    cores: float | None = None
    profiles: str | None = None
    image: str = "dqoes-workload:latest"
    seed: int = 1
    sample_s: float = 5.0
    out: str | None = None
    from_file: str | None = None
    """Run nothing: report from a summary.json written earlier."""
    records: str | None = None
    """With from_file: the run's records directory, for what the summary lacks (the measured noise)."""
    plot: str | None = None
    update: str | None = None
    cpu_weights: bool = True
    """The worker sets each container's CPU weight from its limit as well as its quota (its default)."""
    calibrate: bool = False
    """Measure this machine's profiles for the run's models first (`calibrate_here`) and work the objectives,
    the forecast and the bounds out from them, in place of a profiles file."""
    calibration: CalibrationOptions | None = None
    """With `calibrate`: what to measure (limits, batches, warm-up, threads); None: `dqoes calibrate`'s
    defaults. Its models, batch size and resolution are always the run's."""


@dataclass(frozen=True, slots=True)
class RealResult:
    summary: dict[str, Any]
    markdown: str


def run(opts: RealOptions) -> RealResult:
    """Run (or read back) the experiment; write the plot and the docs section `opts` asks for."""
    begin, end = markers(opts.section)
    rel = None
    if opts.plot and opts.update:
        rel = os.path.relpath(Path(opts.plot).resolve(), Path(opts.update).resolve().parent)
    if opts.from_file and opts.calibrate:
        raise ExperimentError("--calibrate: only for a run (--from reads one back, with the profiles it kept)")
    if opts.calibrate and opts.profiles:
        raise ExperimentError("--calibrate measures the profiles: give it or --profiles, not both")
    if opts.from_file:
        d, figure, md = _read_back(opts, rel, begin, end)
    elif opts.records:
        raise ExperimentError("--records: only with --from (a run records its own)")
    else:
        d = run_experiment(opts)
        figure = real_figure(d) if opts.plot else None
        md = render_markdown(d, rel, begin, end)
    if figure is not None and opts.plot:
        from dashboard import render

        render.save(figure, opts.plot)
        _log(f"plot written to {opts.plot}")
    if opts.update:
        update_section(Path(opts.update), md, begin, end)
        _log(f"section updated in {opts.update}")
    return RealResult(d, md)


def _read_back(opts: RealOptions, rel: str | None, begin: str, end: str) -> tuple[dict[str, Any], Any, str]:
    """A summary written earlier, completed from its records where asked, with its figure and section;
    a file that is not such a summary is an ExperimentError, before anything is written."""
    what = "a summary `dqoes experiment real` writes"
    if not opts.from_file:
        raise ExperimentError("--from: no summary file given")
    d = read_back_json(opts.from_file, what)
    with reading_back(opts.from_file, what):
        if opts.records:
            add_noise_bounds(d, read_records(opts.records, list(d["real"])),
                             batch_profiles(summary_profiles(d), d["batch"], d["resolution_px"]))
        d["profiles_off"] = profiles_off(d)  # records from before it was kept
        return d, real_figure(d) if opts.plot else None, render_markdown(d, rel, begin, end)


def markers(section: str) -> tuple[str, str]:
    """The generated-section markers: the default section, or a named one (several real setups)."""
    if not section:
        return BEGIN, END
    if not section.replace("-", "").isalnum():
        raise ExperimentError(f"--section: letters, digits and '-' only, got {section!r}")
    return (f"<!-- BEGIN generated: dqoes experiment real {section} -->",
            f"<!-- END generated: dqoes experiment real {section} -->")


def policy_runs(text: str) -> dict[str, tuple[str, dict[str, float]]]:
    """`--policies`: entries `POLICY[:NAME=VALUE...]`, comma-separated, each run under its own label
    (`learned,learned:half_life_s=0` runs the learned allocator with and without its second memory).
    ExperimentError for a policy that cannot run on real workloads, a bad setting or a repeat."""
    usable = [n for n in registry.names() if not registry.spec(n).needs_curves]
    out: dict[str, tuple[str, dict[str, float]]] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        policy, settings = checked_entry(entry, usable, "cannot run on real workloads", "--policies: ")
        label = policy_entry(policy, settings)
        if label in out:
            raise ExperimentError(f"--policies: {label} is named twice")
        out[label] = (policy, settings)
    if not out:
        raise ExperimentError("--policies: name at least one policy")
    return out


def run_experiment(opts: RealOptions) -> dict[str, Any]:
    if opts.containers < 1:
        raise ExperimentError("--containers must be >= 1")
    if opts.duration_s < 30:
        raise ExperimentError("--duration-s must be >= 30")
    runs = policy_runs(opts.policies)
    policies = list(runs)
    if opts.runtime not in ("docker", "cgroup"):
        raise ExperimentError(f"--runtime: docker or cgroup, got {opts.runtime!r}")
    if os.geteuid() != 0:
        raise ExperimentError("experiment real needs root (it reads the workloads' cgroups)")
    if opts.runtime == "docker":
        if shutil.which("docker") is None:
            raise ExperimentError("the docker command is not installed")
        if _docker("images", "-q", opts.image, check=False) == "":
            raise ExperimentError(f"image {opts.image} not found (build it with compose/images/build.sh)")
    models = [m.strip() for m in opts.models.split(",") if m.strip()]
    if not models:
        raise ExperimentError("--models: name at least one model")
    out_dir = Path(opts.out or f"runs/real-{time.strftime('%Y%m%d-%H%M%S')}")
    measured = None
    if opts.calibrate:
        out_dir.mkdir(parents=True, exist_ok=True)
        measured, path = calibrate_here(opts, models, out_dir)
        profiles, profiles_name = load_profiles(str(path))
    else:
        profiles, profiles_name = load_profiles(opts.profiles)
    for m in models:
        if m not in profiles:
            raise ExperimentError(f"--models: no profile for {m!r}")
        prof = profiles[m]
        if (prof.batch_images, prof.resolution_px) != (opts.batch_size, opts.resolution):
            _log(f"profile {m} was measured at {prof.batch_images} x {prof.resolution_px} px, the containers run "
                 f"{opts.batch_size} x {opts.resolution} px: its work per batch scaled by images and pixels")
    profiles = batch_profiles(profiles, opts.batch_size, opts.resolution)
    objectives = None
    if opts.objectives:
        try:
            objectives = [float(x) for x in opts.objectives.split(",")]
        except ValueError:
            raise ExperimentError(f"--objectives: expected numbers, got {opts.objectives!r}") from None
        if any(o <= 0 for o in objectives):
            raise ExperimentError("--objectives: each must be > 0")
    cores = opts.cores or float(os.cpu_count() or 1)
    specs = plan_containers(opts.containers, models, profiles, cores, objectives)
    prefix = f"dqx-{uuid.uuid4().hex[:6]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    _log(f"prefix {prefix}; {len(specs)} containers on {cores:g} cores; profiles {profiles_name}; records in {out_dir}")
    for c in specs:
        _log(f"  {c.name}: {c.model}, objective {c.objective_s:g} s "
             f"(fastest alone {profiles[c.model].with_threads(1).fastest_s(cores):.2f} s)")

    # The workloads follow their limits; the forecast and the bounds model them so.
    sc = sim_scenario(specs, profiles, cores, opts.duration_s, follows=True)
    sim = {p: forecast(dataclasses.replace(sc, settings={**sc.settings, **settings}), policy, opts.seed)
           for p, (policy, settings) in runs.items()}
    for p, s in sim.items():
        _log(f"simulator: {p} met {s['met_final']}, in band {s['satisfied_final']} "
             f"(oracle bound {s['oracle_met']} / {s['oracle_satisfied']})")

    real: dict[str, Any] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    interrupted = False
    for p in policies:
        run = RealRun(prefix, runs[p][0], specs, cores=cores, image=opts.image, batch=opts.batch_size,
                      resolution_px=opts.resolution, run_dir=out_dir / record_stem(p), runtime=opts.runtime,
                      settings=runs[p][1], cpu_weights=opts.cpu_weights)
        try:
            run.start()
            _log(f"{p}: {len(specs)} containers started")
            asyncio.run(run.observe(opts.duration_s, opts.sample_s, _log))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            run.stop()
        rows = ([{"kind": "state", **row} for row in run.states] + [{"kind": "cpu", **row} for row in run.cpu_samples]
                + [{"kind": "decision", **row} for row in run.decisions]
                + [{"kind": "batch", **row} for row in run.batches])
        with (out_dir / f"{record_stem(p)}.jsonl").open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        if interrupted:
            raise KeyboardInterrupt
        real[p] = summarize_real(run, opts.duration_s)
        records[p] = rows  # what the file holds: the noise is measured from the same rows
        _log(f"{p}: met {real[p]['met_final']}, in band {real[p]['satisfied_final']}, "
             f"CPU {real[p]['total_cpu_cores_final']:.2f} cores at the plateau")
    d = {
        "command": command_line(opts),
        "runtime": opts.runtime,
        "cpu_weights": opts.cpu_weights,
        "started_at": started_at,
        "prefix": prefix,
        "image": opts.image,
        "cores": cores,
        "batch": opts.batch_size,
        "resolution_px": opts.resolution,
        "duration_s": opts.duration_s,
        "profiles": profiles_name,
        **({"profiles_measured": measured["models"], "calibration": measured["calibration"]} if measured else {}),
        "threads_follow": True,
        "containers": [{"name": c.name, "model": c.model, "objective_s": c.objective_s,
                        "fastest_s": round(profiles[c.model].with_threads(1).fastest_s(cores), 3)} for c in specs],
        "real": real,
        "sim": sim,
    }
    add_noise_bounds(d, records, profiles)
    d["profiles_off"] = profiles_off(d)
    for line in d["profiles_off"]:
        _log(f"warning: {line}, off by more than {PROFILE_OFF:.0%}; `dqoes calibrate` measures it again "
             "(`--calibrate` does, before the runs)")
    (out_dir / "summary.json").write_text(json.dumps(d, indent=1))
    _log(f"summary written to {out_dir / 'summary.json'}")
    return d


def command_line(opts: RealOptions) -> str:
    parts = ["dqoes experiment real", f"--runtime {opts.runtime}", f"--policies {opts.policies}",
             f"--containers {opts.containers}", f"--duration-s {opts.duration_s:g}",
             f"--models {opts.models}", f"--batch-size {opts.batch_size}", f"--resolution {opts.resolution}"]
    if opts.objectives:
        parts.append(f"--objectives {opts.objectives}")
    if not opts.cpu_weights:
        parts.append("--no-cpu-weights")
    if opts.calibrate:
        parts.append("--calibrate")
    return " ".join(parts)
