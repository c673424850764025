"""One node's control loop as a pure state machine: events in, rounds out.

The live worker (asyncio, NATS, Docker) and the simulator (virtual time) both
drive a `NodeController`; neither re-implements any of this. It keeps what the
paper's Application and Worker Monitors keep: each container's objective, its
latest batch latency, its CPU counter at the last round and the limit in force,
and it turns CPU counters into the per-interval use the algorithms need. Time is
always an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.core.guard import Measured, cap_raises, is_raise, throttled_share
from shared.core.policy import Policy
from shared.core.types import (
    CLS_S,
    BatchObs,
    Cls,
    ContainerView,
    Decision,
    NodeView,
    check_fraction,
    is_satisfied,
)

MAX_RECENT = 64
"""Most batches kept per container between two rounds (the oldest go first)."""
READ_LAG_MAX_S = 10.0
"""A batch read longer than this after its workload says it finished is taken as finished when read:
the two clocks disagree (a container's clock stepped or set apart), where a read that late would be a
worker far behind."""


def finished_on_clock(read_s: float, lag_s: float | None, scale: float = 1.0) -> float:
    """When a batch finished on the controller's clock: read at `read_s`, `lag_s` wall seconds after
    its workload stamped its end, on a clock that runs `scale` times wall time. On a busy node a
    batch is read after the round that follows its end; stamped at its read, it would seem to have
    run under that round's limit. No lag (unknown), a negative one or one past READ_LAG_MAX_S: the
    read time."""
    if lag_s is None or not math.isfinite(lag_s) or not 0.0 < lag_s <= READ_LAG_MAX_S:
        return read_s
    return read_s - lag_s * scale


def check_objective(objective_s: float | None) -> None:
    if objective_s is None:
        return
    if isinstance(objective_s, bool) or not isinstance(objective_s, int | float):
        raise ValueError(f"objective_s must be a number, got {type(objective_s).__name__}")
    if not math.isfinite(objective_s) or objective_s <= 0:
        raise ValueError(f"objective_s must be a finite number > 0, got {objective_s!r}")


def check_alpha(alpha: float | None) -> None:
    if alpha is None:
        return
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"alpha must be a number, got {type(alpha).__name__}")
    if not (math.isfinite(alpha) and 0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


@dataclass(slots=True)
class Tracked:
    """What the controller remembers about one container."""

    name: str
    objective_s: float | None = None
    alpha: float | None = None
    limit: float | None = None
    cpu_base_s: float | None = None
    cpu_base_at_s: float | None = None
    cpu_share: float | None = None
    new_latency_s: float | None = None
    last_latency_s: float | None = None
    cls: Cls | None = None
    slack_s: float | None = None
    batches: int = 0
    out_of_band: int = 0
    """Consecutive batches outside the band while classified S."""
    limit_since_s: float = -math.inf
    """When the limit in force was set (batches that started earlier straddle a change)."""
    prev_limit: float | None = None
    """The limit before the one in force."""
    older: tuple[float, float | None] = (-math.inf, None)
    """When `prev_limit` came into force, and the limit before it (a batch read after a change may
    have finished before it)."""
    workload: str | None = None
    """Model and images per batch, as its latest batch reported them (None: not reported)."""
    follows_limit: bool = False
    """Its threads follow its limit, as its latest batch reported."""
    rate_per_s: float | None = None
    """Requests a second in its latest window (a request server read by a polled source)."""
    recent: list[BatchObs] = field(default_factory=list)
    """Batches finished since the last round (at most MAX_RECENT, newest last)."""
    throttle_base: tuple[int, int] | None = None
    """CFS periods and throttled periods at the last round (None: not measured)."""
    throttled_ratio: float | None = None
    """Share of its CFS periods throttled between the last two rounds (None: not measured)."""

    @property
    def managed(self) -> bool:
        return self.objective_s is not None

    def limit_changed(self, now_s: float, old: float | None) -> None:
        """The limit in force changed at `now_s` from `old` (the caller sets the new one)."""
        self.older = (self.limit_since_s, self.prev_limit)
        self.limit_since_s, self.prev_limit = now_s, old

    def ran_under(self, finished_s: float) -> tuple[float | None, float, float | None]:
        """(limit, since, limit before) for a batch that finished at `finished_s`: the limit in force
        then, when it came, and the one before it. One that finished before the last two changes ran
        under limits no longer kept: since is infinite (never clean) and the limit a guess."""
        if finished_s >= self.limit_since_s - 1e-9:
            return self.limit, self.limit_since_s, self.prev_limit
        since, before = self.older
        if finished_s >= since - 1e-9:
            return self.prev_limit, since, before
        return before, math.inf, None


class NodeController:
    """Feeds a policy with views of one node and remembers what it decided."""

    def __init__(self, node: str, cores: float, policy: Policy) -> None:
        if not (math.isfinite(cores) and cores > 0):
            raise ValueError(f"cores must be > 0, got {cores!r}")
        self.node = node
        self.cores = float(cores)
        self.policy = policy
        self.containers: dict[str, Tracked] = {}
        self.next_round_at_s: float = 0.0
        self.rounds = 0
        self.last_decision: Decision | None = None
        self._event: str | None = None

    # -- events -------------------------------------------------------------

    def add(
        self,
        name: str,
        now_s: float,
        *,
        cpu_total_s: float | None = None,
        objective_s: float | None = None,
        alpha: float | None = None,
        limit: float | None = None,
        workload: str | None = None,
    ) -> None:
        """A container appeared on the node (with its CPU counter now, if known, and its model, if
        labelled: its first batch reports the model and images per batch as its workload)."""
        check_objective(objective_s)
        check_alpha(alpha)
        check_fraction(limit, "limit")
        if name in self.containers:
            return
        t = Tracked(name, objective_s, alpha, limit, workload=workload or None)
        if cpu_total_s is not None:
            t.cpu_base_s, t.cpu_base_at_s = cpu_total_s, now_s
        self.containers[name] = t
        if t.managed:
            self._trigger("added", now_s)

    def remove(self, name: str, now_s: float) -> bool:
        t = self.containers.pop(name, None)
        if t is not None and t.managed:
            self._trigger("removed", now_s)
        return t is not None

    def set_objective(
        self, name: str, objective_s: float | None, now_s: float, alpha: float | None = None
    ) -> None:
        """A new or changed objective; None stops managing the container. Raises KeyError."""
        check_objective(objective_s)
        check_alpha(alpha)
        t = self.containers[name]
        if t.objective_s == objective_s and t.alpha == alpha:
            return
        t.objective_s, t.alpha = objective_s, alpha
        self._trigger("objective", now_s)

    def record_latency(
        self, name: str, latency_s: float, now_s: float | None = None, cpu_s: float | None = None,
        workload: str | None = None, *, follows_limit: bool = False,
        span_s: float | None = None, rate_per_s: float | None = None,
    ) -> bool:
        """A batch finished (at `now_s`, when given: when it finished, not when it was read). Unknown
        containers and nonsense values are ignored (False). `span_s`: a window's percentile (a polled
        source) sums up that many seconds before `now_s`; `rate_per_s`: the requests a second it served.

        Reading (Algorithm 2): a batch that takes a satisfied container out of
        its band breaks the stable state, and the paper resets the interval and
        runs Algorithm 1 "immediately". With `now_s` given and the interval
        backed off, two batches in a row outside the band make the next round
        due at once. One is not enough: reacting to every noisy batch at a band
        edge over-steers (measured in the simulator: about 0.2 fewer satisfied
        containers on the paper's scenarios).
        """
        t = self.containers.get(name)
        if t is None or not (math.isfinite(latency_s) and latency_s > 0):
            return False
        t.new_latency_s = latency_s
        t.follows_limit = follows_limit
        if workload:
            t.workload = workload
        if rate_per_s is not None and math.isfinite(rate_per_s) and rate_per_s >= 0:
            t.rate_per_s = rate_per_s
        span = span_s if span_s is not None and math.isfinite(span_s) and span_s > 0 else None
        if now_s is not None:
            # A batch (a window) that began before its limit changed ran partly under the old one.
            limit, since_s, before = t.ran_under(now_s)
            clean = now_s - (latency_s if span is None else max(span, latency_s)) >= since_s - 1e-9
            cpu = cpu_s if cpu_s is not None and math.isfinite(cpu_s) and cpu_s > 0 else None
            t.recent.append(BatchObs(latency_s, now_s, limit, clean, t.batches, cpu, since_s, before, span))
            if len(t.recent) > MAX_RECENT:
                del t.recent[0]
        t.batches += 1
        if t.cls is CLS_S and t.objective_s is not None:
            alpha = self.policy.alpha if t.alpha is None else t.alpha
            t.out_of_band = 0 if is_satisfied(t.objective_s, latency_s, alpha) else t.out_of_band + 1
            if now_s is not None and t.out_of_band >= 2 and self._backed_off():
                self._trigger(f"disturbance: {name} left S", now_s)
        if now_s is not None and t.objective_s is not None and self.policy.wants_round(name, latency_s, now_s):
            self._trigger(f"disturbance: {name} off its curve", now_s)
        return True

    def _backed_off(self) -> bool:
        # At the initial interval the next round is at most IV away anyway.
        d = self.last_decision
        return d is not None and d.interval_s > self.policy.initial_interval_s

    def set_limit(self, name: str, limit: float | None) -> None:
        """The limit actually in force (e.g. after the runtime refused a change)."""
        check_fraction(limit, "limit")
        if name in self.containers:
            self.containers[name].limit = limit

    def _trigger(self, event: str, now_s: float) -> None:
        self._event = self._event or event
        self.next_round_at_s = min(self.next_round_at_s, now_s)

    # -- rounds -------------------------------------------------------------

    def due(self, now_s: float) -> bool:
        return now_s >= self.next_round_at_s

    @property
    def managed(self) -> list[Tracked]:
        return [t for t in self.containers.values() if t.managed]

    def view(self, now_s: float, cpu_totals_s: Mapping[str, float]) -> NodeView:
        """Advance CPU baselines and build the policy's view (consumes new latencies)."""
        alpha = self.policy.alpha
        cores = self.cores
        views = []
        for t in self.containers.values():
            total = cpu_totals_s.get(t.name)
            if total is not None:
                base_s, base_at_s = t.cpu_base_s, t.cpu_base_at_s
                if base_s is None or base_at_s is None:
                    t.cpu_base_s, t.cpu_base_at_s = total, now_s
                elif now_s > base_at_s:  # same instant: keep the last reading
                    used = total - base_s
                    share = used / ((now_s - base_at_s) * cores) if used > 0.0 else 0.0
                    t.cpu_share = share if share < 1.0 else 1.0
                    t.cpu_base_s, t.cpu_base_at_s = total, now_s
            if t.objective_s is None:
                if t.recent:
                    t.recent = []
                continue
            # Positional: this loop is the hot path at 1,000 containers.
            views.append(
                ContainerView(
                    t.name,
                    t.objective_s,
                    alpha if t.alpha is None else t.alpha,
                    t.new_latency_s,
                    t.last_latency_s,
                    t.cpu_share,
                    t.limit,
                    t.cls,
                    t.slack_s,
                    tuple(t.recent),
                    t.workload,
                    t.follows_limit,
                    t.rate_per_s,
                )
            )
            if t.recent:
                t.recent = []
            if t.new_latency_s is not None:
                t.last_latency_s, t.new_latency_s = t.new_latency_s, None
        event, self._event = self._event, None
        return NodeView(self.node, self.cores, now_s, tuple(views), event)

    def run_round(self, now_s: float, cpu_totals_s: Mapping[str, float],
                  throttling: Mapping[str, tuple[int, int]] | None = None) -> Decision:
        """One control round. The caller applies `decision.changes` to its runtime.

        `throttling`: each container's cumulative CFS periods and throttled periods, where the
        runtime measures them. Whatever the policy decides, a raise that the container's measured
        use does not justify is held (shared/core/guard.py)."""
        self._throttled(throttling or {})
        decision = self.policy.decide(self.view(now_s, cpu_totals_s))
        raised = [c.name for c in decision.containers if is_raise(c.old_limit, c.new_limit)]
        if raised:
            cs = self.containers
            measured = {n: Measured(cs[n].cpu_share, cs[n].throttled_ratio) for n in raised}
            decision = cap_raises(decision, measured, self._spare())
        for c in decision.containers:
            t = self.containers[c.name]
            if c.cls is not t.cls:
                t.out_of_band = 0
            if c.new_limit != t.limit:
                t.limit_changed(now_s, t.limit)
            t.limit, t.cls, t.slack_s = c.new_limit, c.cls, c.slack_s
        self.rounds += 1
        self.last_decision = decision
        self.next_round_at_s = now_s + decision.interval_s
        return decision

    def _throttled(self, throttling: Mapping[str, tuple[int, int]]) -> None:
        for t in self.containers.values():
            now = throttling.get(t.name)
            base, t.throttle_base = t.throttle_base, now
            t.throttled_ratio = throttled_share(base, now)

    def _spare(self) -> float | None:
        """The node's CPU no container used over the last interval (None: some use not measured)."""
        used = 0.0
        for t in self.containers.values():
            if t.cpu_share is None:
                return None
            used += t.cpu_share
        return max(0.0, 1.0 - used)
