"""Default Docker Swarm, the baseline every result is compared with.

Swarm sets no CPU limits (the kernel's CFS fair share decides) and places a
task on the node with the fewest running tasks. The policy still observes and
classifies on a fixed interval so its counts are measured with the same
ruler as every other policy's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.core.classification import classify_views
from shared.core.policy import BaseParams, PolicyBase, PolicySpec, build_decision
from shared.core.types import Decision, NodeView


@dataclass(frozen=True, slots=True)
class DefaultParams(BaseParams):
    """Only the reporting band and the observation interval: Swarm itself has no knobs here."""


class DefaultPolicy(PolicyBase):
    """No limits: never changes one (Docker cannot clear NanoCpus, so none are undone)."""

    name = "default"

    def __init__(self, params: DefaultParams | None = None) -> None:
        self.params = params or DefaultParams()

    def decide(self, view: NodeView) -> Decision:
        cl = classify_views(view.containers)
        ups = {c.name: (c.limit, "default: no limits") for c in view.containers}
        return build_decision(self.name, view, cl, ups, interval_s=self.initial_interval_s)


SPEC = PolicySpec(
    name="default",
    label="default Swarm",
    summary="default Docker Swarm: no CPU limits, the kernel's fair share decides (the baseline)",
    params_type=DefaultParams,
    factory=lambda params, context: DefaultPolicy(params),
)


def spread_place(running: Mapping[str, int]) -> str:
    """Swarm's spread strategy: the node with the fewest running containers, ties by name."""
    if not running:
        raise ValueError("no nodes to place on")
    return min(running, key=lambda n: (running[n], n))
