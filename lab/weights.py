"""Should CPU weights complement CPU quotas? Managed groups beside a greedy unmanaged neighbour.

Why: DQoES sets a quota per managed container and its quotas never sum past
the node, so among managed containers alone each gets its quota. A process
it does not manage (no project label, never touched) can still want every
core; CFS then shares contended CPU between runnable sibling groups by
weight (cpu.shares on v1, cpu.weight on v2), all equal by default, and a
managed group may get less than its quota. This experiment measures how much
less, and whether weights set from the limits give it back:

(a) alone: the managed groups only, default weights (what the quotas deliver);
(b) neighbour: plus one unmanaged group running one busy process per core,
    no quota, default weights everywhere;
(c) weighted: the same neighbour; each managed group's weight set to the
    kernel's maximum x (limit cores / node cores), clamped to the valid range,
    the neighbour left at the default;
(d) parent (only when asked): as (c), and the managed groups' parent group
    weighted the same way from the sum of their limits;
(e) alone-weighted (only when asked): as (a), with (c)'s weights. Quotas that
    sum to the node are not all delivered even with no neighbour: within a
    CFS period, runnable groups share the CPUs by weight until each has used
    its quota, so with equal weights a group with a large quota is still
    running when the others are throttled and may run out of period first.

CFS shares by weight between siblings only, so where the neighbour sits
matters: `--neighbour-at sibling` (default) puts it beside the managed groups
under the run's parent group, as another container under Docker's docker/
group would be; `--neighbour-at root` puts it beside that parent, as a host
process or systemd service outside docker/ would be, where only the parent's
weight (d) can count.

Everything runs on this host as root, as plain processes in cgroups under
one parent group made for the run (no Docker): the managed groups run the
real inference workload (`python -m services.inference.run`, the container's
own batch loop, threads following the quota) or, with `--workload spin`, one
pure-Python busy loop per started core of quota. Per managed group it
reports the quota, the cores received (the group's CPU counter over the
measured window), the share of CFS periods throttled, the median batch
latency and received / quota; per condition the neighbour's cores and the
other processes' on the machine (from /proc/stat), with the load average.
Every process and group it made is removed at the end, also on Ctrl-C,
SIGTERM or an error.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from experiments import common
from experiments.calibrate import ARCHITECTURE, NATIVE_PX, parse_models
from experiments.common import (
    ExperimentError,
    busy_cores_s,
    check_interrupted,
    read_back_json,
    reading_back,
    sigterm_as_interrupt,
    update_section,
)
from shared.runtime import cgroupfs

REPO = Path(__file__).resolve().parents[1]
"""The checkout the lab runs from: its processes import the product from there."""
BEGIN = "<!-- BEGIN generated: python -m lab weights -->"
END = "<!-- END generated: python -m lab weights -->"


def markers(section: str | None = None) -> tuple[str, str]:
    """The BEGIN/END lines of the generated section (a named one with --section)."""
    if not section:
        return BEGIN, END
    return (f"<!-- BEGIN generated: python -m lab weights {section} -->",
            f"<!-- END generated: python -m lab weights {section} -->")
DEFAULT_QUOTA_SHARES = (0.25, 0.5)
"""Default quotas as shares of the node: they sum to 75 %, below the node as DQoES keeps them."""
CONDITIONS = {
    "alone": ("(a) no neighbour, default weights", False, False),
    "neighbour": ("(b) neighbour, default weights", True, False),
    "weighted": ("(c) neighbour, managed weights from the limits", True, True),
    "parent": ("(d) neighbour, managed and parent weights from the limits", True, True),
    "alone-weighted": ("(e) no neighbour, managed weights from the limits", False, True),
}
"""name: (label, neighbour running, managed weights set); "parent" also weights the managed groups' parent."""
DEFAULT_CONDITIONS = "alone,neighbour,weighted"
NEIGHBOUR_AT = ("sibling", "root")
SPIN = "while True: pass"
STARTUP_TIMEOUT_S = 600.0
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WeightsOptions:
    quotas: str | None = None
    """Managed quotas in cores, comma-separated; None: 25 % and 50 % of the node."""
    workload: str = "inference"
    """inference (the real workload) or spin (busy loops)."""
    model: str = "resnet50"
    batch_size: int = 10
    resolution: int | None = None
    duration_s: float = 60.0
    warmup_s: float = 5.0
    conditions: str = DEFAULT_CONDITIONS
    neighbour_procs: int | None = None
    """Busy processes in the neighbour; None: one per node core."""
    neighbour_at: str = "sibling"
    """sibling: beside the managed groups under the run's parent; root: beside that parent."""
    section: str | None = None
    """A named generated section, for several runs in one Markdown file."""
    node_cores: float | None = None
    """None: the CPUs this process may run on."""
    cgroup_root: str = str(cgroupfs.DEFAULT_ROOT)


def node_cores(opts: WeightsOptions) -> float:
    if opts.node_cores is not None:
        if not (math.isfinite(opts.node_cores) and opts.node_cores > 0):
            raise ExperimentError(f"--node-cores: a positive number, got {opts.node_cores}")
        return opts.node_cores
    return float(len(os.sched_getaffinity(0)))


def parse_quotas(text: str | None, cores: float) -> list[float]:
    if text is None:
        return [round(cores * s, 3) for s in DEFAULT_QUOTA_SHARES]
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise ExperimentError(f"--quotas: not a number: {part!r}") from None
        if not (math.isfinite(v) and v > 0):
            raise ExperimentError(f"--quotas: a quota must be > 0 cores, got {part}")
        out.append(v)
    if not out:
        raise ExperimentError("--quotas: no quotas given")
    if sum(out) > cores + 1e-9:
        raise ExperimentError(f"--quotas: they sum to {sum(out):g} cores, past the node's {cores:g} "
                              "(DQoES never sets that)")
    return out


def parse_conditions(text: str) -> list[str]:
    out = [c.strip() for c in text.split(",") if c.strip()]
    for c in out:
        if c not in CONDITIONS:
            raise ExperimentError(f"--conditions: unknown condition {c!r} (choose from {', '.join(CONDITIONS)})")
    if not out:
        raise ExperimentError("--conditions: none given")
    return list(dict.fromkeys(out))


def validate(opts: WeightsOptions) -> tuple[float, list[float], list[str]]:
    """Check every option before anything is created; (node cores, quotas, conditions)."""
    cores = node_cores(opts)
    quotas = parse_quotas(opts.quotas, cores)
    conditions = parse_conditions(opts.conditions)
    if opts.workload not in ("inference", "spin"):
        raise ExperimentError(f"--workload: inference or spin, got {opts.workload!r}")
    if opts.workload == "inference":
        parse_models(opts.model)
    if not (math.isfinite(opts.duration_s) and opts.duration_s > 0):
        raise ExperimentError(f"--duration-s: a positive number of seconds, got {opts.duration_s}")
    if not (math.isfinite(opts.warmup_s) and opts.warmup_s >= 0):
        raise ExperimentError(f"--warmup-s: zero or more seconds, got {opts.warmup_s}")
    if opts.batch_size < 1:
        raise ExperimentError(f"--batch-size: at least 1, got {opts.batch_size}")
    if opts.resolution is not None and opts.resolution < 32:
        raise ExperimentError(f"--resolution: at least 32 px, got {opts.resolution}")
    if opts.neighbour_at not in NEIGHBOUR_AT:
        raise ExperimentError(f"--neighbour-at: sibling or root, got {opts.neighbour_at!r}")
    if opts.section is not None and not all(ch.isalnum() or ch in "-_" for ch in opts.section):
        raise ExperimentError(f"--section: letters, digits, - and _ only, got {opts.section!r}")
    if opts.neighbour_procs is not None and opts.neighbour_procs < 1:
        raise ExperimentError(f"--neighbour-procs: at least 1, got {opts.neighbour_procs}")
    return cores, quotas, conditions


def managed_weight(version: int, quota_cores: float, cores: float) -> float:
    """Condition (c)'s weight: the kernel's maximum x (limit / node), as a multiple of the default."""
    return cgroupfs.weight_for_share(version, quota_cores / cores)  # type: ignore[arg-type]


# -- processes in groups ---------------------------------------------------------------------


@dataclass
class _Member:
    """One group the run made, with its processes and (inference) the batches they printed."""

    name: str
    group: cgroupfs.Group
    quota_cores: float | None
    procs: list[subprocess.Popen] = field(default_factory=list)
    batches: list[tuple[float, float]] = field(default_factory=list)
    """(finished_at wall time, latency_s) of every batch printed."""
    errs: list[IO[bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spawn(self, argv: list[str], *, read_batches: bool) -> None:
        procs_files = [str(d / "cgroup.procs") for d in self.group.dirs()]

        def join() -> None:  # in the child, before exec: all its CPU is counted in the group
            _die_with_parent()
            for path in procs_files:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))

        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "PYTHONUNBUFFERED": "1"}
        err = tempfile.TemporaryFile()
        self.errs.append(err)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE if read_batches else subprocess.DEVNULL,
                                stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=str(REPO),
                                preexec_fn=join, text=True)
        self.procs.append(proc)
        if read_batches:
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                row = json.loads(line)
                item = (float(row["finished_at"]), float(row["latency_s"]))
            except (ValueError, KeyError, TypeError):
                continue
            with self.lock:
                self.batches.append(item)

    def check_alive(self) -> None:
        for proc in self.procs:
            code = proc.poll()
            if code is not None:
                raise ExperimentError(f"a process of {self.name} exited early (status {code}): {self.err_tail()}")

    def err_tail(self) -> str:
        for err in self.errs:
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines()
            if lines:
                return lines[-1]
        return "no output"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.stdout is not None:
                with contextlib.suppress(OSError):
                    proc.stdout.close()
        self.procs.clear()
        for err in self.errs:
            err.close()
        self.errs.clear()


def _die_with_parent() -> None:
    """Linux: the child is killed when we are, even by SIGKILL (no busy loop outlives the run)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    mono_s: float
    wall_s: float
    busy_s: float
    usage_s: dict[str, float]
    throttle: dict[str, cgroupfs.Throttling]


def _snapshot(members: Sequence[_Member]) -> _Snapshot:
    return _Snapshot(time.monotonic(), time.time(), busy_cores_s(), {m.name: cgroupfs.usage_s(m.group) for m in members},
                     {m.name: cgroupfs.throttling(m.group) for m in members})


def _kill_all_in(group: cgroupfs.Group) -> None:
    """Kill whatever is left in one of our groups (a child forked just as Ctrl-C came, before Popen returned)."""
    try:
        left = cgroupfs.pids(group)
    except OSError:
        return
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)


def _reap(pid: int, timeout_s: float = 2.0) -> None:
    """Wait for a child of ours just killed, so that no zombie of it outlives the run (a poll at once
    after the kill finds it still running, every time); another process's child is not ours to wait for."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except OSError:  # not our child (or already reaped)
            return
        if done == pid or time.monotonic() > deadline:
            return
        time.sleep(0.005)


class _Run:
    """The groups and processes of one run; close() removes every one of them."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        self.root = root
        self.log = log
        self.parent_rel = f"dqoes-weights-{os.getpid()}"
        self.parent: cgroupfs.Group | None = None
        self.members: list[_Member] = []

    def open(self) -> None:
        if os.geteuid() != 0:
            raise ExperimentError("the weights experiment needs root: it creates cgroups with quotas and weights")
        try:
            cgroupfs.detect_layout(self.root)
            self.parent = cgroupfs.create_group(self.root, self.parent_rel)
        except OSError as e:
            raise ExperimentError(f"cannot create a cgroup under {self.root}: {e}") from None

    def add(self, name: str, quota_cores: float | None, *, beside_parent: bool = False) -> _Member:
        rel = f"{self.parent_rel}-{name}" if beside_parent else f"{self.parent_rel}/{name}"
        group = cgroupfs.create_group(self.root, rel)
        m = _Member(name, group, quota_cores)
        self.members.append(m)
        cgroupfs.write_quota_cores(group, quota_cores)
        return m

    def close(self) -> list[str]:
        """Kill every process, remove every group; the groups that could not be removed (none, normally)."""
        left = []
        for m in self.members:
            m.stop()
        for member in [*self.members, *([] if self.parent is None else [None])]:
            group = self.parent if member is None else member.group
            assert group is not None
            deadline = time.monotonic() + 5
            while True:
                _kill_all_in(group)
                with contextlib.suppress(OSError):
                    if cgroupfs.remove_group(group):
                        break
                if time.monotonic() > deadline:
                    left.append(str(group.cpu_dir))
                    break
                time.sleep(0.05)
        self.members.clear()
        self.parent = None
        for path in left:
            self.log(f"warning: cgroup {path} could not be removed")
        return left


def _sleep(members: Sequence[_Member], seconds: float, log: Callable[[str], None] | None = None,
           label: str = "") -> None:
    """Sleep, checking the processes every half second (and telling progress every 15 s)."""
    end = time.monotonic() + seconds
    next_note = time.monotonic() + 15
    while (now := time.monotonic()) < end:
        check_interrupted()
        for m in members:
            m.check_alive()
        if log and now >= next_note:
            log(f"    {label}: {end - now:.0f} s left")
            next_note += 15
        time.sleep(min(0.5, max(0.0, end - now)))


def measure(opts: WeightsOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Run every condition; the per-condition results (see the module docstring)."""
    cores, quotas, conditions = validate(opts)
    root = Path(opts.cgroup_root)
    run = _Run(root, log)
    with sigterm_as_interrupt():
        run.open()
        try:
            return _measure(opts, run, cores, quotas, conditions, log)
        finally:
            run.close()


def _measure(opts: WeightsOptions, run: _Run, cores: float, quotas: list[float], conditions: list[str],
             log: Callable[[str], None]) -> dict[str, Any]:
    version = cgroupfs.cpu_version(run.root)
    scale = cgroupfs.weight_scale(version)
    arch = ARCHITECTURE.get(opts.model, opts.model)
    px = opts.resolution or NATIVE_PX.get(arch, 224)
    managed: list[_Member] = []
    for i, q in enumerate(quotas):
        m = run.add(f"managed-{i}", q)
        managed.append(m)
        if opts.workload == "inference":
            m.spawn([sys.executable, "-m", "services.inference.run", "--model", arch, "--batch", str(opts.batch_size),
                     "--resolution", str(px), "--json"], read_batches=True)
        else:
            for _ in range(math.ceil(q)):
                m.spawn([sys.executable, "-c", SPIN], read_batches=False)
    neighbour = run.add("neighbour", None, beside_parent=opts.neighbour_at == "root")
    assert run.parent is not None
    parent = run.parent
    n_procs = opts.neighbour_procs or math.ceil(cores)
    if opts.workload == "inference":
        log(f"starting {len(managed)} {opts.model} workloads ({opts.batch_size} x {px} px a batch) under "
            f"{', '.join(f'{q:g}' for q in quotas)} cores; waiting for their first batch")
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all(m.batches for m in managed):
            check_interrupted()
            for m in managed:
                m.check_alive()
            if time.monotonic() > deadline:
                raise ExperimentError(f"the workloads printed no batch within {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
    else:
        log(f"started busy loops in {len(managed)} groups under {', '.join(f'{q:g}' for q in quotas)} cores")

    results = []
    for k, name in enumerate(conditions, 1):
        label, with_neighbour, weighted = CONDITIONS[name]
        if with_neighbour and not neighbour.procs:
            for _ in range(n_procs):
                neighbour.spawn([sys.executable, "-c", SPIN], read_batches=False)
        elif not with_neighbour and neighbour.procs:
            neighbour.stop()
        weights = {}
        for m in managed:
            assert m.quota_cores is not None
            w = managed_weight(version, m.quota_cores, cores) if weighted else cgroupfs.DEFAULT_WEIGHT
            weights[m.name] = cgroupfs.write_weight(m.group, w)
        cgroupfs.write_weight(neighbour.group, cgroupfs.DEFAULT_WEIGHT)
        parent_weight = cgroupfs.write_weight(
            parent, managed_weight(version, sum(quotas), cores) if name == "parent" else cgroupfs.DEFAULT_WEIGHT)
        members = [*managed, neighbour]
        load_before = os.getloadavg()
        log(f"[{k}/{len(conditions)}] {label}: {opts.warmup_s:g} s warm-up, {opts.duration_s:g} s measured "
            f"(load {load_before[0]:.2f})")
        _sleep(members, opts.warmup_s)
        a = _snapshot(members)
        _sleep(members, opts.duration_s, log, label)
        b = _snapshot(members)
        dt = b.mono_s - a.mono_s
        rows = []
        ours = 0.0
        for m in members:
            used = (b.usage_s[m.name] - a.usage_s[m.name]) / dt
            ours += used
            if m is neighbour:
                continue
            assert m.quota_cores is not None
            periods = b.throttle[m.name].periods - a.throttle[m.name].periods
            throttled = b.throttle[m.name].throttled_periods - a.throttle[m.name].throttled_periods
            with m.lock:
                lat = [lat_s for end, lat_s in m.batches if end - lat_s >= a.wall_s and end <= b.wall_s]
            rows.append({
                "group": m.name, "quota_cores": m.quota_cores, "weight": round(weights[m.name], 4),
                "weight_raw": scale.raw_for(weights[m.name]), "cores": round(used, 4),
                "ratio": round(used / m.quota_cores, 4),
                "throttled_share": None if periods <= 0 else round(throttled / periods, 4),
                "latency_median_s": round(statistics.median(lat), 4) if lat else None, "batches": len(lat),
                "latency_log_sd": _log_sd(lat),
            })
        neighbour_cores = (b.usage_s[neighbour.name] - a.usage_s[neighbour.name]) / dt
        results.append({
            "condition": name, "label": label, "neighbour": with_neighbour, "weighted": weighted,
            "parent_weight_raw": scale.raw_for(parent_weight),
            "neighbour_procs": n_procs if with_neighbour else 0, "neighbour_cores": round(neighbour_cores, 4),
            "other_cores": round(max(0.0, (b.busy_s - a.busy_s) / dt - ours), 4), "seconds": round(dt, 2),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()], "groups": rows,
        })
        got = ", ".join(f"{r['group']} {r['cores']:.3f}/{r['quota_cores']:g}" for r in rows)
        log(f"    cores received / quota: {got}; neighbour {neighbour_cores:.3f}")
    return {"conditions": results, "neighbour_at": opts.neighbour_at, "weight_file": scale.file, "weight_default_raw": scale.default_raw,
            "weight_max_raw": scale.max_raw, "cgroup_version": version}


def _log_sd(latencies: Sequence[float]) -> float | None:
    """The batch-to-batch noise at one quota: the sd of log latency (None under three batches)."""
    if len(latencies) < 3:
        return None
    return round(statistics.stdev(math.log(x) for x in latencies), 4)


# -- the command -----------------------------------------------------------------------------


def command_line(opts: WeightsOptions) -> str:
    parts = ["python -m lab weights", f"--workload {opts.workload}"]
    if opts.quotas is not None:
        parts.append(f"--quotas {opts.quotas}")
    if opts.workload == "inference":
        parts += [f"--model {opts.model}", f"--batch-size {opts.batch_size}"]
        if opts.resolution:
            parts.append(f"--resolution {opts.resolution}")
    parts += [f"--duration-s {opts.duration_s:g}", f"--warmup-s {opts.warmup_s:g}"]
    if opts.conditions != DEFAULT_CONDITIONS:
        parts.append(f"--conditions {opts.conditions}")
    if opts.neighbour_procs is not None:
        parts.append(f"--neighbour-procs {opts.neighbour_procs}")
    if opts.neighbour_at != "sibling":
        parts.append(f"--neighbour-at {opts.neighbour_at}")
    if opts.node_cores is not None:
        parts.append(f"--node-cores {opts.node_cores:g}")
    return " ".join(parts)


def machine(opts: WeightsOptions, cores: float) -> dict[str, Any]:
    try:
        layout: str = cgroupfs.detect_layout(opts.cgroup_root)
    except OSError:
        layout = "none"
    return {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count() or 1,
            "node_cores": cores, "cpu_model": common.cpu_model(), "cgroup": layout,
            "loadavg": [round(x, 2) for x in os.getloadavg()], "command": command_line(opts),
            "workload": opts.workload, "model": opts.model if opts.workload == "inference" else None,
            "duration_s": opts.duration_s, "warmup_s": opts.warmup_s}


def run(opts: WeightsOptions, log: Callable[[str], None], *, from_file: str | None = None,
        update: str | None = None) -> dict[str, Any]:
    """Measure (or read back a --json output), write the docs section; {"machine": ..., "result": ...}."""
    what = "a `python -m lab weights --json` output"
    if from_file:
        d = read_back_json(from_file, what)
        with reading_back(from_file, what):
            meta, result = d["machine"], d["result"]
            if not isinstance(result["conditions"], list):
                raise ValueError("no list of conditions")
    else:
        cores, _, _ = validate(opts)
        meta = machine(opts, cores)
        result = measure(opts, log)
    out = {"machine": meta, "result": result}
    with reading_back(from_file, what):
        md = render_markdown(out, opts.section)
    if update:
        if opts.section is not None:
            validate(WeightsOptions(section=opts.section))
        update_section(Path(update), md, *markers(opts.section))
        log(f"section updated in {update}")
    return out


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def render_markdown(out: dict[str, Any], section: str | None = None) -> str:
    meta, res = out["machine"], out["result"]
    wf = res.get("weight_file", "weight")
    load = meta.get("loadavg") or ["?"] * 3
    if meta.get("workload") == "inference":
        what = (f"the real inference workload ({meta.get('model')}, threads following the quota) in each managed "
                "group")
    else:
        what = "one busy loop per started core of quota in each managed group (no real workload)"
    begin, end = markers(section)
    if not any(c["neighbour"] for c in res["conditions"]):
        neighbour = "no condition ran the unmanaged neighbour"
    elif res.get("neighbour_at") == "root":
        neighbour = ("the unmanaged neighbour is one busy loop per core with no quota, beside the managed groups' "
                     "parent group at the top of the hierarchy (as a host process outside Docker's docker/ group "
                     "would be)")
    else:
        neighbour = ("the unmanaged neighbour is one busy loop per core with no quota, beside the managed groups "
                     "under their parent group (as another container under Docker's docker/ group would be)")
    lines = [begin, ""]
    lines.append(
        f"Measured {meta.get('measured_at', '?')} with `{meta.get('command', 'python -m lab weights')}` (root) "
        f"on {meta.get('cores', '?')} cores ({meta.get('cpu_model', '?')}), cgroup {meta.get('cgroup', '?')}, "
        f"node of {meta.get('node_cores', '?'):g} cores; load average before the run "
        f"{' '.join(str(x) for x in load)}. Plain processes in cgroups: {what}; {neighbour}. Each condition: {meta.get('warmup_s', '?'):g} s warm-up, then "
        f"{meta.get('duration_s', '?'):g} s measured. *Cores received* is the group's CPU counter over the "
        f"measured window; *throttled* the share of CFS periods in which it ran out of quota; weights are the raw "
        f"`{wf}` values (default {res.get('weight_default_raw', '?')}, maximum {res.get('weight_max_raw', '?')}); "
        f"in (c) and (e) each managed group's is the maximum x quota / node cores, in (d) also the parent's, from "
        f"the sum of the quotas; *batch noise* the sd of log batch latency over the measured window."
    )
    lines.append("")
    lines.append(f"| condition | group | quota (cores) | `{wf}` | cores received | received / quota | throttled "
                 "periods | batch latency, median (s) | batch noise | batches |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for c in res["conditions"]:
        for r in c["groups"]:
            share = "-" if r["throttled_share"] is None else f"{100 * r['throttled_share']:.0f}%"
            lines.append(f"| {c['label']} | {r['group']} | {r['quota_cores']:g} | {r['weight_raw']} | "
                         f"{r['cores']:.3f} | {r['ratio']:.2f} | {share} | "
                         f"{_num(r['latency_median_s'], '.3f')} | {_num(r.get('latency_log_sd'), '.3f')} | "
                         f"{r['batches']} |")
    lines.append("")
    lines.append(f"| condition | neighbour (cores) | parent's `{wf}` | other processes (cores) | load avg 1 min "
                 "(before / after) |")
    lines.append("|---|---|---|---|---|")
    for c in res["conditions"]:
        nb = f"{c['neighbour_cores']:.3f} ({c['neighbour_procs']} busy loops)" if c["neighbour"] else "-"
        lines.append(f"| {c['label']} | {nb} | {c.get('parent_weight_raw', '-')} | {c['other_cores']:.3f} | "
                     f"{c['loadavg_before'][0]:.2f} / {c['loadavg_after'][0]:.2f} |")
    lines.append("")
    lines.append(end)
    return "\n".join(lines)
