"""Where each container of a scenario runs, decided once for every consumer.

Spread placement depends only on submission and finish times, never on the
policy, so the simulator and each live worker (one process per node, no
shared memory) compute the same answer from the scenario alone.
"""

from __future__ import annotations

import heapq

from shared.core.baselines import spread_place
from shared.scenarios.spec import Scenario


def place(scenario: Scenario) -> dict[str, str]:
    """Container name -> node name, replaying submissions and finishes in time order."""
    running = {n.name: 0 for n in scenario.nodes}
    heap: list[tuple[float, int, str]] = []
    for c in scenario.containers:
        heapq.heappush(heap, (c.submit_at_s, 1, c.name))
        if c.duration_s is not None:
            heapq.heappush(heap, (c.submit_at_s + c.duration_s, 0, c.name))
    specs = {c.name: c for c in scenario.containers}
    out: dict[str, str] = {}
    while heap:
        _, kind, name = heapq.heappop(heap)
        if kind == 1:
            where = specs[name].node or spread_place(running)
            out[name] = where
            running[where] += 1
        elif name in out:
            running[out[name]] -= 1
    return out
