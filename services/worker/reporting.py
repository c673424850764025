"""What a node's worker says about its containers: the node state, and which have gone silent.

The node state (`shared.schema.NodeState`) is what the manager, the dashboard
and `dqoes status` read: each container's class, slack, limit, use and
objective, and the node's totals. A managed container that has sent no batch
for a while is stale: it is reported pending, and a round keeps its limit
(rounds.py) until it reports again.
"""

from __future__ import annotations

from typing import Any

from services.worker.governing import Governing
from shared.core.types import Cls, classify
from shared.schema import ContainerState, NodeState

STALE_MIN_S = 30.0
"""A managed container with no batch for this many wall seconds (or STALE_OBJECTIVES objectives) is stale."""
STALE_OBJECTIVES = 5.0



class Reporting(Governing):
    """The worker's reports: the node state, stale containers."""

    def stale_containers(self) -> set[str]:
        """Managed containers with no batch for `stale_after(objective)` wall seconds.

        Threshold: STALE_MIN_S, or STALE_OBJECTIVES times its objective or its
        latest batch latency (in wall time), whichever is longest. Their limits are kept until they report again.
        A container whose latency the worker reads itself is stale while its source gives no value
        (`unmeasured`, services/worker/polling.py).
        """
        now = self.wall()
        out = {n for n in self.unmeasured if n in self.ctrl.containers and self.ctrl.containers[n].managed}
        for name, at in self.last_batch_at.items():
            t = self.ctrl.containers.get(name)
            if t is None or not t.managed or name in self.polled:  # a polled source says so itself
                continue
            # A slow container (class B) is not silent: its own batches count too.
            batch_wall_s = max(t.objective_s or 0.0, t.last_latency_s or 0.0, t.new_latency_s or 0.0) / self.time_scale
            if now - at > max(STALE_MIN_S, STALE_OBJECTIVES * batch_wall_s):
                out.add(name)
        return out

    def node_state(self) -> NodeState:
        d = self.ctrl.last_decision
        policy = self.ctrl.policy
        params = self.params_in_force()
        cores = self.ctrl.cores
        members: dict[str, list[str]] = {"G": [], "S": [], "B": [], "pending": []}
        used_total = 0.0
        states = []
        sums = {Cls.G: 0.0, Cls.S: 0.0, Cls.B: 0.0}
        stale = self.stale_containers()
        for t in self.ctrl.containers.values():
            # Class and slack from the latest batch, not the last round: a policy that runs a round
            # every minute or two would otherwise report old news between rounds.
            latest = t.new_latency_s or t.last_latency_s
            cls, slack = t.cls, t.slack_s
            if t.managed and latest is not None and t.objective_s is not None:
                alpha = policy.alpha if t.alpha is None else t.alpha
                cls, slack = classify(t.objective_s, latest, alpha), t.objective_s - latest
            if t.managed:
                # A stale container is reported pending: not met, not in band (its class is from old news).
                members["pending" if t.name in stale or not cls else cls.value].append(t.name)
                if cls is not None and slack is not None and t.name not in stale:
                    sums[cls] += slack
            used = None if t.cpu_share is None else t.cpu_share * cores
            used_total += used or 0.0
            met = None
            if t.managed and cls is not None:
                met = cls in (Cls.G, Cls.S) and t.name not in stale
            states.append(
                ContainerState(
                    container=t.name,
                    model=self.models.get(t.name),
                    objective_s=t.objective_s,
                    alpha=t.alpha,
                    latency_s=latest,
                    cls=cls if t.managed else None,
                    slack_s=slack if t.managed else None,
                    limit=t.limit,
                    cpu_share=t.cpu_share,
                    managed=t.managed,
                    met=met,
                    cpu_cores_used=used,
                    throttled_ratio=self.throttled_ratio.get(t.name),
                    last_batch_at=self.last_batch_at.get(t.name),
                    stale=t.name in stale,
                    objective_source=self._objective_source(t.name) if t.managed else None,
                    **self._objective_fields(t.name, t.managed),
                )
            )
        return NodeState(
            node=self.node,
            policy=policy.name,
            cores=self.ctrl.cores,
            round=self.rounds,
            at=self.wall(),
            interval_s=d.interval_s if d else policy.initial_interval_s,
            slack_sum_g_s=sums[Cls.G],
            slack_sum_b_s=sums[Cls.B],
            slack_sum_s_s=sums[Cls.S],
            satisfied=len(members["S"]),
            members={k: tuple(v) for k, v in members.items()},
            containers=tuple(states),
            expected=tuple(self.runtime.expected()),
            params=params,
            met=len(members["S"]) + len(members["G"]),
            # Each container's share is a mean since its own last reading: summed, readings taken at
            # different instants can pass the node by a hair, which no node can use.
            cpu_cores_used=min(cores, used_total),
            cpu_cores_idle=max(0.0, cores - used_total),
            service_objectives={sel: m.revision for sel, m in self.service_objectives.items()},
        )

    def _objective_fields(self, name: str, managed: bool) -> dict[str, Any]:
        """What a container's state says of its objective's kind (service, percentile) and its rate."""
        r = self.resolved.get(name)
        o = None if r is None or not managed else r.objective
        return {"objective_selector": None if o is None or r is None else r.selector,
                "percentile": None if o is None else o.percentile,
                "window_s": None if o is None else o.window_s,
                "request_rate_per_s": self.request_rates.get(name)}
