"""FlowCon against default on real training processes on this machine: completion times and the CPU split.

Why: the simulator's numbers rest on its model; this runs the live system
end to end (private NATS, the manager, one worker with the cgroup runtime)
and submits real training jobs (`services/training`) through `dqoes.submit`
at fixed offsets, once under FlowCon (worker and manager) and once under
default (no limits, spread), and records from the bus what the worker saw:
every job's list, limit and CPU use after each training round, and when each
job finished. Completion time is from the submit request to the job's
`JobDone`, in wall seconds. Needs root (cgroups) and torch; the machine's
other load is measured and reported beside the results (busy cores that
are not ours).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from experiments.common import (
    ExperimentError,
    PrivateNats,
    busy_cores_s,
    read_back_json,
    reading_back,
    update_section,
)
from shared import auth, children, subjects
from shared.bus import Bus
from shared.schema import JobDone, NodeState, Progress, TrainingState

REPO = Path(__file__).resolve().parents[1]
BEGIN = "<!-- BEGIN generated: python -m lab training-real -->"
END = "<!-- END generated: python -m lab training-real -->"
NODE = "node-1"


@dataclass(frozen=True, slots=True)
class TrainingRealOptions:
    jobs: str = "vae:0:200,cnn:20:350,mlp:40:400"
    """model:submit offset (s):epochs, comma-separated (default: the paper's 3-job experiment, shorter)."""
    policies: str = "flowcon,default"
    cores: float | None = None
    """The node's cores (default: all of this machine's)."""
    threads: int = 2
    """Every job's intra-op threads, pinned so both policies run the same code."""
    interval_s: float = 2.0
    """FlowCon's initial interval (seconds)."""
    timeout_s: float = 400.0
    """Give up on a policy's run after this long."""
    repeat: int = 1
    """Run the policies in turn this many times (flowcon, default, flowcon, default, ...): the machine's
    other load moves from one run to the next, and a difference smaller than that between repeats is noise."""
    out: str | None = None
    from_file: str | None = None
    update: str | None = None


def parse_jobs(text: str) -> list[tuple[str, float, int]]:
    out = []
    for part in text.split(","):
        bits = part.strip().split(":")
        if len(bits) != 3:
            raise ExperimentError(f"--jobs: {part!r} is not model:offset_s:epochs")
        try:
            out.append((bits[0], float(bits[1]), int(bits[2])))
        except ValueError:
            raise ExperimentError(f"--jobs: {part!r}: offset must be seconds and epochs an integer") from None
    if len(out) < 1:
        raise ExperimentError("--jobs: at least one job")
    return out


class Stack:
    """NATS, the manager and one cgroup worker, for one policy."""

    def __init__(self, policy: str, cores: float, interval_s: float, run_dir: Path) -> None:
        self.policy, self.cores, self.interval_s, self.run_dir = policy, cores, interval_s, run_dir
        self.nats: PrivateNats | None = None
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, what: str, args: list[str], identity: str) -> None:
        assert self.nats is not None
        args = [*args, "--creds", str(self.nats.creds(identity))]
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with (self.run_dir / f"{what}.log").open("ab") as log:
            self.procs[what] = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True, cwd=REPO,
                                                preexec_fn=children.die_with_parent())

    def start(self) -> str:
        """Start the server, the manager and the worker; returns the URL the experiment connects with
        (as the `client` role: it submits jobs and reads states)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # Authentication and per-role permissions, as every deployment has them (common.py).
        self.nats = PrivateNats([NODE], self.run_dir / "nats-server.out")
        url = self.nats.start()
        self._spawn("manager", ["-m", "services.manager", "--nats", url, "--placement", self.policy,
                                "--store-creds", str(self.nats.creds("store"))], "manager")
        self._spawn("worker", ["-m", "services.worker", "--nats", url, "--node", NODE, "--runtime", "cgroup",
                               "--cores", f"{self.cores:g}", "--training-policy", self.policy,
                               "--interval", f"{self.interval_s:g}", "--state-interval", "1"],
                    auth.identity_name("worker", NODE))
        return self.nats.url_as("client")

    def stop(self) -> None:
        for what in ("worker", "manager"):
            p = self.procs.get(what)
            if p is not None and p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        if self.nats is not None:
            self.nats.close()


async def run_policy(policy: str, jobs: list[tuple[str, float, int]], opts: TrainingRealOptions, cores: float,
                     run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    stack = Stack(policy, cores, opts.interval_s, run_dir / policy)
    rows: list[dict[str, Any]] = []
    done: dict[str, float] = {}
    submitted: dict[str, float] = {}
    placed: dict[str, str] = {}
    alive = asyncio.Event()
    try:
        bus = await Bus.connect(stack.start(), "dqoes-experiment-training", connect_timeout_s=5.0)
    except BaseException:  # nothing it started is left running, nor its credentials
        stack.stop()
        raise
    t0 = time.time()
    busy0 = busy_cores_s()
    try:
        def on_training(ts: TrainingState, _: Any) -> None:
            for j in ts.jobs:
                rows.append({"t": round(time.time() - t0, 2), "job": j.job, "stage": j.stage, "limit": j.limit,
                             "cpu_cores": j.cpu_cores, "growth": j.growth, "value": j.value,
                             "training_share": ts.training_share, "alpha": ts.alpha,
                             "free": ts.free_competition})

        def on_progress(m: Progress | JobDone, _: Any) -> None:
            if isinstance(m, JobDone) and m.job not in done:
                done[m.job] = time.time()
                log(f"  {policy}: {m.job} done after {done[m.job] - submitted.get(m.job, t0):.1f} s")

        await bus.subscribe(subjects.TRAINING_ALL, on_training, expect=TrainingState)
        await bus.subscribe(subjects.PROGRESS_ALL, on_progress, expect=(Progress, JobDone))
        await bus.subscribe(subjects.STATE_ALL, lambda m, _: alive.set(), expect=NodeState)
        await asyncio.wait_for(alive.wait(), 30)
        await asyncio.sleep(1.5)  # the manager hears the worker too
        t0 = time.time()
        busy0 = busy_cores_s()
        for i, (model, offset_s, epochs) in enumerate(jobs):
            wait = t0 + offset_s - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            name = f"job-{i + 1}-{model}"
            body = {"model": model, "name": name, "epochs": epochs, "threads": opts.threads, "seed": i}
            reply = orjson.loads(await bus.request(subjects.SUBMIT, orjson.dumps(body), timeout_s=30.0))
            if not reply.get("ok"):
                raise ExperimentError(f"{policy}: submit {name} refused: {reply.get('error')}")
            submitted[name] = time.time()
            placed[name] = reply["node"]
            log(f"  {policy}: submitted {name} at {submitted[name] - t0:.1f} s -> {reply['node']}")
        while len(done) < len(jobs) and time.time() - t0 < opts.timeout_s:
            await asyncio.sleep(0.5)
        busy = busy_cores_s() - busy0
        wall = time.time() - t0
    finally:
        await bus.close()
        stack.stop()
    completion = {j: round(done[j] - submitted[j], 1) for j in submitted if j in done}
    return {
        "policy": policy, "completion_s": completion,
        "submitted_at_s": {j: round(t - t0, 1) for j, t in submitted.items()},
        "makespan_s": round(max(done.values()) - t0, 1) if done else None,
        "mean_completion_s": round(statistics.mean(completion.values()), 1) if completion else None,
        "finished": len(completion), "jobs": len(jobs), "wall_s": round(wall, 1),
        "machine_busy_cores": round(busy / wall, 2) if wall > 0 else None,
        "placement": placed, "rows": rows,
    }


def cpu_split(rows: list[dict[str, Any]], every_s: float = 10.0) -> list[dict[str, Any]]:
    """Each job's CPU (cores) and limit at the last training round before every `every_s` mark."""
    if not rows:
        return []
    end = max(r["t"] for r in rows)
    out = []
    mark = every_s
    while mark <= end + every_s:
        last: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["t"] <= mark:
                last[r["job"]] = r
        # only jobs still reported near the mark
        recent = {j: r for j, r in last.items() if mark - r["t"] <= 5.0}
        if recent:
            out.append({"t": mark, "jobs": {j: {"cpu_cores": r["cpu_cores"], "limit": r["limit"], "stage": r["stage"]}
                                            for j, r in sorted(recent.items())}})
        mark += every_s
    return out


def summarize(results: dict[str, Any], opts: TrainingRealOptions, cores: float) -> dict[str, Any]:
    return {"options": {k: v for k, v in asdict(opts).items() if k not in ("out", "from_file", "update")},
            "cores": cores, "cpu_count": os.cpu_count(),
            "policies": {p: {k: v for k, v in r.items() if k != "rows"} | {"cpu_split": cpu_split(r["rows"])}
                         for p, r in results.items()}}


def _cell(j: dict[str, Any] | None) -> str:
    if j is None:
        return "-"
    cpu = "?" if j["cpu_cores"] is None else f"{j['cpu_cores']:.2f}"
    lim = "none" if j["limit"] is None else f"{j['limit']:.2f}"
    stage = "" if j["stage"] in ("-", None) else f" {j['stage']}"
    return f"{cpu} / {lim}{stage}"


def render_markdown(s: dict[str, Any], command: str) -> str:
    pols = s["policies"]
    jobs = sorted({j for p in pols.values() for j in p["submitted_at_s"]})
    o = s["options"]
    lines = [BEGIN, "", f"Command: `{command}` (cgroup runtime, {s['cores']:g} cores, every job pinned to "
             f"{o['threads']} intra-op threads, FlowCon's initial interval {o['interval_s']:g} s).", ""]
    lines.append("| job | submitted at (s) | " + " | ".join(f"completion, {p} (s)" for p in pols) + " |")
    lines.append("|---|---|" + "---|" * len(pols))
    first = next(iter(pols.values()))
    for j in jobs:
        lines.append(f"| {j} | {first['submitted_at_s'].get(j, '-')} | "
                     + " | ".join(f"{p['completion_s'].get(j, 'did not finish')}" for p in pols.values()) + " |")
    lines.append("| **makespan** | | " + " | ".join(f"**{p['makespan_s']}**" for p in pols.values()) + " |")
    lines.append("| **mean completion** | | " + " | ".join(f"**{p['mean_completion_s']}**" for p in pols.values())
                 + " |")
    lines.append("| busy cores on the machine, all processes (mean over the run) | | "
                 + " | ".join(f"{max(0.0, (p['machine_busy_cores'] or 0)):.2f} of {s['cpu_count']}"
                              for p in pols.values()) + " |")
    lines.append("")
    lines.append("CPU split: each job's CPU use over the last training round / its limit (fraction of the node; "
                 "none: no limit) and FlowCon's list, every 10 s:")
    lines.append("")
    for name, p in pols.items():
        lines.append(f"| {name}, t (s) | " + " | ".join(jobs) + " |")
        lines.append("|---|" + "---|" * len(jobs))
        for row in p["cpu_split"]:
            lines.append(f"| {row['t']:.0f} | " + " | ".join(_cell(row["jobs"].get(j)) for j in jobs) + " |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def command_line(opts: TrainingRealOptions) -> str:
    return (f"python -m lab training-real --jobs {opts.jobs} --policies {opts.policies} --threads {opts.threads}"
            + (f" --repeat {opts.repeat}" if opts.repeat > 1 else "")
            + (f" --cores {opts.cores:g}" if opts.cores else "") + (f" --update {opts.update}" if opts.update else ""))


def run(opts: TrainingRealOptions, log: Callable[[str], None]) -> tuple[dict[str, Any], str]:
    if opts.from_file:
        s = read_back_json(opts.from_file, "a summary `python -m lab training-real` writes")
    else:
        if os.geteuid() != 0:
            raise ExperimentError("training-real needs root (it runs the jobs in cgroups)")
        jobs = parse_jobs(opts.jobs)
        policies = [p.strip() for p in opts.policies.split(",") if p.strip()]
        from shared.core import registry

        for p in policies:
            if p not in registry.names("training"):
                raise ExperimentError(f"--policies: unknown training policy {p!r}")
        cores = float(opts.cores or os.cpu_count() or 1)
        run_dir = Path(opts.out or REPO / "runs" / f"training-real-{time.strftime('%Y%m%d-%H%M%S')}")
        results = {}
        for r in range(max(1, opts.repeat)):
            for p in policies:
                label = p if opts.repeat <= 1 else f"{p} #{r + 1}"
                log(f"{label}: starting")
                results[label] = asyncio.run(run_policy(p, jobs, opts, cores, run_dir / f"run{r + 1}", log))
                (run_dir / f"run{r + 1}" / f"{p}-rounds.json").write_text(json.dumps(results[label]["rows"]))
        s = summarize(results, opts, cores)
        s["command"] = command_line(opts)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps(s, indent=1))
        log(f"records in {run_dir}")
    with reading_back(opts.from_file, "a summary `python -m lab training-real` writes"):
        md = render_markdown(s, s.get("command") or command_line(opts))
    if opts.update:
        update_section(Path(opts.update), md, BEGIN, END)
    return s, md
