"""Discrete-event simulation of a cluster in virtual time.

The engine owns only the clock and the event queue. Physics is `SimNode`,
control is `NodeController` driving the same policy objects the live worker
uses, placement is the shared spread function. The controller sees what a real
one sees: completed batch latencies and cumulative CPU counters.

Every container's noise comes from its own random stream seeded by (seed,
name), so two policies run on the same scenario and seed meet the same
batches, and their difference is the policy's alone.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.core import registry
from shared.core.controller import NodeController
from shared.core.measures import (
    SETTLED_MOVE,
    converged,
    limit_move,
    plateau,
    settle_summary,
)
from shared.core.oracle import OracleItem, chances_at_rate, expected_plan, plan_node
from shared.core.policy import Policy, PolicyContext
from shared.core.profiles import ModelProfile, with_work
from shared.core.types import Decision, is_met, is_satisfied, workload_of
from shared.scenarios.placement import place
from shared.scenarios.spec import Scenario
from shared.sim.physics import SimNode

PLAN_SETTLE = ("rounds_max", "container_rounds_mean", "change_rounds_mean", "changes_settled_within_3")
"""The settling figures also read on the plans' limits, each as `plan_<name>` in a run's `settle`."""


def _workload(specs: dict[str, Any], b: Any) -> str | None:
    """What a simulated batch reports of its workload, as an inference container's event does."""
    spec = specs.get(b.container)
    return workload_of(spec.model if spec is not None else None, b.images)


def policy_context(scenario: Scenario, work_factor: Callable[[str], float] | None = None) -> PolicyContext:
    """What the simulator can tell a policy: every container's true latency curve, drift included,
    and the noise of its batches."""
    specs = {c.name: c for c in scenario.containers}

    def curve_of(name: str) -> ModelProfile | None:
        c = specs.get(name)
        if c is None:
            return None
        return with_work(scenario.profile_of(c), 1.0 if work_factor is None else work_factor(name))

    return PolicyContext(curve_of, scenario.noise_sigma)


def make_policy(name: str, scenario: Scenario, context: PolicyContext | None = None) -> Policy:
    """A fresh policy instance for one node of the scenario (through the registry)."""
    return registry.build(name, scenario.policy_settings(), context or policy_context(scenario))


@dataclass(slots=True)
class FinalContainer:
    name: str
    node: str
    model: str
    objective_s: float | None
    alpha: float
    latency_s: float | None
    satisfied: bool
    limit: float | None
    cpu_share: float | None
    batches: int
    met: bool = False
    chance_met: float = 0.0
    """Its next batch's chance to be met at the CPU it ends with (`next_batch_chances`)."""
    chance_in_band: float = 0.0


@dataclass(slots=True)
class SimResult:
    scenario: str
    policy: str
    seed: int
    containers: int
    nodes: int
    satisfied_final: int
    """Plateau: the lower median of |S| over the final window, summed over nodes. |S| at an instant
    counts every container's latest batch then, whenever the policy last ran a round: a client
    sees its latest batch, and a policy that rounds rarely is not counted on old news."""
    satisfied_per_node: dict[str, int]
    satisfied_at_end: int
    """|S| at the very end: containers whose latest batch is inside the band."""
    oracle_satisfied: int
    oracle_per_node: dict[str, int]
    converged_round: int | None
    converged_at_s: float | None
    rounds: int
    sim_duration_s: float
    final: list[FinalContainer]
    final_window_s: float = 0.0
    series: list[tuple[float, int]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    met_final: int = 0
    """Plateau of met (latest batch at or under (1 + alpha) x objective), summed over nodes."""
    met_per_node: dict[str, int] = field(default_factory=dict)
    met_at_end: int = 0
    oracle_met: int = 0
    """The most containers any steady allocation could keep met (knows every curve)."""
    ceiling_met: float = 0.0
    """Under the run's noise: the most met any allocation can expect (knows curves and noise)."""
    ceiling_in_band: float = 0.0
    """Under the run's noise: the most in band any allocation can expect."""
    oracle_noise_met: float = 0.0
    """Expected met of the allocation maximising expected met + in band (knows curves and noise)."""
    oracle_noise_in_band: float = 0.0
    oracle_noise_met_median: int = 0
    """Lower median of that allocation's met count per node, summed: the statistic met_final is."""
    oracle_noise_in_band_median: int = 0
    cpu_cores_final: float = 0.0
    """Cores the managed containers used, on average over the final window, all nodes."""
    cores_total: float = 0.0
    limit_changes: int = 0
    container_rounds: int = 0
    """Sum over rounds of the containers each round decided for (the denominator of changes per container per round)."""
    settle: dict[str, Any] = field(default_factory=dict)
    """Rounds that still moved a limit after the last arrival, departure or objective change
    anywhere, and the seconds until the last of them (per node: max and mean); per container,
    the rounds that moved its own limit after its own arrival or last change (max and mean); and
    per change on a node, the rounds that moved a limit there before its next change (mean, max,
    and the share of changes settled within 3). `plan_*`: the same read on the plans' limits
    (ContainerDecision.planned_limit: a move laid over a plan for one batch left out)."""
    met_series: list[tuple[float, int]] = field(default_factory=list)
    expected_met_final: float = 0.0
    """Each container's chance that its next batch is met at the CPU it ends with, on its true curve
    under the run's noise, summed: the policy's final allocation counted without the draw of the
    batches the plateau counts (`next_batch_chances`)."""
    expected_in_band_final: float = 0.0

    @property
    def cpu_cores_idle_final(self) -> float:
        return max(0.0, self.cores_total - self.cpu_cores_final)

    @property
    def changes_per_container_round(self) -> float:
        return self.limit_changes / self.container_rounds if self.container_rounds else 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON object `dqoes experiment run --json` prints."""
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "seed": self.seed,
            "containers": self.containers,
            "nodes": self.nodes,
            "met_final": self.met_final,
            "met_per_node": self.met_per_node,
            "met_at_end": self.met_at_end,
            "satisfied_final": self.satisfied_final,
            "satisfied_per_node": self.satisfied_per_node,
            "satisfied_at_end": self.satisfied_at_end,
            "cpu_cores_final": round(self.cpu_cores_final, 3),
            "cpu_cores_idle_final": round(self.cpu_cores_idle_final, 3),
            "cores_total": self.cores_total,
            "final_window_s": self.final_window_s,
            "oracle_met": self.oracle_met,
            "oracle_satisfied": self.oracle_satisfied,
            "oracle_per_node": self.oracle_per_node,
            "ceiling_met": round(self.ceiling_met, 3),
            "ceiling_in_band": round(self.ceiling_in_band, 3),
            "oracle_noise_met": round(self.oracle_noise_met, 3),
            "oracle_noise_in_band": round(self.oracle_noise_in_band, 3),
            "oracle_noise_met_median": self.oracle_noise_met_median,
            "oracle_noise_in_band_median": self.oracle_noise_in_band_median,
            "expected_met_final": round(self.expected_met_final, 3),
            "expected_in_band_final": round(self.expected_in_band_final, 3),
            "limit_changes": self.limit_changes,
            "changes_per_container_round": round(self.changes_per_container_round, 4),
            "settle": self.settle,
            "converged_round": self.converged_round,
            "converged_at_s": self.converged_at_s,
            "rounds": self.rounds,
            "sim_duration_s": self.sim_duration_s,
            "final": [
                {
                    "container": f.name,
                    "node": f.node,
                    "model": f.model,
                    "objective_s": f.objective_s,
                    "latency_s": _r(f.latency_s),
                    "met": f.met,
                    "satisfied": f.satisfied,
                    "limit": _r(f.limit),
                    "cpu_share": _r(f.cpu_share),
                    "batches": f.batches,
                    "chance_met": round(f.chance_met, 4),
                    "chance_in_band": round(f.chance_in_band, 4),
                }
                for f in self.final
            ],
        }


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def simulate(
    scenario: Scenario,
    policy: str,
    seed: int | None = None,
    *,
    record: bool = False,
    progress: Callable[[float], None] | None = None,
    final_window_s: float = 120.0,
    context: PolicyContext | None = None,
) -> SimResult:
    """Run one scenario under one policy; `record` keeps the per-round timeline.

    `context`: what the policy is told (default: every container's true
    curve, which only the oracle, or a policy asked to use a prior, reads);
    a benchmark passes deliberately wrong curves to test a prior.
    """
    seed = scenario.seed if seed is None else seed
    seed = 1 if seed is None else seed
    end = scenario.duration_s
    nodes = {n.name: SimNode(n.name, n.cores, spells=scenario.spells_of(n.name, seed)) for n in scenario.nodes}
    placed: dict[str, str] = {}

    def work_factor_now(cname: str) -> float:
        node = nodes.get(placed.get(cname, ""))
        sc = node.containers.get(cname) if node is not None else None
        return 1.0 if sc is None else sc.work_factor

    context = policy_context(scenario, work_factor_now) if context is None else context
    ctrls = {n.name: NodeController(n.name, n.cores, make_policy(policy, scenario, context)) for n in scenario.nodes}
    specs = {c.name: c for c in scenario.containers}
    follows = {c.name: scenario.profile_of(c).follows_limit for c in scenario.containers}
    latest: dict[str, float] = {}
    batches: dict[str, int] = {}
    placement = place(scenario)
    timeline: list[dict[str, Any]] = []
    series: list[tuple[float, int]] = []
    node_satisfied = {n: 0 for n in nodes}

    # (time, order, kind, name): order keeps finishes before submits at one instant.
    heap: list[tuple[float, int, str, str]] = []
    for c in scenario.containers:
        heapq.heappush(heap, (c.submit_at_s, 1, "submit", c.name))
        if c.duration_s is not None and c.submit_at_s + c.duration_s < end:
            heapq.heappush(heap, (c.submit_at_s + c.duration_s, 0, "finish", c.name))
        for i, ch in enumerate(c.changes):
            if ch.at_s < end:
                heapq.heappush(heap, (ch.at_s, 3, f"change:{i}", c.name))
    objective_now = {c.name: c.objective_s for c in scenario.containers}
    alpha_of = {c.name: c.alpha if c.alpha is not None else scenario.controller.alpha for c in scenario.containers}
    last_event_s = 0.0
    own_event_s: dict[str, float] = {}
    """Each container's latest arrival or change: its own moves after it are counted."""
    own_moves: dict[str, int] = {}
    node_changes: dict[str, list[float]] = {n: [] for n in nodes}
    """When each node's set of containers, an objective or a curve on it changed."""
    window_at = max(0.0, end - min(final_window_s, end / 10))
    heapq.heappush(heap, (window_at, 2, "window", ""))
    window_cpu: dict[str, float] = {}
    window_cpu_removed: dict[str, float] = {}

    if record:
        timeline.append(
            {
                "kind": "meta",
                "scenario": scenario.name,
                "policy": policy,
                "seed": seed,
                "duration_s": end,
                "nodes": {n.name: n.cores for n in scenario.nodes},
                "containers": {
                    c.name: {"model": c.model, "objective_s": c.objective_s, "submit_at_s": c.submit_at_s}
                    for c in scenario.containers
                },
                "controller": {
                    "alpha": scenario.controller.alpha,
                    "beta": scenario.controller.beta,
                    "initial_interval_s": scenario.controller.initial_interval_s,
                },
            }
        )

    node_met = {n: 0 for n in nodes}
    met_series: list[tuple[float, int]] = []
    # What a client sees: each node's count over its containers' latest batches, at every batch.
    seen_series: dict[str, list[tuple[float, int]]] = {n: [] for n in nodes}
    seen_met_series: dict[str, list[tuple[float, int]]] = {n: [] for n in nodes}

    def recount(node: str, t: float) -> None:
        ok = met = 0
        for cname in nodes[node].containers:
            objective = objective_now[cname]
            ok += is_satisfied(objective, latest.get(cname), alpha_of[cname])
            met += is_met(objective, latest.get(cname), alpha_of[cname])
        for ser, value in ((seen_series[node], ok), (seen_met_series[node], met)):
            if not ser or ser[-1][1] != value:
                ser.append((t, value))

    def changed(node: str, t: float) -> None:
        """A container arrived, left, or had its objective or curve changed on `node`."""
        recount(node, t)
        node_changes[node].append(t)

    round_log: dict[str, list[tuple[float, float]]] = {n: [] for n in nodes}
    plan_log: dict[str, list[tuple[float, float]]] = {n: [] for n in nodes}
    """The same, for the plans' limits: a move laid over a plan for one batch (a rescue) left out."""
    plan_of: dict[str, float | None] = {}
    own_plan_moves: dict[str, int] = {}
    counters = {"changes": 0, "container_rounds": 0}

    def record_round(d: Decision, t: float) -> None:
        node_satisfied[d.node] = d.satisfied
        total = sum(node_satisfied.values())
        series.append((t, total))
        node_met[d.node] = d.met
        met_series.append((t, sum(node_met.values())))
        counters["container_rounds"] += len(d.containers)
        moved = 0.0
        for c in d.changes:
            counters["changes"] += 1
            m = limit_move(c.old_limit, c.new_limit)
            moved = max(moved, m)
            if m > SETTLED_MOVE and t > own_event_s.get(c.name, 0.0):
                own_moves[c.name] = own_moves.get(c.name, 0) + 1
        round_log[d.node].append((t, moved))
        plan_moved = 0.0
        for c in d.containers:
            m = limit_move(plan_of.get(c.name, c.old_limit), c.plan)
            plan_of[c.name] = c.plan
            plan_moved = max(plan_moved, m)
            if m > SETTLED_MOVE and t > own_event_s.get(c.name, 0.0):
                own_plan_moves[c.name] = own_plan_moves.get(c.name, 0) + 1
        plan_log[d.node].append((t, plan_moved))
        if not record:
            return
        counts = d.counts
        timeline.append(
            {
                "kind": "round", "t_s": round(t, 3), "node": d.node, "round": len(series),
                "slack_sum_g_s": round(d.slack_sum_g_s, 3), "slack_sum_b_s": round(d.slack_sum_b_s, 3), "satisfied": d.satisfied,
                "G": counts["G"], "S": counts["S"], "B": counts["B"], "pending": counts["pending"],
                "interval_s": d.interval_s, "listener": d.listener, "event": d.event,
                "satisfied_total": total, "met": d.met, "met_total": met_series[-1][1],
            }
        )
        for c in d.containers:
            timeline.append(
                {
                    "kind": "container", "t_s": round(t, 3), "node": d.node, "round": len(series),
                    "container": c.name, "model": specs[c.name].model,
                    "objective_s": objective_now[c.name],
                    "cls": c.cls.value if c.cls else None, "slack_s": _r(c.slack_s, 3),
                    "limit": _r(c.new_limit), "latency_s": _r(c.latency_s, 3),
                    "cpu_share": _r(c.cpu_share), "reason": c.reason,
                }
            )

    t = 0.0
    next_progress = 0.0
    while True:
        t_evt = heap[0][0] if heap else math.inf
        t_node = min(n.next_event_s() for n in nodes.values())
        t_round = min(
            (ctrls[n].next_round_at_s for n in nodes if ctrls[n].managed),
            default=math.inf,
        )
        t = min(t_evt, t_node, t_round, end)
        for name, node in nodes.items():
            done = node.advance(t)
            for b in done:
                ctrls[name].record_latency(b.container, b.latency_s, t, b.cpu_s, _workload(specs, b),
                                           follows_limit=follows.get(b.container, False))
                latest[b.container] = b.latency_s
                batches[b.container] = batches.get(b.container, 0) + 1
            if done:
                recount(name, t)
        while heap and heap[0][0] <= t:
            _, _, kind, cname = heapq.heappop(heap)
            if kind == "window":
                window_cpu = {k: v for n in nodes.values() for k, v in n.cpu_totals().items()}
                continue
            spec = specs[cname]
            last_event_s = t
            if kind != "finish":
                own_event_s[cname] = t
                own_moves[cname] = 0
                own_plan_moves[cname] = 0
            if kind.startswith("change:"):
                ch = spec.changes[int(kind.split(":")[1])]
                where = placed.get(cname)
                if where is None or cname not in nodes[where].containers:
                    continue
                if ch.work_factor is not None:
                    for b in nodes[where].set_work_factor(cname, ch.work_factor, t):
                        ctrls[where].record_latency(b.container, b.latency_s, t, b.cpu_s, _workload(specs, b),
                                                    follows_limit=follows.get(b.container, False))
                        latest[b.container] = b.latency_s
                        batches[b.container] = batches.get(b.container, 0) + 1
                if ch.objective_s is not None:
                    objective_now[cname] = ch.objective_s
                    ctrls[where].set_objective(cname, ch.objective_s, t, spec.alpha)
                changed(where, t)
                continue
            if kind == "submit":
                where = placement[cname]
                placed[cname] = where
                limit = None if spec.cpus is None else spec.cpus / nodes[where].cores
                nodes[where].add(
                    cname, scenario.profile_of(spec), t, random.Random(f"noise:{seed}:{cname}"),
                    scenario.noise_sigma, limit, scenario.noise_rho,
                )
                ctrls[where].add(cname, t, cpu_total_s=0.0, objective_s=spec.objective_s,
                                 alpha=spec.alpha, limit=limit, workload=spec.model)
                changed(where, t)
            else:
                where = placed[cname]
                if t > window_at and spec.objective_s is not None:
                    gone = nodes[where].containers.get(cname)
                    if gone is not None:
                        window_cpu_removed[cname] = gone.cpu_total_s - window_cpu.get(cname, 0.0)
                nodes[where].remove(cname, t)
                ctrls[where].remove(cname, t)
                latest.pop(cname, None)
                plan_of.pop(cname, None)
                changed(where, t)
                if not ctrls[where].managed:
                    node_satisfied[where] = 0
        for name, ctrl in ctrls.items():
            if ctrl.managed and ctrl.due(t):
                d = ctrl.run_round(t, nodes[name].cpu_totals())
                for cd in d.changes:
                    nodes[name].set_limit(cd.name, cd.new_limit, t)
                record_round(d, t)
        if progress is not None and t >= next_progress:
            progress(t / end)
            next_progress = t + end / 100
        if t >= end:
            break

    final: list[FinalContainer] = []
    at_end = {n: 0 for n in nodes}
    met_end = {n: 0 for n in nodes}
    oracle_per_node = {}
    oracle_met = 0
    noisy: dict[str, Any] = {"ceiling_met": 0.0, "ceiling_in_band": 0.0, "oracle_noise_met": 0.0,
                             "oracle_noise_in_band": 0.0, "oracle_noise_met_median": 0,
                             "oracle_noise_in_band_median": 0}
    span = end - window_at
    cpu_window_s = sum(window_cpu_removed.values())
    for name, node in nodes.items():
        ctrl = ctrls[name]
        items = []
        chances = next_batch_chances(node, objective_now, alpha_of)
        for cname, sc in node.containers.items():
            spec = specs[cname]
            alpha = alpha_of[cname]
            objective = objective_now[cname]
            lat = latest.get(cname)
            ok = is_satisfied(objective, lat, alpha)
            met = is_met(objective, lat, alpha)
            at_end[name] += ok
            met_end[name] += met
            used = sc.cpu_total_s - window_cpu.get(cname, 0.0)
            if objective is not None:
                cpu_window_s += used
            began = max(window_at, sc.started_at_s)
            share = used / ((end - began) * node.cores) if end > began and span > 0 else None
            tracked = ctrl.containers.get(cname)
            final.append(
                FinalContainer(cname, name, spec.model, objective, alpha, lat, ok,
                               tracked.limit if tracked else sc.limit, share, batches.get(cname, 0), met,
                               *chances.get(cname, (0.0, 0.0)))
            )
            if objective is not None:
                items.append(OracleItem(cname, objective, alpha, sc.current_profile))
        plan = plan_node(items, node.cores, scenario.controller.total_resource)
        oracle_per_node[name] = plan.count
        oracle_met += plan.met_count
        ex = expected_plan(items, node.cores, scenario.noise_sigma, scenario.controller.total_resource)
        noisy["ceiling_met"] += ex.met_ceiling
        noisy["ceiling_in_band"] += ex.in_band_ceiling
        noisy["oracle_noise_met"] += ex.met
        noisy["oracle_noise_in_band"] += ex.in_band
        noisy["oracle_noise_met_median"] += ex.met_median
        noisy["oracle_noise_in_band_median"] += ex.in_band_median
    if progress is not None:
        progress(1.0)
    conv, conv_at = converged(series)
    per_node = {n: plateau(seen_series[n], window_at, end) for n in nodes}
    met_per_node = {n: plateau(seen_met_series[n], window_at, end) for n in nodes}
    settle = {"after_s": round(last_event_s, 3), **settle_summary(round_log, own_moves, node_changes, last_event_s)}
    # The same read on the plans' limits (the same as above for every policy that lays nothing over its plan).
    plan_settle = settle_summary(plan_log, own_plan_moves, node_changes, last_event_s)
    settle.update({f"plan_{k}": plan_settle[k] for k in PLAN_SETTLE})
    return SimResult(
        scenario=scenario.name,
        policy=policy,
        seed=seed,
        containers=len(scenario.containers),
        nodes=len(scenario.nodes),
        satisfied_final=sum(per_node.values()),
        satisfied_per_node=per_node,
        satisfied_at_end=sum(at_end.values()),
        oracle_satisfied=sum(oracle_per_node.values()),
        oracle_per_node=oracle_per_node,
        converged_round=conv,
        converged_at_s=conv_at,
        rounds=sum(c.rounds for c in ctrls.values()),
        sim_duration_s=end,
        final=sorted(final, key=lambda f: f.name),
        final_window_s=end - window_at,
        series=series,
        timeline=timeline,
        met_final=sum(met_per_node.values()),
        met_per_node=met_per_node,
        met_at_end=sum(met_end.values()),
        oracle_met=oracle_met,
        **noisy,
        cpu_cores_final=cpu_window_s / span if span > 0 else 0.0,
        cores_total=sum(n.cores for n in nodes.values()),
        limit_changes=counters["changes"],
        container_rounds=counters["container_rounds"],
        settle=settle,
        met_series=met_series,
        expected_met_final=sum(f.chance_met for f in final),
        expected_in_band_final=sum(f.chance_in_band for f in final),
    )


def next_batch_chances(node: SimNode, objective_of: dict[str, float | None],
                       alpha_of: dict[str, float]) -> dict[str, tuple[float, float]]:
    """(P(met), P(in band)) of each container's next batch at the limits the node ends with.

    Each computes at the rate CFS gives it with every container on the node computing at once (its
    limit, or its fair part of a node its limits overcommit), on its true curve (its work as it is
    now) under the noise the simulator draws: what a policy's last allocation is worth, without
    the luck of the few batches a plateau counts. Containers with no objective are left out."""
    cs = list(node.containers.values())
    out = {}
    for c, rate in zip(cs, node.cfs_rates(cs), strict=True):
        objective = objective_of.get(c.name)
        if objective is None:
            continue
        limit_cores = None if c.limit is None else c.limit * node.cores
        out[c.name] = chances_at_rate(c.current_profile, limit_cores, rate, objective, alpha_of[c.name],
                                      c.noise_sigma)
    return out
