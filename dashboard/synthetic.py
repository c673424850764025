"""Made-up node states of a cluster of any size, for the benchmark and the tests.

Why: the dashboard's speed goal is stated for 40 containers on 4 workers
over 1,000 rounds, and its tests need states with known numbers; a real
cluster gives neither quickly nor reproducibly. The states here are valid
`NodeState`s (they pass the schema's checks), reproducible from a seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from shared.core.types import Cls, classify
from shared.schema import ContainerState, DecisionMsg, NodeState

ALPHA = 0.1


def node_states(
    nodes: int = 4,
    per_node: int = 10,
    rounds: int = 1000,
    *,
    seed: int = 1,
    start_at: float = 1_700_000_000.0,
    every_s: float = 1.0,
    cores: float = 4.6,
) -> Iterator[tuple[NodeState, DecisionMsg]]:
    """`rounds` rounds of every node, in time order: each round's decision and then its state."""
    rng = random.Random(seed)
    names = [[f"c{n * per_node + i + 1:02d}" for i in range(per_node)] for n in range(nodes)]
    objective = {c: rng.uniform(5.0, 100.0) for row in names for c in row}
    limit = {c: 1.0 / per_node for row in names for c in row}
    for r in range(rounds):
        for n in range(nodes):
            node = f"worker-{n + 1}"
            at = start_at + r * every_s + n * every_s / nodes
            members: dict[str, list[str]] = {"G": [], "S": [], "B": [], "pending": []}
            states = []
            q_g = q_b = 0.0
            for c in names[n]:
                latency = objective[c] * rng.uniform(0.7, 1.3)
                cls = classify(objective[c], latency, ALPHA)
                q = objective[c] - latency
                members[cls.value].append(c)
                if cls is Cls.G:
                    q_g += q
                elif cls is Cls.B:
                    q_b += q
                limit[c] = min(1.0, max(0.01, limit[c] * rng.uniform(0.9, 1.1)))
                states.append(
                    ContainerState(
                        container=c,
                        model="resnet50",
                        objective_s=objective[c],
                        alpha=ALPHA,
                        latency_s=latency,
                        cls=cls,
                        slack_s=q,
                        limit=limit[c],
                        cpu_share=limit[c] * rng.uniform(0.5, 1.0),
                    )
                )
            interval = 10.0 * (1 + r % 4)
            ns = NodeState(
                node=node,
                policy="dqoes",
                cores=cores,
                round=r + 1,
                at=at,
                interval_s=interval,
                slack_sum_g_s=q_g,
                slack_sum_b_s=q_b,
                satisfied=len(members["S"]),
                met=len(members["G"]) + len(members["S"]),
                members={k: tuple(v) for k, v in members.items()},
                containers=tuple(states),
                params={"alpha": ALPHA},
            )
            d = DecisionMsg(
                node=node,
                policy="dqoes",
                round=r + 1,
                at=at,
                listener="kept",
                interval_s=interval,
                slack_sum_g_s=q_g,
                slack_sum_b_s=q_b,
                satisfied=len(members["S"]),
                containers=(),
            )
            yield ns, d
