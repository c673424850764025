"""Churn: 1,000 containers starting and stopping leave no per-container state in the worker."""

from __future__ import annotations

import time

from bench.fuzz_inputs import CONTAINERS, Harness
from shared.runtime.base import RuntimeContainer, RuntimeEvent
from shared.schema import LatencyEvent, ObjectiveAssign


def per_container_sizes(w) -> dict[str, int]:
    return {"controller": len(w.ctrl.containers), "models": len(w.models), "by_id": len(w.by_id),
            "labels": len(w.label_objectives), "assigned": len(w.assigned), "last_batch": len(w.last_batch_at),
            "throttled": len(w.throttled_ratio), "originals": len(w.originals), "stale_seen": len(w._stale_seen)}


def test_a_thousand_starts_and_stops_leave_nothing_behind():
    h = Harness()
    try:
        w = h.worker
        before = per_container_sizes(w)
        for i in range(1000):
            c = RuntimeContainer(name=f"x{i:04d}", id=f"{i:012x}{'0' * 52}", node="n1", objective_s=5.0)
            w.on_runtime_event(RuntimeEvent("started", c))
            w.on_objective(ObjectiveAssign(container=c.name, objective_s=4.0, revision=i + 10))
            w.on_objective(ObjectiveAssign(container=c.name, objective_s=4.0, revision=i + 1))  # late, ignored
            w.on_latency(LatencyEvent(container=c.name, node="n1", latency_s=3.0, images=1, batch=0))
            assert c.name in w.ctrl.containers
            w.on_runtime_event(RuntimeEvent("stopped", c))
        assert per_container_sizes(w) == before
        assert set(w.ctrl.containers) == set(CONTAINERS)
    finally:
        h.close()


def test_a_container_that_stops_publishing_is_stale_keeps_its_limit_and_is_not_met():
    from shared.core.types import Cls, ContainerDecision, Decision

    h = Harness()
    try:
        w = h.worker
        now = time.time()
        for name, age_s in (("c1", 100.0), ("c2", 1.0)):
            w.on_latency(LatencyEvent(container=name, node="n1", latency_s=2.9, images=1, batch=0,
                                      finished_at=now - age_s))
            w.ctrl.containers[name].cls = Cls.S  # in band by its last batch
        assert w.stale_containers() == {"c1"}  # 100 s > max(30 s, 5 x 3 s); c2 reported 1 s ago
        ns = w.node_state()
        rows = {c.container: c for c in ns.containers}
        assert rows["c1"].stale and rows["c1"].met is False and not rows["c2"].stale and rows["c2"].met
        assert "c1" in ns.members["pending"] and "c1" not in ns.members["S"] and ns.satisfied == 1
        # A round that would move its CPU: the stale one keeps its limit, the other changes.
        w.ctrl.containers["c1"].limit = 0.5
        changes = tuple(ContainerDecision(name=n, cls=Cls.S, slack_s=0.1, latency_s=2.9, cpu_share=0.4,
                                          old_limit=0.5, new_limit=0.3, reason="test") for n in ("c1", "c2"))
        d = Decision(node="n1", now_s=0.0, policy="dqoes", containers=changes, slack_sum_g_s=0.0,
                     slack_sum_b_s=0.0, satisfied=0, interval_s=10.0)
        applied: list[tuple[str, float | None]] = []

        async def set_limit(name: str, limit: float | None) -> float | None:
            applied.append((name, limit))
            return limit

        w.runtime.set_limit = set_limit  # the simulated node is not running here: record instead
        h.run(w._apply(d))
        assert applied == [("c2", 0.3)]
        assert w.ctrl.containers["c1"].limit == 0.5
    finally:
        h.close()


def test_the_published_state_classes_each_container_by_its_latest_batch_not_the_last_round():
    # A round classed c2 in band; its next batch is late. Until the next round (the learned allocator
    # may wait two minutes) the state must say late: met and in band are a client's latest batch.
    from shared.core.types import Cls

    h = Harness()
    try:
        w = h.worker
        now = time.time()
        w.on_latency(LatencyEvent(container="c2", node="n1", latency_s=2.9, images=1, batch=0, finished_at=now))
        t = w.ctrl.containers["c2"]
        t.cls, t.slack_s = Cls.S, t.objective_s - 2.9
        objective = t.objective_s
        w.on_latency(LatencyEvent(container="c2", node="n1", latency_s=objective * 1.5, images=1, batch=1,
                                  finished_at=now + 1))
        assert t.cls is Cls.S  # no round since
        ns = w.node_state()
        row = {c.container: c for c in ns.containers}["c2"]
        assert row.cls is Cls.B and row.met is False and row.slack_s == -0.5 * objective
        assert "c2" in ns.members["B"] and "c2" not in ns.members["S"]
    finally:
        h.close()


def test_the_worker_reads_a_batch_as_of_when_its_workload_says_it_finished():
    h = Harness()
    try:
        w = h.worker
        w.wall, w.clock = (lambda: 1000.0), (lambda: 50.0)
        t = w.ctrl.containers["c1"]
        t.limit = 0.4
        t.limit_changed(49.8, 0.6)  # a round changed its limit 0.2 s before the worker read the batch
        w.on_latency(LatencyEvent(container="c1", node="n1", latency_s=2.0, images=1, batch=0, finished_at=999.5))
        b = t.recent[-1]
        assert b.finished_at_s == 49.5 and b.limit == 0.6 and b.clean
        assert w.last_batch_at["c1"] == 999.5
    finally:
        h.close()
