"""Default Docker Swarm, the baseline every result is compared with.

Swarm sets no CPU limits (the kernel's CFS fair share decides) and places a
task on the node with the fewest running tasks. The policy still observes and
classifies on a fixed interval so its satisfied count is measured with the same
ruler as DQoES's.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.core.classification import classify_views
from shared.core.dqoes import decisions_from
from shared.core.types import Decision, NodeView


class DefaultPolicy:
    """No limits: never changes one (Docker cannot clear NanoCpus, so none are undone)."""

    name = "default"

    def __init__(self, alpha: float = 0.10, interval_s: float = 10.0) -> None:
        self.alpha = alpha
        self.initial_interval_s = interval_s

    def decide(self, view: NodeView) -> Decision:
        cl = classify_views(view.containers)
        ups = {c.name: (c.limit, "default: no limits") for c in view.containers}
        return Decision(
            node=view.node,
            now_s=view.now_s,
            policy=self.name,
            containers=decisions_from(view, cl, ups),
            q_g_s=cl.q_g_s,
            q_b_s=cl.q_b_s,
            satisfied=cl.satisfied,
            interval_s=self.initial_interval_s,
            listener="fixed",
            event=view.event,
        )


def spread_place(running: Mapping[str, int]) -> str:
    """Swarm's spread strategy: the node with the fewest running containers, ties by name."""
    if not running:
        raise ValueError("no nodes to place on")
    return min(running, key=lambda n: (running[n], n))
