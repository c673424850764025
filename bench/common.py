"""Small helpers shared by the benchmark suites: timing and reporting."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def time_it(fn: Callable[[], object], repeat: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeat` calls (after `warmup` untimed ones)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def report(label: str, value: float, unit: str, goal: float | None = None, lower_is_better: bool = True,
           se: float | None = None) -> dict:
    """Print one figure (its standard error where it has one, and its ratio to the goal); return it
    for --json."""
    line = f"  {label:<58} {value:>12.4g} {unit}"
    row: dict = {"value": value, "unit": unit}
    if se is not None:
        line += f" (se {se:.2g})"
        row["se"] = se
    if goal is not None:
        ratio = value / goal
        verdict = "meets goal" if (ratio <= 1) == lower_is_better else "misses goal"
        line += f"   goal {'<' if lower_is_better else '>'}= {goal:g} {unit}  ratio {ratio:.3f} ({verdict})"
        row.update(goal=goal, ratio=ratio)
    print(line, flush=True)
    return row


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
