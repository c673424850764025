"""The simulated node: how containers share CPU and how long their batches take.

Physics (docs/design/simulator.md says the same in prose):
- a node has `cores`; a container runs batch after batch; a batch needs
  `work_cpu_s` CPU-seconds (times a per-batch log-normal noise factor, times the
  profile's efficiency multiplier while a quota below its thread count throttles
  it) at no more than `threads` cores (for a workload whose threads follow its
  limit, max(1, floor(limit)) of them: a staircase above one core), then
  `overhead_s` of wall time using no CPU;
- at every moment a computing container's CPU rate is min(its limit, its
  threads, its CFS fair share), the fair share found by water-filling the
  node's cores over the computing containers (equal weights, like Docker's
  default cpu-shares);
- during a node's slow spells (`spells`: start, end, factor) the computing part
  of every batch on it progresses `factor` times slower at the same CPU rate
  (its overhead does not), as contended memory bandwidth or caches may do;
- rates are piecewise constant, so the node advances from one phase end (or
  spell edge) to the next exactly (no time step).

`SimNode` knows nothing of policies or event queues: the discrete-event engine
drives it in virtual time, and the live "sim" runtime drives it against a
(scaled) wall clock, so both see the same physics.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared.core.profiles import ModelProfile, with_work

_EPS = 1e-9


def water_fill(caps: Sequence[float], capacity: float) -> list[float]:
    """CFS fair share: each gets min(cap, level), the level chosen to use the capacity."""
    n = len(caps)
    if n == 0:
        return []
    if sum(caps) <= capacity:
        return list(caps)
    rates = [0.0] * n
    left, k = capacity, n
    for i in sorted(range(n), key=caps.__getitem__):
        share = left / k
        r = caps[i] if caps[i] <= share else share
        rates[i] = r
        left -= r
        k -= 1
    return rates


@dataclass(frozen=True, slots=True)
class BatchDone:
    """One finished batch, as an inference container would report it."""

    container: str
    finished_at_s: float
    latency_s: float
    cpu_s: float
    images: int
    batch: int


@dataclass(slots=True)
class SimContainer:
    name: str
    profile: ModelProfile
    rng: random.Random
    noise_sigma: float
    limit: float | None = None
    started_at_s: float = 0.0
    batch: int = 0
    batch_started_at_s: float = 0.0
    batch_cpu_s: float = 0.0
    work_left: float = 0.0
    overhead_left: float = 0.0
    computing: bool = True
    rate: float = 0.0
    cpu_total_s: float = 0.0
    history: list[BatchDone] = field(default_factory=list)
    work_factor: float = 1.0
    """Multiplier on the profile's work (a drifting curve); 1.0: the profile itself."""
    noise_rho: float = 0.0
    """Lag-one correlation of the log noise from one batch to the next (0: independent batches)."""
    noise_z: float | None = None
    """The last batch's log noise in units of noise_sigma (with noise_rho > 0)."""

    @property
    def current_profile(self) -> ModelProfile:
        """Its profile with its work per batch as it is now (its work factor applied)."""
        return with_work(self.profile, self.work_factor)

    def start_batch(self, now_s: float) -> None:
        if self.noise_sigma > 0 and self.noise_rho > 0:
            # AR(1) in the log: each batch's noise has the same spread as independent ones (sd
            # noise_sigma), but slow and fast spells last, as on a real node (docs/design/simulator.md).
            step = self.rng.gauss(0.0, 1.0)
            z = step if self.noise_z is None else self.noise_rho * self.noise_z + math.sqrt(1 - self.noise_rho**2) * step
            self.noise_z = z
            noise = math.exp(self.noise_sigma * z)
        else:
            noise = math.exp(self.rng.gauss(0.0, self.noise_sigma)) if self.noise_sigma > 0 else 1.0
        warm = self.profile.warmup_factor if self.batch == 0 else 1.0
        self.work_left = self.profile.work_cpu_s * self.work_factor * noise * warm
        self.overhead_left = self.profile.overhead_s
        self.batch_started_at_s = now_s
        self.batch_cpu_s = 0.0
        self.computing = True


class SimNode:
    """A node's containers and their CPU; advance it to any later time."""

    def __init__(self, name: str, cores: float, keep_history: bool = False,
                 spells: Sequence[tuple[float, float, float]] = ()) -> None:
        if not (math.isfinite(cores) and cores > 0):
            raise ValueError(f"cores must be > 0, got {cores!r}")
        self.name = name
        self.cores = float(cores)
        self.now_s = 0.0
        self.containers: dict[str, SimContainer] = {}
        self.keep_history = keep_history
        self.slow = 1.0
        """How many times slower every batch progresses now (a node-wide spell; 1.0: none)."""
        edges: list[tuple[float, float]] = []
        for start, end, factor in sorted(spells):
            if not (math.isfinite(factor) and factor > 0 and end >= start):
                raise ValueError(f"a spell needs start <= end and a factor > 0, got {(start, end, factor)!r}")
            if edges and start < edges[-1][0]:
                raise ValueError("spells must not overlap")
            edges += [(start, factor), (end, 1.0)]
        self._edges = edges
        """Spell edges to come, in time order: (when, the node's slowness from then on)."""

    def add(
        self,
        name: str,
        profile: ModelProfile,
        now_s: float,
        rng: random.Random,
        noise_sigma: float = 0.03,
        limit: float | None = None,
        noise_rho: float = 0.0,
    ) -> SimContainer:
        if name in self.containers:
            raise ValueError(f"container {name!r} already on node {self.name}")
        if not 0.0 <= noise_rho < 1.0:
            raise ValueError(f"noise_rho must be in [0, 1), got {noise_rho!r}")
        self.advance(now_s)
        c = SimContainer(name, profile, rng, noise_sigma, limit, started_at_s=now_s, noise_rho=noise_rho)
        c.start_batch(now_s)
        self.containers[name] = c
        self._rates()
        return c

    def remove(self, name: str, now_s: float) -> list[BatchDone]:
        done = self.advance(now_s)
        if self.containers.pop(name, None) is not None:
            self._rates()
        return done

    def set_limit(self, name: str, limit: float | None, now_s: float) -> list[BatchDone]:
        """Limit as a fraction of the node (None: no quota)."""
        done = self.advance(now_s)
        self.containers[name].limit = limit
        self._rates()
        return done

    def set_work_factor(self, name: str, factor: float, now_s: float) -> list[BatchDone]:
        """The container's curve changes now: the rest of this batch and every later one cost `factor` x."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"work factor must be > 0, got {factor!r}")
        done = self.advance(now_s)
        c = self.containers[name]
        if c.computing:
            c.work_left *= factor / c.work_factor
        c.work_factor = factor
        self._rates()
        return done

    def cpu_total_s(self, name: str) -> float:
        return self.containers[name].cpu_total_s

    def cpu_totals(self) -> dict[str, float]:
        return {n: c.cpu_total_s for n, c in self.containers.items()}

    def _multiplier(self, c: SimContainer) -> float:
        return c.profile.cpu_multiplier(None if c.limit is None else c.limit * self.cores) * self.slow

    def cfs_rates(self, containers: Sequence[SimContainer]) -> list[float]:
        """The cores CFS gives each of these containers while they all compute: each capped by its
        threads and its limit, the node shared fairly among them."""
        caps = []
        for c in containers:
            limit_cores = None if c.limit is None else c.limit * self.cores
            cap = float(c.profile.threads_at(limit_cores))
            if limit_cores is not None:
                cap = min(cap, limit_cores)
            caps.append(cap)
        return water_fill(caps, self.cores)

    def _rates(self) -> None:
        active = [c for c in self.containers.values() if c.computing]
        for c, r in zip(active, self.cfs_rates(active), strict=True):
            c.rate = r
        for c in self.containers.values():
            if not c.computing:
                c.rate = 0.0

    def next_event_s(self) -> float:
        """When the next phase (compute or overhead) of any container ends."""
        return self._next()[0]

    def _next(self) -> tuple[float, SimContainer | None]:
        best, who = math.inf, None
        for c in self.containers.values():
            if c.computing:
                if c.rate <= 0:
                    continue
                t = self.now_s + c.work_left * self._multiplier(c) / c.rate
            else:
                t = self.now_s + c.overhead_left
            if t < best:
                best, who = t, c
        return best, who

    def _integrate(self, dt: float) -> None:
        if dt <= 0:
            return
        for c in self.containers.values():
            if c.computing:
                used = c.rate * dt
                c.cpu_total_s += used
                c.batch_cpu_s += used
                c.work_left -= used / self._multiplier(c)
            else:
                c.overhead_left -= dt

    def advance(self, to_s: float) -> list[BatchDone]:
        """Run the node forward to `to_s`, returning the batches that finished."""
        done: list[BatchDone] = []
        while True:
            t_next, first = self._next()
            if self._edges and self._edges[0][0] < t_next and self._edges[0][0] <= to_s:
                # A spell starts or ends before any phase does: progress changes pace there.
                at, slow = self._edges.pop(0)
                self._integrate(at - self.now_s)
                self.now_s, self.slow = max(self.now_s, at), slow
                continue
            if t_next > to_s:
                self._integrate(to_s - self.now_s)
                self.now_s = max(self.now_s, to_s)
                return done
            self._integrate(t_next - self.now_s)
            self.now_s = t_next
            # The container that defined t_next ends its phase even if rounding
            # left a sliver of work or overhead.
            assert first is not None
            if first.computing:
                first.work_left = min(first.work_left, 0.0)
            else:
                first.overhead_left = min(first.overhead_left, 0.0)
            changed = False
            for c in self.containers.values():
                if c.computing and c.work_left <= _EPS * max(1.0, c.profile.work_cpu_s):
                    c.computing = False
                    changed = True
                    if c.overhead_left > 0:
                        continue
                if not c.computing and c.overhead_left <= _EPS:
                    b = BatchDone(
                        c.name,
                        self.now_s,
                        self.now_s - c.batch_started_at_s,
                        c.batch_cpu_s,
                        c.profile.batch_images,
                        c.batch,
                    )
                    done.append(b)
                    if self.keep_history:
                        c.history.append(b)
                    c.batch += 1
                    c.start_batch(self.now_s)
                    changed = True
            if changed:
                self._rates()


def batches_by_container(done: Iterable[BatchDone]) -> dict[str, list[BatchDone]]:
    out: dict[str, list[BatchDone]] = {}
    for b in done:
        out.setdefault(b.container, []).append(b)
    return out
