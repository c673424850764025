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

from shared.core.baselines import DefaultPolicy
from shared.core.controller import NodeController, Policy
from shared.core.dqoes import DQoESPolicy
from shared.core.oracle import OracleItem, OraclePolicy, plan_node
from shared.core.types import Decision, is_satisfied
from shared.sim.physics import SimNode
from shared.sim.placement import place
from shared.sim.scenario import Scenario

POLICIES = ("dqoes", "default", "oracle")


def make_policy(name: str, scenario: Scenario) -> Policy:
    """A fresh policy instance for one node of the scenario."""
    p = scenario.controller
    if name == "dqoes":
        return DQoESPolicy(p)
    if name == "default":
        return DefaultPolicy(alpha=p.alpha, interval_s=p.initial_interval_s)
    if name == "oracle":
        profiles = {c.name: scenario.profile_of(c) for c in scenario.containers}
        return OraclePolicy(profiles, alpha=p.alpha, interval_s=p.initial_interval_s, total_resource=p.total_resource)
    raise ValueError(f"unknown policy {name!r} (choose from {', '.join(POLICIES)})")


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


@dataclass(slots=True)
class SimResult:
    scenario: str
    policy: str
    seed: int
    containers: int
    nodes: int
    satisfied_final: int
    """Plateau: the lower median of |S| over the final window, summed over nodes."""
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

    def summary(self) -> dict[str, Any]:
        """The JSON object `dqoes experiment run --json` prints."""
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "seed": self.seed,
            "containers": self.containers,
            "nodes": self.nodes,
            "satisfied_final": self.satisfied_final,
            "satisfied_per_node": self.satisfied_per_node,
            "satisfied_at_end": self.satisfied_at_end,
            "final_window_s": self.final_window_s,
            "oracle_satisfied": self.oracle_satisfied,
            "oracle_per_node": self.oracle_per_node,
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
                    "satisfied": f.satisfied,
                    "limit": _r(f.limit),
                    "cpu_share": _r(f.cpu_share),
                    "batches": f.batches,
                }
                for f in self.final
            ],
        }


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(x, nd)


def plateau(series: list[tuple[float, int]], start_s: float, end_s: float, samples: int = 61) -> int:
    """Lower median of a step function |S|(t) sampled evenly over [start_s, end_s].

    One instant of a noisy system is a coin flip at the band edges; the
    paper reads the level its figures settle at. Lower median: a tie counts
    against the policy.
    """
    if not series:
        return 0
    vals = []
    j = -1
    for k in range(samples):
        t = start_s + (end_s - start_s) * k / max(1, samples - 1)
        while j + 1 < len(series) and series[j + 1][0] <= t:
            j += 1
        vals.append(series[j][1] if j >= 0 else 0)
    vals.sort()
    return vals[(len(vals) - 1) // 2]


def converged(series: list[tuple[float, int]]) -> tuple[int | None, float | None]:
    """First round (1-based) after which |S| never changed again; None if it moved last round."""
    if not series:
        return None, None
    last_change = 0
    for i in range(1, len(series)):
        if series[i][1] != series[i - 1][1]:
            last_change = i
    if last_change == len(series) - 1 and len(series) > 1:
        return None, None
    return last_change + 1, series[last_change][0]


def simulate(
    scenario: Scenario,
    policy: str,
    seed: int | None = None,
    *,
    record: bool = False,
    progress: Callable[[float], None] | None = None,
    final_window_s: float = 120.0,
) -> SimResult:
    """Run one scenario under one policy; `record` keeps the per-round timeline."""
    seed = scenario.seed if seed is None else seed
    seed = 1 if seed is None else seed
    end = scenario.duration_s
    nodes = {n.name: SimNode(n.name, n.cores) for n in scenario.nodes}
    ctrls = {n.name: NodeController(n.name, n.cores, make_policy(policy, scenario)) for n in scenario.nodes}
    specs = {c.name: c for c in scenario.containers}
    placed: dict[str, str] = {}
    latest: dict[str, float] = {}
    batches: dict[str, int] = {}
    placement = place(scenario)
    timeline: list[dict[str, Any]] = []
    series: list[tuple[float, int]] = []
    node_satisfied = {n: 0 for n in nodes}
    node_series: dict[str, list[tuple[float, int]]] = {n: [] for n in nodes}

    # (time, order, kind, name): order keeps finishes before submits at one instant.
    heap: list[tuple[float, int, str, str]] = []
    for c in scenario.containers:
        heapq.heappush(heap, (c.submit_at_s, 1, "submit", c.name))
        if c.duration_s is not None and c.submit_at_s + c.duration_s < end:
            heapq.heappush(heap, (c.submit_at_s + c.duration_s, 0, "finish", c.name))
    window_at = max(0.0, end - min(final_window_s, end / 10))
    heapq.heappush(heap, (window_at, 2, "window", ""))
    window_cpu: dict[str, float] = {}

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

    def record_round(d: Decision, t: float) -> None:
        node_satisfied[d.node] = d.satisfied
        node_series[d.node].append((t, d.satisfied))
        total = sum(node_satisfied.values())
        series.append((t, total))
        if not record:
            return
        counts = d.counts
        timeline.append(
            {
                "kind": "round", "t_s": round(t, 3), "node": d.node, "round": len(series),
                "q_g_s": round(d.q_g_s, 3), "q_b_s": round(d.q_b_s, 3), "satisfied": d.satisfied,
                "G": counts["G"], "S": counts["S"], "B": counts["B"], "pending": counts["pending"],
                "interval_s": d.interval_s, "listener": d.listener, "event": d.event,
                "satisfied_total": total,
            }
        )
        for c in d.containers:
            timeline.append(
                {
                    "kind": "container", "t_s": round(t, 3), "node": d.node, "round": len(series),
                    "container": c.name, "model": specs[c.name].model,
                    "objective_s": specs[c.name].objective_s,
                    "cls": c.cls.value if c.cls else None, "q_s": _r(c.q_s, 3),
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
            for b in node.advance(t):
                ctrls[name].record_latency(b.container, b.latency_s, t)
                latest[b.container] = b.latency_s
                batches[b.container] = batches.get(b.container, 0) + 1
        while heap and heap[0][0] <= t:
            _, _, kind, cname = heapq.heappop(heap)
            if kind == "window":
                window_cpu = {k: v for n in nodes.values() for k, v in n.cpu_totals().items()}
                continue
            spec = specs[cname]
            if kind == "submit":
                where = placement[cname]
                placed[cname] = where
                limit = None if spec.cpus is None else spec.cpus / nodes[where].cores
                nodes[where].add(
                    cname, scenario.profile_of(spec), t, random.Random(f"noise:{seed}:{cname}"),
                    scenario.noise_sigma, limit,
                )
                ctrls[where].add(cname, t, cpu_total_s=0.0, objective_s=spec.objective_s,
                                 alpha=spec.alpha, limit=limit)
            else:
                where = placed[cname]
                nodes[where].remove(cname, t)
                ctrls[where].remove(cname, t)
                latest.pop(cname, None)
                if not ctrls[where].managed:
                    node_satisfied[where] = 0
                    node_series[where].append((t, 0))
        for name, ctrl in ctrls.items():
            if ctrl.managed and ctrl.due(t):
                d = ctrl.run_round(t, nodes[name].cpu_totals())
                for ch in d.changes:
                    nodes[name].set_limit(ch.name, ch.new_limit, t)
                record_round(d, t)
        if progress is not None and t >= next_progress:
            progress(t / end)
            next_progress = t + end / 100
        if t >= end:
            break

    final: list[FinalContainer] = []
    at_end = {n: 0 for n in nodes}
    oracle_per_node = {}
    for name, node in nodes.items():
        ctrl = ctrls[name]
        items = []
        span = end - window_at
        for cname, sc in node.containers.items():
            spec = specs[cname]
            alpha = spec.alpha if spec.alpha is not None else scenario.controller.alpha
            lat = latest.get(cname)
            ok = is_satisfied(spec.objective_s, lat, alpha)
            at_end[name] += ok
            used = sc.cpu_total_s - window_cpu.get(cname, 0.0)
            began = max(window_at, sc.started_at_s)
            share = used / ((end - began) * node.cores) if end > began and span > 0 else None
            tracked = ctrl.containers.get(cname)
            final.append(
                FinalContainer(cname, name, spec.model, spec.objective_s, alpha, lat, ok,
                               tracked.limit if tracked else sc.limit, share, batches.get(cname, 0))
            )
            if spec.objective_s is not None:
                items.append(OracleItem(cname, spec.objective_s, alpha, scenario.profile_of(spec)))
        oracle_per_node[name] = plan_node(items, node.cores, scenario.controller.total_resource).count
    if progress is not None:
        progress(1.0)
    conv, conv_at = converged(series)
    per_node = {n: plateau(node_series[n], window_at, end) for n in nodes}
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
    )
