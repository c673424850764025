"""`dqoes calibrate`: measure the real models under CPU quotas and write the simulator's profiles.

Why: the simulator's built-in profiles start from one measurement and
published FLOPs, and real CPU quotas are not free (a small quota raises the
CPU-seconds a batch costs). This command runs the real inference workload
(`python -m services.inference.run`, the container's own batch loop) in a
cgroup of its own under each CPU limit, reads the group's CPU counter around
every batch, drops the warm-up batches and fits the profiles
(`experiments.calibration`). The profiles file it writes is what scenario
files (`profiles = "FILE"`) and `dqoes experiment run --profiles` read, so
simulated and real runs describe the same hardware.

Root is needed (it creates cgroups). Each limit runs in a fresh process, one
after another, never two at once; the machine's load average is recorded
with every run, because other work on the machine changes the figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from experiments import common
from experiments.calibration import (
    LimitRun,
    ModelCalibration,
    calibrations_from_document,
    fit_profile,
    profiles_document,
    to_toml,
)
from experiments.common import ExperimentError, update_section
from shared.core.profiles import ModelProfile
from shared.runtime import cgroupfs
from shared.scenarios.spec import ScenarioError, load_profiles_file

REAL_MODELS = ("resnet50", "mobilenetv2", "vgg16", "inceptionv3", "xception")
ARCHITECTURE = {"nasnetmobile": "mobilenetv2"}
"""Profile names the real workload serves with another network (run.py's alias)."""
NATIVE_PX = {"inceptionv3": 299, "xception": 299}
MIN_PX = {"inceptionv3": 75}
DEFAULT_LIMITS = (0.25, 0.5, 1.0, 1.5, 2.0)
BEGIN = "<!-- BEGIN generated: dqoes calibrate -->"
END = "<!-- END generated: dqoes calibrate -->"


def parse_limits(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise ExperimentError(f"--limits: not a number: {part!r}") from None
        if not (v > 0 and v < 1e6):
            raise ExperimentError(f"--limits: a limit must be > 0 cores, got {part}")
        out.append(v)
    if not out:
        raise ExperimentError("--limits: no limits given")
    return sorted(set(out))


def parse_models(text: str) -> list[str]:
    known = (*REAL_MODELS, *ARCHITECTURE)
    out = [m.strip() for m in text.split(",") if m.strip()]
    for m in out:
        if m not in known:
            raise ExperimentError(f"--models: unknown model {m!r} (choose from {', '.join(known)})")
    if not out:
        raise ExperimentError("--models: no models given")
    return list(dict.fromkeys(out))


# -- one run: a fresh workload process in a fresh cgroup -------------------------------------


class Measurer:
    """Runs the workload under a quota and times each batch with the group's CPU counter."""

    def __init__(self, root: str | Path = cgroupfs.DEFAULT_ROOT, python: str = sys.executable,
                 require_jemalloc: bool = False) -> None:
        self.root = Path(root)
        self.python = python
        self.require_jemalloc = require_jemalloc
        """Stop at the first run whose workload is not under jemalloc (what the workload image runs)."""
        self.parent = f"dqoes-calibrate-{os.getpid()}"
        self._parent_group: cgroupfs.Group | None = None

    def check(self) -> None:
        """Fail with one line unless we can create and limit cgroups here."""
        if os.geteuid() != 0:
            raise ExperimentError("calibrate needs root: it runs each model in a cgroup with a CPU quota")
        try:
            cgroupfs.detect_layout(self.root)
            self._parent_group = cgroupfs.create_group(self.root, self.parent)
        except OSError as e:
            raise ExperimentError(f"calibrate cannot create a cgroup under {self.root}: {e}") from None

    def close(self) -> None:
        if self._parent_group is not None:
            with contextlib.suppress(OSError):
                cgroupfs.remove_group(self._parent_group)
            self._parent_group = None

    def run(
        self,
        architecture: str,
        limit_cores: float | None,
        *,
        batch: int,
        resolution_px: int,
        batches: int,
        warmup: int,
        threads: int | None,
        on_batch: Callable[[int, float, float, bool], None] = lambda *a: None,
    ) -> LimitRun:
        """One fresh workload process under `limit_cores`; `threads` None: the workload follows its quota."""
        tag = "none" if limit_cores is None else f"{limit_cores:g}".replace(".", "_")
        group = cgroupfs.create_group(self.root, f"{self.parent}/{architecture}-{tag}")
        cgroupfs.write_quota_cores(group, limit_cores)
        procs = [str(d / "cgroup.procs") for d in group.dirs()]

        def join() -> None:  # in the child, before exec: every batch is counted in the group
            for path in procs:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))

        argv = [self.python, "-m", "services.inference.run", "--model", architecture, "--batch", str(batch),
                "--resolution", str(resolution_px), "--batches", str(batches + warmup), "--json",
                *(["--threads", str(threads)] if threads is not None else [])]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        lat: list[float] = []
        cpu: list[float] = []
        allocator: str | None = None
        load_before = os.getloadavg()
        t_start = time.monotonic()
        total_cpu = 0.0
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env,
                                    preexec_fn=join, text=True)
            try:
                used = 0.0
                assert proc.stdout is not None
                for line in proc.stdout:
                    now = cgroupfs.usage_s(group)
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue
                    if allocator is None:  # its first batch: the process runs torch, past any re-exec
                        allocator = allocator_of(proc.pid)
                        if self.require_jemalloc and allocator != "jemalloc":
                            raise ExperimentError(
                                f"the {architecture} workload runs under the {allocator} allocator here (no "
                                "libjemalloc.so.2: Debian's libjemalloc2), the workload image's containers under "
                                "jemalloc: profiles measured so do not describe them (on 1 Dec 2026 a MobileNetV2 "
                                "batch cost 0.25 CPU-s here without it, 0.11 with it)")
                    lat.append(float(row["latency_s"]))
                    # The group's counter since the previous batch; before the first batch it also
                    # counts start-up (imports, building the model), so that one uses the process's own.
                    cpu.append(now - used if lat[1:] else float(row["cpu_s"]))
                    used = now
                    on_batch(len(lat), lat[-1], cpu[-1], len(lat) <= warmup)
                code = proc.wait()
                wall = time.monotonic() - t_start
                total_cpu = cgroupfs.usage_s(group)
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(OSError):
                        cgroupfs.write_quota_cores(group, None)  # a throttled process exits slowly
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                for _ in range(40):
                    with contextlib.suppress(OSError):
                        if cgroupfs.remove_group(group):
                            break
                    time.sleep(0.05)
            if code != 0 or len(lat) < warmup + batches:
                err.seek(0)
                tail = err.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise ExperimentError(f"the {architecture} workload failed under {tag} cores (status {code}): {tail[0]}")
        return LimitRun(
            limit_cores=limit_cores,
            latency_s=tuple(lat[warmup:]),
            cpu_s=tuple(cpu[warmup:]),
            warmup_latency_s=tuple(lat[:warmup]),
            warmup_cpu_s=tuple(cpu[:warmup]),
            threads=threads if threads is not None else 0,
            loadavg_before=tuple(round(x, 2) for x in load_before),  # type: ignore[arg-type]
            loadavg_after=tuple(round(x, 2) for x in os.getloadavg()),  # type: ignore[arg-type]
            wall_s=wall,
            total_cpu_s=total_cpu,
            allocator=allocator,
        )


def allocator_of(pid: int) -> str:
    """The memory allocator a running process uses: "jemalloc" where libjemalloc is mapped into it (the
    workload re-executes itself under it where it is installed, services/inference/jemalloc.py), else
    "default malloc"; "unknown" where its memory map cannot be read."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "jemalloc" if any("libjemalloc" in line for line in f) else "default malloc"
    except OSError:
        return "unknown"


# -- the command -----------------------------------------------------------------------------


def command_line(opts: CalibrationOptions) -> str:
    parts = ["dqoes", "calibrate", "--models", opts.models, "--limits", opts.limits,
             "--batch-size", str(opts.batch_size), "--batches", str(opts.batches), "--warmup", str(opts.warmup),
             "--threads", str(opts.threads)]
    if opts.resolution:
        parts += ["--resolution", str(opts.resolution)]
    return " ".join(shlex.quote(a) for a in parts)


def machine_meta(opts: CalibrationOptions) -> dict[str, Any]:
    cpu_model = common.cpu_model()
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "not installed"
    try:
        cgroup: str = cgroupfs.detect_layout(opts.cgroup_root)
    except OSError:
        cgroup = "none"
    return {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_model": cpu_model,
        "cores": os.cpu_count() or 1,
        "kernel": platform.release(),
        "cgroup": cgroup,
        "torch": torch_version,
        "command": command_line(opts),
    }


def profiles_with_aliases(cals: Sequence[ModelCalibration]) -> list[ModelProfile]:
    """Fitted profiles, plus nasnetmobile from MobileNetV2 when it was not measured under its own name."""
    profiles = [fit_profile(c) for c in cals]
    names = {p.name for p in profiles}
    for alias, arch in ARCHITECTURE.items():
        src = next((c for c in cals if c.name == arch), None)
        if alias not in names and src is not None:
            c = ModelCalibration(alias, src.runs, src.threads, src.batch_images, src.resolution_px, arch)
            profiles.append(fit_profile(c, f"calibrated as {arch} (the real workload serves {alias} with it): "
                                           f"{c.batch_images} images x {c.resolution_px} px, {c.threads} thread(s)"))
    return profiles


def measure_all(opts: CalibrationOptions, log: Callable[[str], None]) -> list[ModelCalibration]:
    models = parse_models(opts.models)
    limits = parse_limits(opts.limits)
    for m in models:
        px = opts.resolution or NATIVE_PX.get(ARCHITECTURE.get(m, m), 224)
        if px < MIN_PX.get(ARCHITECTURE.get(m, m), 32):
            raise ExperimentError(f"--resolution: {m} needs at least {MIN_PX.get(m, 32)} px, got {px}")
    meas = Measurer(opts.cgroup_root, require_jemalloc=opts.require_jemalloc)
    meas.check()
    plan = [(m, lim) for m in models for lim in [None, *limits]]
    t0 = time.monotonic()
    runs: dict[str, list[LimitRun]] = {m: [] for m in models}
    try:
        for k, (m, lim) in enumerate(plan, 1):
            arch = ARCHITECTURE.get(m, m)
            px = opts.resolution or NATIVE_PX.get(arch, 224)
            where = "no limit" if lim is None else f"{lim:g} cores"
            log(f"[{k}/{len(plan)}] {m} under {where} ({opts.warmup} warm-up + {opts.batches} batches of "
                f"{opts.batch_size} x {px} px, {opts.threads} thread(s); load {os.getloadavg()[0]:.2f}; "
                f"{time.monotonic() - t0:.0f} s so far)")

            def on_batch(i: int, lat: float, cpu: float, warm: bool) -> None:
                tag = " (warm-up)" if warm else ""
                log(f"    batch {i}/{opts.warmup + opts.batches}: {lat:.3f} s, {cpu:.3f} CPU-s{tag}")

            runs[m].append(meas.run(arch, lim, batch=opts.batch_size, resolution_px=px, batches=opts.batches,
                                    warmup=opts.warmup, threads=opts.threads, on_batch=on_batch))
    finally:
        meas.close()
    return [
        ModelCalibration(m, tuple(runs[m]), opts.threads, opts.batch_size,
                         opts.resolution or NATIVE_PX.get(ARCHITECTURE.get(m, m), 224), ARCHITECTURE.get(m, m))
        for m in models
    ]


def table_rows(cal: ModelCalibration, prof: ModelProfile, node_cores: float) -> list[dict[str, Any]]:
    rows = []
    for r in [*(x for x in cal.runs if x.limit_cores is None), *cal.limited()]:
        rows.append({
            "limit_cores": r.limit_cores,
            "latency_s": round(r.median_latency_s, 3),
            "cpu_s": round(r.median_cpu_s, 3),
            "multiplier": round(r.median_cpu_s / prof.work_cpu_s, 2),
            "sim_latency_s": round(prof.latency_s(r.limit_cores, node_cores), 3),
            "batches": len(r.latency_s),
            "loadavg_1m": None if r.loadavg_before is None or r.loadavg_after is None
            else [r.loadavg_before[0], r.loadavg_after[0]],
        })
    return rows


def render_markdown(doc: dict[str, Any], cals: Sequence[ModelCalibration], profiles: Sequence[ModelProfile],
                    plot_rel: str | None) -> str:
    meta = doc.get("calibration", {})
    node_cores = float(meta.get("cores", os.cpu_count() or 1))
    by_name = {p.name: p for p in profiles}
    lines = [BEGIN, ""]
    lines.append(f"Measured {meta.get('measured_at', '?')} with `{meta.get('command', 'dqoes calibrate')}` on "
                 f"{meta.get('cores', '?')} × {meta.get('cpu_model', '?')}, kernel {meta.get('kernel', '?')}, "
                 f"cgroup {meta.get('cgroup', '?')}, torch {meta.get('torch', '?')}"
                 + (f", allocator {meta['allocator']}." if meta.get("allocator") else "."))
    loads = [x for c in cals for r in c.runs for x in (r.loadavg_before, r.loadavg_after) if x is not None]
    if loads:
        ones = [x[0] for x in loads]
        lines.append(f"Load average (1 min) around the runs: {min(ones):.2f}–{max(ones):.2f} "
                     f"(median {statistics.median(ones):.2f}) on {meta.get('cores', '?')} cores; "
                     "the machine is shared, so other work ran at the same time.")
    lines.append("")
    lines.append("Medians over the measured batches (warm-up dropped). *CPU-s* is the cgroup's CPU counter per "
                 "batch; *×* is that over the unlimited batch's CPU-seconds (the efficiency multiplier); "
                 "*sim* is what the fitted profile makes the simulator predict for a batch alone under the limit.")
    lines.append("")
    for c in cals:
        p = by_name[c.name]
        arch = f" ({c.architecture})" if c.architecture and c.architecture != c.name else ""
        lines.append(f"#### {c.name}{arch}: {c.batch_images} images × {c.resolution_px} px, {c.threads} thread(s)")
        lines.append("")
        lines.append("| CPU limit (cores) | latency (s) | CPU-s per batch | × | sim latency (s) | batches | load 1 min (before → after) |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in table_rows(c, p, node_cores):
            lim = "none" if r["limit_cores"] is None else f"{r['limit_cores']:g}"
            la = "" if r["loadavg_1m"] is None else f"{r['loadavg_1m'][0]:.2f} → {r['loadavg_1m'][1]:.2f}"
            lines.append(f"| {lim} | {r['latency_s']:.3f} | {r['cpu_s']:.3f} | {r['multiplier']:.2f} | "
                         f"{r['sim_latency_s']:.3f} | {r['batches']} | {la} |")
        eff = ", ".join(f"[{a:g}, {b:g}]" for a, b in p.efficiency)
        lines.append("")
        lines.append(f"Profile: `work_cpu_s = {p.work_cpu_s:g}`, `overhead_s = {p.overhead_s:g}`, "
                     f"`warmup_factor = {p.warmup_factor:g}`, `efficiency = [{eff}]`.")
        lines.append("")
    if plot_rel:
        lines.append(f"![latency and CPU-seconds per batch against the CPU limit]({plot_rel})")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def calibration_frame(cals: Sequence[ModelCalibration], profiles: Sequence[ModelProfile]) -> list[dict[str, Any]]:
    """Measured medians and the fitted profile's values at every measured limit, one row each."""
    by_name = {p.name: p for p in profiles}
    rows: list[dict[str, Any]] = []
    for c in cals:
        p = by_name[c.name]
        label = f"{c.name} ({c.batch_images}×{c.resolution_px}px)"
        for r in c.limited():
            lim = r.limit_cores or 0.0
            rows.append({"model": label, "limit_cores": lim, "source": "measured",
                         "latency_s": r.median_latency_s, "cpu_s": r.median_cpu_s})
            rows.append({"model": label, "limit_cores": lim, "source": "fitted profile",
                         "latency_s": p.latency_s(r.limit_cores, 64.0),
                         "cpu_s": p.work_cpu_s * p.cpu_multiplier(r.limit_cores)})
    return rows


def calibration_figure(cals: Sequence[ModelCalibration], profiles: Sequence[ModelProfile]) -> Any:
    """Latency and CPU-seconds per batch against the limit: the dashboard's calibration figure."""
    from dashboard import views  # figures need altair: imported only to draw

    return views.calibration_chart(pd.DataFrame(calibration_frame(cals, profiles)))


@dataclass(frozen=True, slots=True)
class CalibrationOptions:
    """What `dqoes calibrate` measures and where it writes (the flags, as data)."""

    models: str = ",".join(REAL_MODELS)
    limits: str = ",".join(f"{x:g}" for x in DEFAULT_LIMITS)
    batch_size: int = 10
    resolution: int | None = None
    batches: int = 3
    warmup: int = 2
    threads: int = 1
    cgroup_root: str = str(cgroupfs.DEFAULT_ROOT)
    from_file: str | None = None
    """Measure nothing: report from a profiles file written earlier."""
    out: str | None = None
    plot: str | None = None
    update: str | None = None
    require_jemalloc: bool = False
    """Stop at the first run whose workload is not under jemalloc: profiles for the workload image's
    containers (which run under it) must be measured under it too."""


@dataclass(frozen=True, slots=True)
class CalibrationResult:
    summary: dict[str, Any]
    """The JSON `--json` prints: the machine, the fitted models, the table per model."""
    markdown: str


def calibrate(opts: CalibrationOptions, log: Callable[[str], None]) -> CalibrationResult:
    """Measure (or read back) the calibration, fit the profiles, write what `opts` asks for."""
    for name, v in (("--batch-size", opts.batch_size), ("--batches", opts.batches), ("--threads", opts.threads)):
        if v < 1:
            raise ExperimentError(f"{name} must be >= 1, got {v}")
    if opts.warmup < 0:
        raise ExperimentError(f"--warmup must be >= 0, got {opts.warmup}")
    if opts.resolution is not None and opts.resolution < 32:
        raise ExperimentError(f"--resolution must be >= 32 px, got {opts.resolution}")
    if opts.from_file:
        src = Path(opts.from_file)
        try:
            raw = src.read_text()
            import tomllib

            doc_in = json.loads(raw) if src.suffix == ".json" else tomllib.loads(raw)
            load_profiles_file(src)  # validates the models
        except (OSError, ValueError, ScenarioError) as e:
            raise ExperimentError(f"--from {src}: {str(e).splitlines()[0]}") from None
        cals = calibrations_from_document(doc_in)
        if not cals:
            raise ExperimentError(f"--from {src}: the file has no [calibration] runs to report")
        meta = {k: v for k, v in doc_in.get("calibration", {}).items() if k != "runs"}
    else:
        meta = machine_meta(opts)
        cals = measure_all(opts, log)
        meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        allocators = sorted({r.allocator for c in cals for r in c.runs if r.allocator})
        meta["allocator"] = ", ".join(allocators)
        if allocators != ["jemalloc"]:
            log(f"warning: the workloads ran under {meta['allocator']}, not jemalloc (no libjemalloc.so.2 here: "
                "Debian's libjemalloc2); the workload image, and the cgroup runtime's workloads where it is "
                "installed, run under jemalloc, which on 1 Dec 2026 made a MobileNetV2 batch here cost 0.11 "
                "CPU-s against 0.25 without it: these profiles describe workloads without it")
    profiles = profiles_with_aliases(cals)
    doc = profiles_document(profiles, cals, meta)

    if opts.out:
        out = Path(opts.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".json":
            out.write_text(json.dumps(doc, indent=1) + "\n")
        else:
            out.write_text(to_toml(doc, header=(
                "Model profiles measured by `dqoes calibrate` (docs/guide/calibration.md).\n"
                "Use: `profiles = \"<this file>\"` in a scenario file, `dqoes experiment run --profiles <this file>`,\n"
                "or DQOES_PROFILES=<this file>. [calibration] keeps the raw batches.")))
        log(f"profiles written to {out}")
    if opts.plot:
        from dashboard import render

        render.save(calibration_figure(cals, profiles), opts.plot)
        log(f"plot written to {opts.plot}")
    md_plot = None
    if opts.plot and opts.update:
        md_plot = os.path.relpath(Path(opts.plot).resolve(), Path(opts.update).resolve().parent)
    md = render_markdown(doc, cals, profiles, md_plot)
    if opts.update:
        update_section(Path(opts.update), md, BEGIN, END)
        log(f"section updated in {opts.update}")
    node_cores = float(meta.get("cores", os.cpu_count() or 1))
    summary = {
        "calibration": dict(meta),
        "models": doc["models"],
        "table": {c.name: table_rows(c, next(p for p in profiles if p.name == c.name), node_cores) for c in cals},
    }
    return CalibrationResult(summary, md)
