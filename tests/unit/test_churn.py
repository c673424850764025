"""Churn: 1,000 containers starting and stopping leave no per-container state in the worker."""

from __future__ import annotations

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
