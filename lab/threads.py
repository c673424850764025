"""Does following the CPU limit with the thread count pay? The workload measured both ways.

Why: an inference container sets its torch intra-op threads from its CPU
limit (max(1, floor(limit cores)), `services/inference/cgroup.py`), because
more threads than cores under a quota spin and get preempted, and fewer
waste a large limit. This experiment runs the real workload in a cgroup
under each limit with its threads following the limit, then pinned to each
fixed count asked for (torch's own default is every core of the machine),
and reports seconds and CPU-seconds per batch and the gain: pinned latency
over following latency (above 1: following is faster).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import common
from experiments.calibrate import ARCHITECTURE, NATIVE_PX, Measurer, parse_limits, parse_models
from experiments.common import ExperimentError, read_back_json, reading_back, update_section
from shared.runtime import cgroupfs

BEGIN = "<!-- BEGIN generated: python -m lab threads -->"
END = "<!-- END generated: python -m lab threads -->"


@dataclass(frozen=True, slots=True)
class ThreadsOptions:
    models: str = "resnet50"
    limits: str = "0.5,1,2,4"
    pinned: str = "1,4"
    """Fixed thread counts to compare with (comma-separated)."""
    batch_size: int = 10
    resolution: int | None = None
    batches: int = 3
    warmup: int = 2
    cgroup_root: str = str(cgroupfs.DEFAULT_ROOT)


def parse_pinned(text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ExperimentError(f"--pinned: thread counts like 1,4, got {text!r}") from None
    if not out or out[0] < 1:
        raise ExperimentError("--pinned: at least one thread count >= 1")
    return out


def measure(opts: ThreadsOptions, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per (model, limit, threads setting): median seconds and CPU-seconds per batch."""
    models, limits, pinned = parse_models(opts.models), parse_limits(opts.limits), parse_pinned(opts.pinned)
    meas = Measurer(opts.cgroup_root)
    meas.check()
    rows: list[dict[str, Any]] = []
    plan = [(m, lim, t) for m in models for lim in limits for t in (None, *pinned)]
    try:
        for k, (m, lim, threads) in enumerate(plan, 1):
            arch = ARCHITECTURE.get(m, m)
            px = opts.resolution or NATIVE_PX.get(arch, 224)
            shown = "following the limit" if threads is None else f"{threads} pinned"
            log(f"[{k}/{len(plan)}] {m} under {lim:g} cores, threads {shown}")
            run = meas.run(arch, lim, batch=opts.batch_size, resolution_px=px, batches=opts.batches,
                           warmup=opts.warmup, threads=threads)
            rows.append({"model": m, "limit_cores": lim, "threads": "follow" if threads is None else threads,
                         "latency_s": round(run.median_latency_s, 4), "cpu_s": round(run.median_cpu_s, 4),
                         "batches": len(run.latency_s)})
    finally:
        meas.close()
    return rows


def gains(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, limit, pinned count): pinned latency / following latency."""
    follow = {(r["model"], r["limit_cores"]): r["latency_s"] for r in rows if r["threads"] == "follow"}
    return [
        {"model": r["model"], "limit_cores": r["limit_cores"], "pinned": r["threads"],
         "gain": round(r["latency_s"] / follow[(r["model"], r["limit_cores"])], 3)}
        for r in rows if r["threads"] != "follow" and (r["model"], r["limit_cores"]) in follow
    ]


def machine(command: str) -> dict[str, Any]:
    cpu_model = common.cpu_model()
    return {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count() or 1,
            "cpu_model": cpu_model, "command": command}


def run(opts: ThreadsOptions, log: Callable[[str], None], *, from_file: str | None = None,
        update: str | None = None, command: str = "python -m lab threads") -> dict[str, Any]:
    """Measure (or read back a JSON written earlier), write the docs section; the rows, gains and machine."""
    what = "a `python -m lab threads --json` output"
    if from_file:
        d = read_back_json(from_file, what)
        with reading_back(from_file, what):
            rows, meta = d["rows"], d["machine"]
    else:
        meta = machine(command)
        rows = measure(opts, log)
    with reading_back(from_file, what):
        out = {"machine": meta, "rows": rows, "gains": gains(rows)}
        md = render_markdown(rows, meta)
    if update:
        update_section(Path(update), md, BEGIN, END)
        log(f"section updated in {update}")
    return out


def render_markdown(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [BEGIN, ""]
    lines.append(f"Measured {meta.get('measured_at', '?')} with `{meta.get('command', 'python -m lab threads')}` "
                 f"on {meta.get('cores', '?')} cores ({meta.get('cpu_model', '?')}). Medians of the measured "
                 "batches, seconds / CPU-seconds per batch; *gain* is the pinned latency over the following "
                 "latency (above 1: following the limit is faster).")
    lines.append("")
    pinned = sorted({r["threads"] for r in rows if r["threads"] != "follow"})
    lines.append("| model | limit (cores) | threads following the limit | " +
                 " | ".join(f"{t} pinned (gain)" for t in pinned) + " |")
    lines.append("|---|---|---|" + "---|" * len(pinned))
    g = {(x["model"], x["limit_cores"], x["pinned"]): x["gain"] for x in gains(rows)}
    for (model, lim) in dict.fromkeys((r["model"], r["limit_cores"]) for r in rows):
        at = {r["threads"]: r for r in rows if (r["model"], r["limit_cores"]) == (model, lim)}
        f = at.get("follow")
        cells = [f"{f['latency_s']:.3f} / {f['cpu_s']:.3f}" if f else "-"]
        for t in pinned:
            r = at.get(t)
            cells.append("-" if r is None else f"{r['latency_s']:.3f} / {r['cpu_s']:.3f} ({g.get((model, lim, t), 0):.2f})")
        lines.append(f"| {model} | {lim:g} | " + " | ".join(cells) + " |")
    all_g = [x["gain"] for x in gains(rows)]
    if all_g:
        lines.append("")
        lines.append(f"Gain over every limit and pinned count: median {statistics.median(all_g):.2f}, "
                     f"min {min(all_g):.2f}, max {max(all_g):.2f}.")
    lines.append("")
    lines.append(END)
    return "\n".join(lines)
