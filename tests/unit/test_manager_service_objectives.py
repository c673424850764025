"""The manager's side of service objectives: stored under their own keys, loaded again after a restart,
handed to every worker that lacks them (or holds an older revision), taken back from one that holds a
cleared one, and never flooded."""

from __future__ import annotations

import asyncio
import time

from bench.fuzz_inputs import MemoryStore
from services.manager.logic import Manager
from shared.public import parse_target_reply
from shared.schema import NodeState, ServiceObjective


def _state(node: str, held: dict[str, int], round_: int = 3) -> NodeState:
    return NodeState(node=node, policy="dqoes", cores=2.0, round=round_, at=time.time(), interval_s=10.0,
                     slack_sum_g_s=0.0, slack_sum_b_s=0.0, satisfied=0, members={}, containers=(),
                     service_objectives=held)


def test_service_objectives_are_stored_handed_over_reconciled_and_loaded_again():
    async def go():
        store, sent = MemoryStore(), []

        async def send(subject, msg):
            sent.append((subject, msg))

        clock = [1000.0]
        m = Manager(store, send, wall=lambda: clock[0], resend_after_s=5.0)
        await m.on_node_state(_state("n1", {}))
        reply = parse_target_reply(await m.on_target(
            b'{"service": "app=api", "objective": 0.2, "percentile": 95, "window_s": 30}'))
        assert reply["ok"] and reply["containers"] == [], reply
        assert list(store.data) == ["_service/app=api"]
        (subject, msg), = sent
        assert subject.endswith(".n1") and isinstance(msg, ServiceObjective)
        assert (msg.selector, msg.objective_s, msg.percentile, msg.window_s) == ("app=api", 0.2, 95.0, 30.0)
        rev = msg.revision

        sent.clear()
        await m.on_node_state(_state("n1", {}))  # not applied yet, but just handed over: not again
        assert sent == []
        clock[0] += 6.0
        await m.on_node_state(_state("n1", {}))  # still lacking it after resend_after_s: again
        assert [s.selector for _, s in sent] == ["app=api"]
        sent.clear()
        await m.on_node_state(_state("n1", {"app=api": rev}))
        await m.on_node_state(_state("n2", {"gone": 3}))  # a new node: gets it, and loses a cleared one
        assert {(s.selector, s.objective_s, s.revision) for _, s in sent} == {("app=api", 0.2, rev),
                                                                             ("gone", None, 4)}

        again = Manager(store, send)  # a restarted manager reads it back
        assert await again.load() == 1 and again.services["app=api"].percentile == 95.0

        sent.clear()
        cleared = parse_target_reply(await m.on_clear(b'{"service": "app=api"}'))
        assert cleared["ok"] and cleared["service"] == "app=api" and store.data == {}
        assert {(s.selector, s.objective_s) for _, s in sent} == {("app=api", None)}
        listed = parse_target_reply(m.on_list(b""))
        assert listed["targets"] == []

    asyncio.run(go())
