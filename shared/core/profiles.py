"""Model profiles: what one batch of a model costs, and the latency curve that follows.

The simulator's physics and the oracle's knowledge both come from here, so the
oracle "knows the latency curve" of exactly the containers the simulator runs.
A profile's efficiency curve says how many CPU-seconds a batch costs when a
CPU quota throttles it (real quotas are not free: on the project's machine a
0.5-core quota doubled ResNet-50's CPU-seconds per batch). Built-in profiles
start from one measurement and published FLOPs; `dqoes calibrate` replaces
them with measurements (see docs/guide/calibration.md once it exists).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

# ResNet-50, 224 px, batch of 100, one intra-op thread, torch 2.13 CPU: 17-19
# CPU-seconds a batch on the project's machine (ENVIRONMENT.md). Others are
# scaled by published multiply-add counts at their native resolutions.
RESNET50_WORK_CPU_S = 18.0
RESNET50_GFLOPS = 4.1
PUBLISHED_GFLOPS = {
    "resnet50": 4.1,
    "vgg16": 15.5,
    "nasnetmobile": 0.564,
    "mobilenetv2": 0.30,
    "inceptionv3": 5.7,
    "xception": 8.4,
}


def whole_threads(limit_cores: float) -> int:
    """Threads a workload that follows its CPU limit runs under `limit_cores`: the whole cores, at least one.

    One rule for the inference service, the simulator's physics and the learned allocator's reading
    of a batch; the epsilon keeps a limit of 2.0 from becoming 1 through float rounding."""
    return max(1, math.floor(limit_cores + 1e-9))


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What one batch costs. CPU in cores; times in seconds."""

    name: str
    work_cpu_s: float
    """CPU-seconds one batch needs when nothing throttles it."""
    threads: int = 1
    """Most cores a batch can use at once (intra-op threads)."""
    overhead_s: float = 0.0
    """Wall time per batch that uses no CPU (I/O, publishing)."""
    efficiency: tuple[tuple[float, float], ...] = ()
    """(limit in cores, CPU-seconds multiplier) points, interpolated; empty = flat 1.0.
    Applies only while a quota below `threads` throttles the container."""
    warmup_factor: float = 1.0
    """Multiplier on the first batch's work (cold caches, lazy init)."""
    batch_images: int = 100
    resolution_px: int = 224
    source: str = "flops-scaled"
    follows_limit: bool = False
    """Its intra-op threads follow its CPU limit, max(1, floor(limit)) up to `threads` (what the
    project's inference workload does unless pinned); one thread with no limit. False: always `threads`."""
    _xs: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("profile name must not be empty")
        if not (math.isfinite(self.work_cpu_s) and self.work_cpu_s > 0):
            raise ValueError(f"work_cpu_s must be > 0, got {self.work_cpu_s!r}")
        if not (isinstance(self.threads, int) and self.threads >= 1):
            raise ValueError(f"threads must be an integer >= 1, got {self.threads!r}")
        if not isinstance(self.follows_limit, bool):
            raise ValueError(f"follows_limit must be true or false, got {self.follows_limit!r}")
        if not (math.isfinite(self.overhead_s) and self.overhead_s >= 0):
            raise ValueError(f"overhead_s must be >= 0, got {self.overhead_s!r}")
        if not (math.isfinite(self.warmup_factor) and self.warmup_factor >= 1):
            raise ValueError(f"warmup_factor must be >= 1, got {self.warmup_factor!r}")
        pts = tuple(sorted((float(c), float(m)) for c, m in self.efficiency))
        for c, m in pts:
            if not (math.isfinite(c) and c > 0 and math.isfinite(m) and m >= 1):
                raise ValueError(
                    f"efficiency points need limit_cores > 0 and multiplier >= 1, got ({c}, {m})"
                )
        for (_, m1), (_, m2) in zip(pts, pts[1:], strict=False):
            if m2 > m1:
                raise ValueError("efficiency multiplier must not grow as the limit grows")
        object.__setattr__(self, "efficiency", pts)
        object.__setattr__(self, "_xs", tuple(c for c, _ in pts))

    def threads_at(self, limit_cores: float | None) -> int:
        """Threads a batch runs under this limit (cores; None: no limit)."""
        if not self.follows_limit:
            return self.threads
        if limit_cores is None:
            return 1
        return min(self.threads, whole_threads(limit_cores))

    def cpu_multiplier(self, limit_cores: float | None) -> float:
        """CPU-seconds per batch relative to an unthrottled batch, under a quota."""
        if limit_cores is None or limit_cores >= self.threads_at(limit_cores) or not self.efficiency:
            return 1.0
        pts = self.efficiency
        if limit_cores <= pts[0][0]:
            return pts[0][1]
        if limit_cores >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right(self._xs, limit_cores)
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        return y0 + (y1 - y0) * (limit_cores - x0) / (x1 - x0)

    def latency_s(self, limit_cores: float | None, node_cores: float) -> float:
        """Batch latency alone on a node with the given quota (None: no quota)."""
        avail = node_cores if limit_cores is None else min(limit_cores, node_cores)
        rate = min(avail, float(self.threads_at(limit_cores)))
        if rate <= 0:
            return math.inf
        return self.work_cpu_s * self.cpu_multiplier(limit_cores) / rate + self.overhead_s

    def fastest_s(self, node_cores: float) -> float:
        """The paper's "fastest-possible response time": alone, owning the node (a workload that
        follows its limit: under a limit of the whole node, so that it runs as many threads as it may)."""
        return self.latency_s(node_cores if self.follows_limit else None, node_cores)

    def with_threads(self, threads: int, follows_limit: bool | None = None) -> ModelProfile:
        """The same model with `threads` (pinned; or, with `follows_limit`, the most it may run)."""
        return ModelProfile(
            self.name,
            self.work_cpu_s,
            threads,
            self.overhead_s,
            self.efficiency,
            self.warmup_factor,
            self.batch_images,
            self.resolution_px,
            self.source,
            self.follows_limit if follows_limit is None else follows_limit,
        )


def with_work(p: ModelProfile, factor: float) -> ModelProfile:
    """`p` with its work per batch times `factor` (a curve that drifted); `p` itself at 1."""
    return p if factor == 1.0 else dataclasses.replace(p, work_cpu_s=p.work_cpu_s * factor)


def at_batch(p: ModelProfile, images: int, resolution_px: int) -> ModelProfile:
    """`p` for batches of `images` at `resolution_px`: its work per batch scaled linearly with the
    images and with the pixels of each (a CNN's FLOPs grow with both; docs/guide/calibration.md, "Profiles
    at another batch size"). Overhead, efficiency and warm-up are kept; the same profile where
    nothing changes."""
    if not (isinstance(images, int) and images >= 1):
        raise ValueError(f"images must be an integer >= 1, got {images!r}")
    if not (isinstance(resolution_px, int) and resolution_px >= 1):
        raise ValueError(f"resolution_px must be an integer >= 1, got {resolution_px!r}")
    if (images, resolution_px) == (p.batch_images, p.resolution_px):
        return p
    factor = images / p.batch_images * (resolution_px / p.resolution_px) ** 2
    return dataclasses.replace(
        p, work_cpu_s=p.work_cpu_s * factor, batch_images=images, resolution_px=resolution_px,
        source=f"{p.source}; scaled from {p.batch_images} images x {p.resolution_px} px",
    )


def flops_scaled(name: str, threads: int = 1) -> ModelProfile:
    gflops = PUBLISHED_GFLOPS[name]
    return ModelProfile(
        name=name,
        work_cpu_s=round(RESNET50_WORK_CPU_S * gflops / RESNET50_GFLOPS, 2),
        threads=threads,
        resolution_px=299 if name in ("inceptionv3", "xception") else 224,
        source=f"flops-scaled from ResNet-50 ({RESNET50_WORK_CPU_S} CPU-s at {RESNET50_GFLOPS} GFLOPs)",
    )


BUILTIN_PROFILES: Mapping[str, ModelProfile] = {n: flops_scaled(n) for n in PUBLISHED_GFLOPS}
"""Paper models by name. `nasnetmobile` is simulated; the real workload stands in MobileNetV2."""

PAPER_MIXED_MODELS = ("vgg16", "nasnetmobile", "inceptionv3", "resnet50", "xception")
"""The paper's Table II, drawn from uniformly in the mixed-model experiments."""


def limit_for_latency(
    profile: ModelProfile, target_s: float, node_cores: float, *, lo: float, hi: float
) -> float | None:
    """Smallest node fraction in [lo, hi] whose solo latency is <= target_s; None if none.

    Latency never rises as the limit grows (the efficiency multiplier never grows
    with the limit, and threads that follow the limit only step up), so bisection finds the boundary.
    """
    if profile.latency_s(hi * node_cores, node_cores) > target_s:
        return None
    if profile.latency_s(lo * node_cores, node_cores) <= target_s:
        return lo
    a, b = lo, hi
    for _ in range(60):
        m = (a + b) / 2
        if profile.latency_s(m * node_cores, node_cores) <= target_s:
            b = m
        else:
            a = m
    return b


def limit_for_min_latency(
    profile: ModelProfile, target_s: float, node_cores: float, *, lo: float, hi: float
) -> float | None:
    """Largest node fraction in [lo, hi] whose solo latency is >= target_s; None if none."""
    if profile.latency_s(lo * node_cores, node_cores) < target_s:
        return None
    if profile.latency_s(hi * node_cores, node_cores) >= target_s:
        return hi
    a, b = lo, hi
    for _ in range(60):
        m = (a + b) / 2
        if profile.latency_s(m * node_cores, node_cores) >= target_s:
            a = m
        else:
            b = m
    return a
