"""From measured batches under CPU quotas to the simulator's model profiles.

Why: the simulator is only as true as its profiles. `dqoes calibrate` runs the
real inference workload under a list of CPU limits and hands the batches here;
this module turns them into `ModelProfile`s (work per batch, the efficiency
curve, warm-up) and into the profiles file that scenario files and
`--profiles` read. Pure: no processes, no clock, so the fitting is tested
on its own.

The fit, per model, with T intra-op threads:

- `work_cpu_s` is the median CPU-seconds of the batches no quota throttled:
  the unlimited run's and those under limits of at least T cores, pooled (on
  a shared machine one run alone is at the mercy of a neighbour's burst);
- the efficiency multiplier at a limit L < T is median CPU-seconds at L over
  `work_cpu_s`, floored at 1 and made non-increasing in L (a quota can only
  add cost: a noisy point may not make a smaller quota look cheaper), with a
  last point (T, 1) where the quota stops biting;
- `overhead_s` is 0: wall time beyond CPU / T in an unthrottled batch is
  waiting for a CPU that other processes hold (the simulator's fair share
  models that) or imperfect parallelism, not a cost of the model; the
  tables show it as the gap between measured and simulated latency;
- `warmup_factor` is the first batches' CPU over `work_cpu_s` (at least 1).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core.profiles import ModelProfile


@dataclass(frozen=True, slots=True)
class LimitRun:
    """The batches of one model run under one CPU limit (None: no quota)."""

    limit_cores: float | None
    latency_s: tuple[float, ...]
    """Wall seconds of each measured batch (warm-up batches excluded)."""
    cpu_s: tuple[float, ...]
    """CPU-seconds of each measured batch, from the group's usage counter."""
    warmup_latency_s: tuple[float, ...] = ()
    warmup_cpu_s: tuple[float, ...] = ()
    threads: int = 1
    loadavg_before: tuple[float, float, float] | None = None
    loadavg_after: tuple[float, float, float] | None = None
    wall_s: float | None = None
    """Wall seconds of the whole process (start-up included)."""
    total_cpu_s: float | None = None
    """CPU-seconds the group used over the whole process: at most about limit x wall_s."""
    allocator: str | None = None
    """What the workload's memory allocator was ("jemalloc", "default malloc"), read from its process's
    memory map; None: not recorded (calibrations before 1 Dec 2026)."""

    def __post_init__(self) -> None:
        if self.limit_cores is not None and not (math.isfinite(self.limit_cores) and self.limit_cores > 0):
            raise ValueError(f"limit_cores must be > 0 or None, got {self.limit_cores!r}")
        if not self.latency_s or len(self.latency_s) != len(self.cpu_s):
            raise ValueError("a run needs at least one measured batch, with as many CPU as latency values")

    @property
    def median_latency_s(self) -> float:
        return statistics.median(self.latency_s)

    @property
    def median_cpu_s(self) -> float:
        return statistics.median(self.cpu_s)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "limit_cores": self.limit_cores,
            "threads": self.threads,
            "median_latency_s": round(self.median_latency_s, 4),
            "median_cpu_s": round(self.median_cpu_s, 4),
            "latency_s": [round(x, 4) for x in self.latency_s],
            "cpu_s": [round(x, 4) for x in self.cpu_s],
            "warmup_latency_s": [round(x, 4) for x in self.warmup_latency_s],
            "warmup_cpu_s": [round(x, 4) for x in self.warmup_cpu_s],
        }
        if self.loadavg_before is not None:
            out["loadavg_before"] = list(self.loadavg_before)
        if self.loadavg_after is not None:
            out["loadavg_after"] = list(self.loadavg_after)
        if self.wall_s is not None:
            out["wall_s"] = round(self.wall_s, 3)
        if self.total_cpu_s is not None:
            out["total_cpu_s"] = round(self.total_cpu_s, 3)
        if self.allocator is not None:
            out["allocator"] = self.allocator
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LimitRun:
        la_b, la_a = d.get("loadavg_before"), d.get("loadavg_after")
        return cls(
            limit_cores=None if d.get("limit_cores") is None else float(d["limit_cores"]),
            latency_s=tuple(float(x) for x in d["latency_s"]),
            cpu_s=tuple(float(x) for x in d["cpu_s"]),
            warmup_latency_s=tuple(float(x) for x in d.get("warmup_latency_s", ())),
            warmup_cpu_s=tuple(float(x) for x in d.get("warmup_cpu_s", ())),
            threads=int(d.get("threads", 1)),
            loadavg_before=None if la_b is None else (float(la_b[0]), float(la_b[1]), float(la_b[2])),
            loadavg_after=None if la_a is None else (float(la_a[0]), float(la_a[1]), float(la_a[2])),
            wall_s=None if d.get("wall_s") is None else float(d["wall_s"]),
            total_cpu_s=None if d.get("total_cpu_s") is None else float(d["total_cpu_s"]),
            allocator=None if d.get("allocator") is None else str(d["allocator"]),
        )


@dataclass(frozen=True, slots=True)
class ModelCalibration:
    """Every run of one model, and what it was run as."""

    name: str
    """Profile name (the simulator's model name)."""
    runs: tuple[LimitRun, ...]
    threads: int = 1
    batch_images: int = 10
    resolution_px: int = 224
    architecture: str = ""
    """The real network that ran, when it differs from `name` (nasnetmobile runs MobileNetV2)."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def baseline(self) -> LimitRun:
        """The unlimited run; failing that, the largest limit that does not bind (>= threads)."""
        for r in self.runs:
            if r.limit_cores is None:
                return r
        free = [r for r in self.runs if r.limit_cores is not None and r.limit_cores >= self.threads]
        if not free:
            raise ValueError(
                f"{self.name}: no unlimited run and no limit >= {self.threads} cores: cannot tell the unthrottled cost"
            )
        return max(free, key=lambda r: r.limit_cores or 0.0)

    def unthrottled(self) -> list[LimitRun]:
        """Runs no quota throttled: unlimited, or a limit of at least the thread count."""
        return [r for r in self.runs if r.limit_cores is None or r.limit_cores >= self.threads]

    def work_cpu_s(self) -> float:
        """Median CPU-seconds over every unthrottled batch (see the module docstring)."""
        pooled = [c for r in self.unthrottled() for c in r.cpu_s]
        if not pooled:
            self.baseline()  # raises the explanation
        return statistics.median(pooled)

    def limited(self) -> list[LimitRun]:
        return sorted((r for r in self.runs if r.limit_cores is not None), key=lambda r: r.limit_cores or 0.0)


def efficiency_curve(cal: ModelCalibration, work_cpu_s: float) -> tuple[tuple[float, float], ...]:
    """(limit_cores, multiplier) points for limits below the thread count, ending at (threads, m)."""
    # At `threads` cores and above the quota does not throttle: multiplier 1 by definition.
    raw = [(r.limit_cores, max(1.0, r.median_cpu_s / work_cpu_s)) for r in cal.limited()
           if r.limit_cores is not None and r.limit_cores < cal.threads]
    raw.append((float(cal.threads), 1.0))
    raw.sort()
    # Non-increasing in the limit: walk from the largest limit down, keeping the running max.
    out: list[tuple[float, float]] = []
    running = 1.0
    for lim, m in reversed(raw):
        running = max(running, m)
        out.append((float(lim), round(running, 4)))
    return tuple(reversed(out))


def fit_profile(cal: ModelCalibration, source: str = "") -> ModelProfile:
    """The simulator's profile for one calibrated model (see the module docstring)."""
    base = cal.baseline()
    work = cal.work_cpu_s()
    if not (math.isfinite(work) and work > 0):
        raise ValueError(f"{cal.name}: the unthrottled batches used no CPU ({work!r} s)")
    warm = max(1.0, statistics.median(base.warmup_cpu_s) / work) if base.warmup_cpu_s else 1.0
    arch = f" ({cal.architecture} network)" if cal.architecture and cal.architecture != cal.name else ""
    return ModelProfile(
        name=cal.name,
        work_cpu_s=round(work, 4),
        threads=cal.threads,
        overhead_s=0.0,
        efficiency=efficiency_curve(cal, work),
        warmup_factor=round(warm, 3),
        batch_images=cal.batch_images,
        resolution_px=cal.resolution_px,
        source=source or f"calibrated{arch}: {cal.batch_images} images x {cal.resolution_px} px, {cal.threads} thread(s)",
    )


def predicted_latency_s(p: ModelProfile, limit_cores: float | None, node_cores: float) -> float:
    """What the simulator says a batch takes alone under `limit_cores` (to compare with the measurement)."""
    return p.latency_s(limit_cores, node_cores)


# -- the profiles file ---------------------------------------------------------------


def profile_to_dict(p: ModelProfile) -> dict[str, Any]:
    """A profile as a scenario file's [[models]] table."""
    return {
        "name": p.name,
        "work_cpu_s": p.work_cpu_s,
        "threads": p.threads,
        "overhead_s": p.overhead_s,
        "efficiency": [[c, m] for c, m in p.efficiency],
        "warmup_factor": p.warmup_factor,
        "batch_images": p.batch_images,
        "resolution_px": p.resolution_px,
        "source": p.source,
    }


def profiles_document(
    profiles: Sequence[ModelProfile],
    calibrations: Sequence[ModelCalibration] = (),
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The profiles file: `models` (as scenario files have them) and the raw `calibration` record."""
    doc: dict[str, Any] = {"models": [profile_to_dict(p) for p in profiles]}
    if calibrations or meta:
        cal: dict[str, Any] = dict(meta or {})
        cal["runs"] = [
            {"model": c.name, "architecture": c.architecture or c.name, "threads": c.threads,
             "batch_images": c.batch_images, "resolution_px": c.resolution_px,
             "limits": [r.to_dict() for r in c.runs]}
            for c in calibrations
        ]
        doc["calibration"] = cal
    return doc


def calibrations_from_document(doc: Mapping[str, Any]) -> list[ModelCalibration]:
    """The raw runs recorded in a profiles file (empty when it has none)."""
    out = []
    for r in (doc.get("calibration") or {}).get("runs", []):
        out.append(ModelCalibration(
            name=str(r["model"]),
            runs=tuple(LimitRun.from_dict(x) for x in r["limits"]),
            threads=int(r.get("threads", 1)),
            batch_images=int(r.get("batch_images", 10)),
            resolution_px=int(r.get("resolution_px", 224)),
            architecture=str(r.get("architecture", "")),
        ))
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"TOML cannot hold {v!r}")
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def to_toml(doc: Mapping[str, Any], header: str = "") -> str:
    """TOML for a profiles document: `[[models]]` tables, then `[calibration]` with inline run tables.

    None values are left out (TOML has no null; a missing limit means "no quota").
    """
    lines = [f"# {x}" if x else "#" for x in header.splitlines()]
    if lines:
        lines.append("")
    for m in doc.get("models", []):
        lines.append("[[models]]")
        lines += [f"{_key(k)} = {_toml_value(v)}" for k, v in m.items() if v is not None]
        lines.append("")
    cal = doc.get("calibration")
    if cal:
        lines.append("[calibration]")
        scalars = {k: v for k, v in cal.items() if k != "runs" and v is not None}
        lines += [f"{_key(k)} = {_toml_value(v)}" for k, v in scalars.items()]
        lines.append("")
        for r in cal.get("runs", []):
            lines.append("[[calibration.runs]]")
            for k, v in r.items():
                if k == "limits":
                    lines.append("limits = [")
                    lines += [f"  {_toml_value({a: b for a, b in x.items() if b is not None})}," for x in v]
                    lines.append("]")
                elif v is not None:
                    lines.append(f"{_key(k)} = {_toml_value(v)}")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
