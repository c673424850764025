"""`python -m lab serving-real`: three model servers on one real node, governed by their own request latency.

Why: the serving mode, the load generator, MLServer and the `prometheus` latency source each have
their own tests; this puts them together the way an operator would (issue 65): model servers
co-located on this machine under the cgroup runtime, each driven by its own open-loop load at a
steady rate, each with a p95 objective, and a worker governing them by the p95 it scrapes from each
server's metrics page. One run per policy (default, dqoes, learned), fresh servers and worker each
time. Per policy it records, per server, the p95 the clients measured in each window beside the one
the worker read, whether the objective was met window by window and at the plateau (last third),
the CPU each server spent and the limits the worker set.

How the load and the objectives are chosen, before any policy runs (a calibration, under default):
each server alone at a low rate gives its CPU seconds a request; its rate is then the one that
needs a fixed fraction of the node's cores (SHARES); the three together at those rates, without
limits, give each server's p95 at the kernel's fair share. The first server's objective is
TIGHT x that p95 (default misses it by construction), the others' LOOSE x theirs (room to give).
Whether a better split meets all three is what the policy runs find out. Needs root (cgroups),
torch, and for an MLServer server the `serving` extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.common import ExperimentError, PrivateNats, busy_cores_s, cpu_model
from shared import auth
from shared.core.policy import BaseParams
from shared.core.types import is_met
from shared.ports import free_port
from shared.runtime import cgroupfs

REPO = Path(__file__).resolve().parents[1]
NODE = "node-1"
SERVERS = "serve:resnet50:64,serve:mobilenetv2:96,mlserver:mobilenetv2:64"
"""kind:model:resolution_px per server, the first being the one with the tight objective."""
SHARES = (0.25, 0.15, 0.1)
"""Fraction of the node's cores each server's load needs at its calibrated cost (half in all: the machine is shared)."""
TIGHT, LOOSE = 0.7, 2.0
"""Objective = factor x the server's p95 at the fair share (calibration): the first server, the others."""
POLICIES = ("default", "dqoes", "learned")
ALPHA = BaseParams().alpha
"""The band every policy runs with here (the default): met, as the project counts it, is a p95 at or
under (1 + ALPHA) x the objective; the table shows that beside the p95 at or under the objective itself."""
PROJECT_METRIC = "dqoes_inference_request_duration_seconds"
MLSERVER_METRIC = "rest_server_request_duration_seconds"


@dataclass(frozen=True, slots=True)
class Server:
    name: str
    kind: str  # serve or mlserver
    model: str
    resolution_px: int


@dataclass(frozen=True, slots=True)
class Options:
    servers: str = SERVERS
    policies: str = ",".join(POLICIES)
    cores: float = 1.5
    duration_s: float = 600.0
    window_s: float = 10.0
    calibrate_s: float = 30.0
    out: str | None = None


def parse_servers(text: str) -> list[Server]:
    out = []
    for i, part in enumerate(p.strip() for p in text.split(",") if p.strip()):
        bits = part.split(":")
        if len(bits) != 3 or bits[0] not in ("serve", "mlserver") or not bits[2].isdigit():
            raise ExperimentError(f"--servers: {part!r} is not serve|mlserver:MODEL:RESOLUTION_PX")
        out.append(Server(f"s{i + 1}-{bits[1]}", bits[0], bits[1], int(bits[2])))
    if len(out) != len(SHARES):
        raise ExperimentError(f"--servers: exactly {len(SHARES)} servers (the first gets the tight objective)")
    return out


def _post(req: urllib.request.Request) -> None:
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()


class Stack:
    """A private NATS, one in-process worker (cgroup runtime, the node capped at `cores`) and the servers."""

    def __init__(self, policy: str, objectives: dict[Server, float | None], opts: Options, run_dir: Path) -> None:
        self.policy, self.objectives, self.opts, self.run_dir = policy, objectives, opts, run_dir
        self.urls: dict[str, str] = {}
        self.bodies: dict[str, bytes] = {}

    async def __aenter__(self) -> Stack:
        from services.worker.app import WorkerConfig, build, serve

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.nats = PrivateNats([NODE], self.run_dir / "nats-server.log")
        self.nats.start()
        try:
            self.app = await build(WorkerConfig(
                node=NODE, nats_url=self.nats.url_as(auth.identity_name("worker", NODE)), runtime="cgroup", cores=self.opts.cores,
                policy=self.policy, state_interval_s=1.0, training_policy="none"))
            self.serving = asyncio.create_task(serve(self.app, handle_signals=False))
            # The whole node gets `cores`, whatever the policy: a quota on the runtime's parent group.
            parent = cgroupfs.group_at(cgroupfs.DEFAULT_ROOT, f"dqoes-{NODE}")
            for _ in range(100):
                if cgroupfs.exists(parent):
                    break
                await asyncio.sleep(0.1)
            cgroupfs.write_quota_cores(parent, self.opts.cores)
            for s, objective_s in self.objectives.items():
                await self._start(s, objective_s)
            await self._ready()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def _start(self, s: Server, objective_s: float | None) -> None:
        port = free_port()
        labels = {"dqoes.latency.source": "prometheus", "dqoes.latency.window_s": f"{self.opts.window_s:g}"}
        if s.kind == "serve":
            argv = [sys.executable, "-m", "services.inference", "--serve", f"127.0.0.1:{port}", "--model", s.model,
                    "--resolution", str(s.resolution_px), "--batch", "4", "--max-wait", "0.005", "--threads", "1"]
            env = {"PYTHONPATH": str(REPO)}
            labels |= {"dqoes.latency.port": str(port), "dqoes.latency.metric": PROJECT_METRIC}
            self.urls[s.name] = f"http://127.0.0.1:{port}/predict"
            self.bodies[s.name] = b'{"images": 1}'
        else:
            repo = self.run_dir / f"models-{s.name}"
            shutil.copytree(REPO / "compose" / "mlserver", repo, dirs_exist_ok=True)
            settings_file = repo / "resnet50" / "model-settings.json"
            settings = json.loads(settings_file.read_text())
            settings["name"] = s.model
            settings["parameters"]["extra"] = {"model": s.model, "resolution_px": s.resolution_px, "threads": 1}
            settings_file.write_text(json.dumps(settings))
            metrics, grpc = free_port(), free_port()
            metrics_dir = Path(tempfile.mkdtemp(prefix="mlserver-metrics-", dir=self.run_dir))
            env = {"PYTHONPATH": str(REPO), "MLSERVER_HTTP_PORT": str(port), "MLSERVER_GRPC_PORT": str(grpc),
                   "MLSERVER_METRICS_PORT": str(metrics), "MLSERVER_METRICS_DIR": str(metrics_dir),
                   "MLSERVER_HOST": "127.0.0.1"}
            infer = f"/v2/models/{s.model}/infer"
            labels |= {"dqoes.latency.port": str(metrics), "dqoes.latency.metric": MLSERVER_METRIC,
                       "dqoes.latency.match": "path=/v2/models/{model_name}/infer"}
            exe = shutil.which("mlserver", path=str(Path(sys.executable).parent))
            if exe is None:
                raise ExperimentError("an mlserver server needs the serving extra (pip install -e '.[serving]')")
            argv = [exe, "start", str(repo)]
            self.urls[s.name] = f"http://127.0.0.1:{port}{infer}"
            self.bodies[s.name] = b'{"inputs":[{"name":"images","shape":[1],"datatype":"INT32","data":[1]}]}'
        # exec: the server itself is the cgroup's process; its output goes to its log, not the lab's stdout
        log_path = self.run_dir / f"{s.name}.log"
        argv = ["/bin/sh", "-c", 'exec "$@" >>"$0" 2>&1', str(log_path), *argv]
        await self.app.runtime.spawn(s.name, argv, env=env, objective_s=objective_s,  # type: ignore[attr-defined]
                                     model=s.model, labels=labels)

    async def _ready(self) -> None:
        """Every server answers a request (the model loaded, warmed up once)."""
        pending = set(self.urls)
        t_end = time.monotonic() + 120
        while pending:
            for name in list(pending):
                try:
                    req = urllib.request.Request(self.urls[name], data=self.bodies[name],
                                                 headers={"Content-Type": "application/json"})
                    await asyncio.to_thread(_post, req)
                    pending.discard(name)
                except OSError:
                    pass
            if time.monotonic() > t_end:
                raise ExperimentError(f"{self.policy}: servers not answering after 120 s: {sorted(pending)} "
                                      f"(logs: {self.run_dir})")
            await asyncio.sleep(0.5)

    async def __aexit__(self, *exc: object) -> None:
        app = getattr(self, "app", None)
        if app is not None:
            app.worker.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.serving, 60)
        self.nats.close()

    async def cpu_s(self) -> dict[str, float]:
        return dict(await self.app.runtime.cpu_totals_s())


async def loadgen(url: str, body: bytes, rate_rps: float, windows: int, window_s: float, seed: int,
                  log_path: Path) -> list[dict[str, Any]]:
    """One open-loop client (`python -m lab loadgen`, a process of its own, outside the node): its windows."""
    rates = ",".join([f"{rate_rps:.4g}"] * windows)
    with log_path.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lab", "loadgen", "--url", url, "--body", body.decode(), "--rates", rates,
            "--step-s", f"{window_s:g}", "--seed", str(seed), "--progress-s", "60", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=err, cwd=REPO)
        out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise ExperimentError(f"loadgen for {url} failed (exit {proc.returncode}; log {log_path})")
    return list(json.loads(out.decode().strip().splitlines()[-1])["windows"])


async def drive(stack: Stack, rates: dict[str, float], duration_s: float, log: Callable[[str], None],
                tag: str) -> dict[str, Any]:
    """Load every server at its rate for `duration_s`; the clients' windows, the worker's readings
    and limits, and the CPU each server spent."""
    opts = stack.opts
    windows = max(1, round(duration_s / opts.window_s))
    poller, worker = stack.app.poller, stack.app.worker
    assert poller is not None
    readings: dict[str, list[list[float]]] = {n: [] for n in rates}
    limits: dict[str, list[list[float | None]]] = {n: [] for n in rates}
    cpu0, busy0, t0 = await stack.cpu_s(), busy_cores_s(), time.monotonic()
    clients = [asyncio.create_task(loadgen(stack.urls[n], stack.bodies[n], r, windows, opts.window_s, i,
                                           stack.run_dir / f"loadgen-{n}.log"))
               for i, (n, r) in enumerate(rates.items())]
    seen: dict[str, object] = {}
    next_line = t0 + 60
    while not all(c.done() for c in clients):
        await asyncio.sleep(0.25)
        now = time.monotonic() - t0
        for n in rates:
            st = poller.status.get(n)
            if st is not None and st is not seen.get(n):
                seen[n] = st
                if st.latency_s is not None and st.state in ("ok", "reset"):
                    readings[n].append([round(now, 2), st.latency_s])
                c = worker.ctrl.containers.get(n)
                limits[n].append([round(now, 2), None if c is None else c.limit])
        if time.monotonic() >= next_line:
            next_line += 60
            parts = []
            for n in rates:
                last = readings[n][-1][1] if readings[n] else None
                lim = limits[n][-1][1] if limits[n] else None
                parts.append(f"{n} p95 {'-' if last is None else f'{last * 1000:.0f} ms'} "
                             f"limit {'-' if lim is None else f'{lim:.2f}'}")
            log(f"  {tag}: {now:.0f}/{duration_s:.0f} s: " + "; ".join(parts))
    wall = time.monotonic() - t0
    cpu1, busy = await stack.cpu_s(), busy_cores_s() - busy0
    results = [c.result() for c in clients]
    return {"windows": {n: w for n, w in zip(rates, results, strict=True)}, "readings": readings,
            "limits": limits, "wall_s": round(wall, 1),
            "cpu_cores": {n: round((cpu1.get(n, 0.0) - cpu0.get(n, 0.0)) / wall, 3) for n in rates},
            "machine_busy_cores": round(busy / wall, 2)}


async def calibrate(servers: list[Server], opts: Options, run_dir: Path,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """Each server's CPU a request (alone, 1 request/s), its rate (SHARES of the node), its p95 alone at
    that rate (the node to itself: the best any split of the node can give it), its p95 with all three
    at those rates under default (the kernel's fair share), and the objectives from the last."""
    async with Stack("default", dict.fromkeys(servers), opts, run_dir / "calibration") as stack:
        cost: dict[str, float] = {}
        for s in servers:
            d = await drive(stack, {s.name: 1.0}, opts.calibrate_s / 2, log, f"calibration {s.name} alone")
            answered = sum(w["answered"] for w in d["windows"][s.name])
            cost[s.name] = d["cpu_cores"][s.name] * d["wall_s"] / max(1, answered)
            log(f"calibration: {s.name} {cost[s.name] * 1000:.1f} ms CPU a request ({answered} requests)")
        rates = {s.name: round(share * opts.cores / cost[s.name], 2) for s, share in zip(servers, SHARES, strict=True)}
        alone_p95: dict[str, float | None] = {}
        for s in servers:
            d = await drive(stack, {s.name: rates[s.name]}, opts.calibrate_s / 2, log,
                            f"calibration {s.name} alone at its rate")
            alone_p95[s.name] = _median([w["p95_s"] for w in d["windows"][s.name] if w["p95_s"] is not None])
        d = await drive(stack, rates, opts.calibrate_s, log, "calibration together")
    fair_p95 = {n: statistics.median(w["p95_s"] for w in ws if w["p95_s"] is not None)
                for n, ws in d["windows"].items()}
    objectives = {s.name: round((TIGHT if i == 0 else LOOSE) * fair_p95[s.name], 4) for i, s in enumerate(servers)}
    for s in servers:
        alone = alone_p95[s.name]
        log(f"calibration: {s.name} {rates[s.name]:g} requests/s, p95 alone "
            f"{'-' if alone is None else f'{alone * 1000:.0f} ms'}, at fair share "
            f"{fair_p95[s.name] * 1000:.0f} ms -> objective {objectives[s.name] * 1000:.0f} ms")
    return {"cost_cpu_s": cost, "rates_rps": rates, "alone_p95_s": alone_p95, "fair_p95_s": fair_p95,
            "objectives_s": objectives,
            "cpu_cores": d["cpu_cores"], "machine_busy_cores": d["machine_busy_cores"]}


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(policy: str, d: dict[str, Any], objectives: dict[str, float], rates: dict[str, float],
              duration_s: float) -> dict[str, Any]:
    servers = []
    plateau_from_s = duration_s * 2 / 3
    for n, ws in d["windows"].items():
        p95s = [w["p95_s"] for w in ws]
        met = [p is not None and p <= objectives[n] for p in p95s]
        met_alpha = [is_met(objectives[n], p, ALPHA) for p in p95s]
        plateau = [p for p in p95s[len(p95s) * 2 // 3:] if p is not None]
        worker_plateau = [v for t, v in d["readings"][n] if t >= plateau_from_s]
        client, read = _median(plateau), _median(worker_plateau)
        servers.append({
            "name": n, "objective_s": objectives[n], "rate_rps": rates[n],
            "answered": sum(w["answered"] for w in ws), "errors": sum(w["errors"] for w in ws),
            "client_p95_s": p95s, "worker_p95_s": d["readings"][n], "limits": d["limits"][n],
            "windows_met": sum(met), "windows": len(met),
            "plateau_client_p95_s": client, "plateau_worker_p95_s": read,
            "plateau_met": client is not None and client <= objectives[n],
            "windows_met_alpha": sum(met_alpha), "plateau_met_alpha": is_met(objectives[n], client, ALPHA),
            "worker_over_client": None if not client or read is None else round(read / client, 3),
            "cpu_cores": d["cpu_cores"][n],
            "limit_end": d["limits"][n][-1][1] if d["limits"][n] else None})
    return {"policy": policy, "servers": servers, "met_plateau": sum(s["plateau_met"] for s in servers),
            "met_plateau_alpha": sum(s["plateau_met_alpha"] for s in servers),
            "windows_met_alpha": sum(s["windows_met_alpha"] for s in servers),
            "windows_met": sum(s["windows_met"] for s in servers),
            "windows": sum(s["windows"] for s in servers),
            "cpu_cores": round(sum(s["cpu_cores"] for s in servers), 3), "wall_s": d["wall_s"],
            "machine_busy_cores": d["machine_busy_cores"]}


async def experiment(opts: Options, log: Callable[[str], None]) -> dict[str, Any]:
    servers = parse_servers(opts.servers)
    policies = [p.strip() for p in opts.policies.split(",") if p.strip()]
    if not policies:
        raise ExperimentError("--policies: at least one")
    if os.geteuid() != 0:
        raise ExperimentError("needs root: the cgroup runtime creates cgroups")
    run_dir = Path(tempfile.mkdtemp(prefix="serving-real-"))
    log(f"serving-real: {len(servers)} servers on {opts.cores:g} cores, {opts.duration_s:g} s per policy; "
        f"logs in {run_dir}")
    cal = await calibrate(servers, opts, run_dir, log)
    runs = []
    for policy in policies:
        log(f"{policy}: starting")
        async with Stack(policy, {s: cal["objectives_s"][s.name] for s in servers}, opts, run_dir / policy) as stack:
            d = await drive(stack, cal["rates_rps"], opts.duration_s, log, policy)
        r = summarize(policy, d, cal["objectives_s"], cal["rates_rps"], opts.duration_s)
        runs.append(r)
        log(f"{policy}: met at the plateau {r['met_plateau']}/{len(servers)}, windows met "
            f"{r['windows_met']}/{r['windows']}, CPU {r['cpu_cores']:.2f} cores; worker/client p95 "
            + ", ".join(f"{s['name']} {s['worker_over_client']}" for s in r["servers"]))
    return {
        "command": "python -m lab serving-real " + " ".join(
            f"--{k} {v:g}" for k, v in (("cores", opts.cores), ("duration-s", opts.duration_s),
                                        ("calibrate-s", opts.calibrate_s))),
        "servers": [{"name": s.name, "kind": s.kind, "model": s.model, "resolution_px": s.resolution_px}
                    for s in servers],
        "cores": opts.cores, "duration_s": opts.duration_s, "window_s": opts.window_s,
        "calibrate_s": opts.calibrate_s, "shares": list(SHARES), "tight": TIGHT, "loose": LOOSE,
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model()},
        "calibration": cal, "runs": runs}
