"""Real inference processes for a worker on the cgroup runtime.

Why: on a machine without Docker, `dqoes up --runtime cgroup` still runs the
real thing: each container of the scenario placed on this node becomes a
`python -m services.inference` process (a real torch model publishing its
batches on NATS) that the cgroup runtime starts in its own cgroup at the
container's submit time, in wall seconds. The worker then governs them
exactly as it governs Docker containers. Started as a separate program, so
the worker never imports the inference service.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.runtime.base import RuntimeFailure
from shared.runtime.cgroup import CgroupRuntime
from shared.sim.placement import place
from shared.sim.scenario import ContainerSpec, Scenario

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    """How each inference process runs: images a batch and their side in pixels (None: the model's)."""

    batch: int = 100
    resolution_px: int | None = None


def inference_argv(c: ContainerSpec, node: str, nats_url: str, ws: WorkloadSettings) -> list[str]:
    argv = [sys.executable, "-m", "services.inference", "--name", c.name, "--node", node,
            "--model", c.model, "--batch", str(ws.batch), "--nats", nats_url]
    if ws.resolution_px is not None:
        argv += ["--resolution", str(ws.resolution_px)]
    return argv


def node_containers(scenario: Scenario, node: str) -> list[ContainerSpec]:
    """This node's containers in submit order (the simulator's placement for unpinned ones)."""
    placement = place(scenario)
    return sorted((c for c in scenario.containers if placement[c.name] == node),
                  key=lambda c: (c.submit_at_s, c.name))


async def launch(
    runtime: CgroupRuntime,
    scenario: Scenario,
    node: str,
    nats_url: str,
    ws: WorkloadSettings,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Start each of this node's containers at its submit time; returns how many started."""
    t0 = clock()
    started = 0
    for c in node_containers(scenario, node):
        wait_s = t0 + c.submit_at_s - clock()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        try:
            await runtime.spawn(c.name, inference_argv(c, node, nats_url, ws),
                                objective_s=c.objective_s, alpha=c.alpha, model=c.model)
            started += 1
        except RuntimeFailure as e:
            log.warning("container %s not started: %s", c.name, e)
    return started
