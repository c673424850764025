"""Fit the simulator's training-job profiles to the real workloads' measured loss curves.

Why: the simulator's FlowCon results are only as good as its jobs' shapes.
This runs each real task (`services/training`) alone for some epochs, one
thread, records the mean loss and CPU-seconds of every epoch, and fits
E(e) = floor + (start - floor) x exp(-rate x e) by least squares (for each
rate on a grid, floor and amplitude are linear). The fit's residuals give
the per-report noise. The CPU per epoch is measured here; the built-in
scenarios scale it (docs/guide/training.md says how) to the paper's job lengths.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import ExperimentError
from shared.scenarios.training import POOL, TrainingProfile, profiles_toml

REPO = Path(__file__).resolve().parents[1]
EVAL_FN = {"vae": "reconstruction loss", "cnn": "cross entropy", "mlp": "cross entropy",
           "lstm": "squared loss", "gru": "squared loss"}


@dataclass(frozen=True, slots=True)
class Fit:
    e_start: float
    e_floor: float
    rate_per_epoch: float
    delay_epochs: float
    noise_frac: float
    rms: float


def fit_exponential(losses: Sequence[float]) -> Fit:
    """Least-squares E(e) = floor + amp * exp(-rate * max(0, e - delay)) over epochs 0..n-1.

    The delay captures a plateau before the loss starts to fall (the CNN's);
    rate and delay are searched on grids, floor and amplitude are linear. The
    noise is the scatter of consecutive epochs around their neighbours' mean
    (second differences) in the second half, relative to the loss there, so the
    fit's own misfit is not counted as noise.
    """
    y = np.asarray(losses, dtype=float)
    if len(y) < 3 or not np.all(np.isfinite(y)):
        raise ExperimentError("need at least three finite losses to fit a curve")
    e = np.arange(len(y), dtype=float)
    best: tuple[float, float, float, float, float] | None = None
    for delay in range(0, max(1, len(y) // 2)):
        x = np.maximum(0.0, e - delay)
        for rate in np.geomspace(1e-2, 5.0, 300):
            a = np.column_stack([np.ones_like(e), np.exp(-rate * x)])
            coef, *_ = np.linalg.lstsq(a, y, rcond=None)
            if coef[0] < 0 or coef[1] < 0:
                continue
            rss = float(np.sum((a @ coef - y) ** 2))
            if best is None or rss < best[0]:
                best = (rss, float(rate), float(delay), float(coef[0]), float(coef[1]))
    if best is None:
        raise ExperimentError("no falling curve fits these losses")
    rss, rate, delay_fit, floor, amp = best
    rms = math.sqrt(rss / len(y))
    tail = y[len(y) // 2:]
    if len(tail) >= 3:
        second = tail[1:-1] - (tail[:-2] + tail[2:]) / 2
        noise = float(np.std(second)) / max(1e-12, float(np.mean(np.abs(tail))))
    else:
        noise = 0.0
    return Fit(floor + amp, floor, rate, delay_fit, noise, rms)


def measure(model: str, epochs: int, threads: int = 1) -> list[dict[str, float]]:
    out = subprocess.run([sys.executable, "-m", "services.training.measure", "--model", model, "--epochs",
                          str(epochs), "--threads", str(threads)], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=1800)
    if out.returncode != 0:
        raise ExperimentError(f"{model}: measurement failed: {out.stderr.strip()[-300:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def calibrate(models: Sequence[str], epochs: int, log: Callable[[str], None], scale_work_cpu_s: float = 500.0,
              sim_epochs: int = 60, measured: dict[str, Any] | None = None,
              when: str | None = None, host: str | None = None) -> dict[str, Any]:
    """Measure and fit each model; profiles for the simulator scaled so the mean job is `scale_work_cpu_s`.

    `measured` (the "raw" of an earlier run's JSON): fit those losses again, measure nothing.
    """
    for m in models:
        if m not in POOL:
            raise ExperimentError(f"unknown model {m!r} (choose from {', '.join(POOL)})")
    raw: dict[str, Any] = {}
    for m in models:
        if measured is not None:
            if m not in measured:
                raise ExperimentError(f"{m}: not in the measurements given")
            losses, cpu = measured[m]["losses"], measured[m]["cpu_s_per_epoch"]
        else:
            log(f"{m}: {epochs} epochs alone, one thread")
            rows = measure(m, epochs)
            losses = [round(r["loss"], 6) for r in rows]
            cpu = statistics.median(r["cpu_s"] for r in rows[1:] or rows)
        fit = fit_exponential(losses)
        raw[m] = {"losses": losses, "cpu_s_per_epoch": cpu,
                  "fit": {"e_start": fit.e_start, "e_floor": fit.e_floor, "rate_per_epoch": fit.rate_per_epoch,
                          "delay_epochs": fit.delay_epochs, "noise_frac": fit.noise_frac, "rms": fit.rms}}
    mean_cpu = statistics.mean(v["cpu_s_per_epoch"] for v in raw.values())
    k = scale_work_cpu_s / (sim_epochs * mean_cpu)
    when = when or time.strftime("%Y-%m-%d")
    host = host or platform.node()
    epochs = len(next(iter(raw.values()))["losses"]) if raw else epochs
    profiles = {}
    for m, v in raw.items():
        f = v["fit"]
        profiles[m] = TrainingProfile(
            name=m, eval_fn=EVAL_FN[m], e_start=round(f["e_start"], 4), e_floor=round(f["e_floor"], 4),
            rate_per_epoch=round(f["rate_per_epoch"], 4), delay_epochs=f["delay_epochs"], cpu_s_per_epoch=round(v["cpu_s_per_epoch"] * k, 3),
            demand_cores=0.0 + {"vae": 2.6, "cnn": 3.0, "mlp": 2.2, "lstm": 1.8, "gru": 1.8}[m], epochs=sim_epochs,
            noise_frac=round(max(0.0005, f["noise_frac"]), 4),
            source=f"fitted to {epochs} measured epochs ({when}, {host}, 1 thread); CPU x{k:.1f}")
    return {"machine": {"host": host, "cpu_count": os.cpu_count()}, "date": when, "epochs": epochs,
            "cpu_scale": k, "raw": raw, "toml": profiles_toml(profiles)}


def render_markdown(d: dict[str, Any]) -> str:
    lines = ["| profile | E | start | floor | rate / epoch | delay (epochs) | fit rms | noise | measured CPU-s / epoch "
             "| sim CPU-s / epoch |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m, v in d["raw"].items():
        f = v["fit"]
        lines.append(f"| {m} | {EVAL_FN[m]} | {f['e_start']:.4g} | {f['e_floor']:.4g} | {f['rate_per_epoch']:.3g} | "
                     f"{f['delay_epochs']:g} | "
                     f"{f['rms']:.3g} | {100 * f['noise_frac']:.2f}% | {v['cpu_s_per_epoch']:.3f} | "
                     f"{v['cpu_s_per_epoch'] * d['cpu_scale']:.2f} |")
    return "\n".join(lines)
