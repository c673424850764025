"""A decision says when its round ran, not when its limits were applied (shared/schema.py DecisionMsg.at).

Applying limits takes time on a real engine (a `docker update` per change).
The worker's model dates a limit change at the round; a reader that lines up
batches against the decision's `at` (the replay of a recorded run) must see
the same instant: stamped after the updates, a record replayed with its own
settings chose another limit for MobileNetV2 in one of its rounds, and
disagreed with the run from then on (docs/results.md).
"""

from __future__ import annotations

import asyncio

from services.worker.logic import Worker
from shared import subjects
from shared.core import registry
from shared.core.controller import NodeController
from shared.core.policy import PolicyContext
from shared.runtime.factory import RuntimeSettings, make_runtime
from shared.scenarios.spec import parse_scenario
from shared.schema import DecisionMsg

SCENARIO = {"name": "slow-apply", "duration_s": 100, "nodes": [{"name": "n1", "cores": 2}],
            "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
            "containers": [{"name": "c1", "model": "m", "objective_s": 3.0},
                           {"name": "c2", "model": "m", "objective_s": 30.0}]}
APPLY_S = 0.25


def test_the_decision_is_dated_at_its_round_not_after_the_updates():
    async def go() -> list[tuple[float, DecisionMsg]]:
        runtime = make_runtime(RuntimeSettings(kind="sim", node="n1", scenario=parse_scenario(SCENARIO)))
        wall = [1000.0]
        set_limit = runtime.set_limit

        async def slow_set_limit(name, limit):
            wall[0] += APPLY_S  # an engine that takes a quarter of a second an update
            return await set_limit(name, limit)

        runtime.set_limit = slow_set_limit
        await runtime.start()
        ctrl = NodeController("n1", runtime.cores, registry.build("learned", {}, PolicyContext(runtime.latency_curve)))
        sent: list[tuple[float, DecisionMsg]] = []

        async def publish(subject, msg):
            if subject == subjects.decisions("n1"):
                sent.append((before[0], msg))

        before = [0.0]
        w = Worker("n1", runtime, ctrl, publish, wall=lambda: wall[0])
        await w.start()
        for _ in range(3):
            before[0] = wall[0]
            ctrl.next_round_at_s = runtime.now_s()
            await w.step()
        await runtime.close()
        return sent

    sent = asyncio.run(go())
    # Limits moved (so the engine took its time), and each decision carries the time its round began.
    assert any(c.new_limit != c.old_limit for _, m in sent for c in m.containers)
    assert all(m.at == at for at, m in sent), [(at, m.at) for at, m in sent]
