"""The worker applies service objectives to matching containers (own > service > label), a percentile
objective turns NATS batch latencies into their percentile over the window, and a polled source reads
the objective's percentile and window instead of its labels'."""

from __future__ import annotations

from bench.fuzz_inputs import Harness
from services.worker.polling import objective_spec
from shared.latency.spec import parse_source, substitute
from shared.runtime.base import RuntimeContainer, RuntimeEvent
from shared.schema import LatencyEvent, ObjectiveAssign, ServiceObjective

SWARM = "com.docker.swarm.service.name"


def _start(w, name: str, labels: dict[str, str], objective_s: float | None = None) -> None:
    c = RuntimeContainer(name=name, id=f"{name:0<12}{'0' * 52}", node="n1", objective_s=objective_s,
                         labels=labels)
    w.on_runtime_event(RuntimeEvent("started", c))


def test_a_service_objective_governs_its_replicas_and_the_own_and_label_order_holds():
    h = Harness()
    try:
        w = h.worker
        _start(w, "api.1.aaa", {SWARM: "api"}, objective_s=9.0)
        _start(w, "api.2.bbb", {SWARM: "api"})
        _start(w, "web.1.ccc", {SWARM: "web"}, objective_s=7.0)
        w.on_service_objective(ServiceObjective(selector="api", objective_s=2.0, revision=5))
        assert w.ctrl.containers["api.1.aaa"].objective_s == 2.0  # service beats label
        assert w.ctrl.containers["api.2.bbb"].objective_s == 2.0
        assert w.ctrl.containers["web.1.ccc"].objective_s == 7.0  # another service: its label
        w.on_objective(ObjectiveAssign(container="api.2.bbb", objective_s=1.5, revision=6))
        assert w.ctrl.containers["api.2.bbb"].objective_s == 1.5  # own beats service

        _start(w, "api.3.new", {SWARM: "api"})  # a replaced replica, a new name
        assert w.ctrl.containers["api.3.new"].objective_s == 2.0
        states = {c.container: c for c in w.node_state().containers}
        assert (states["api.3.new"].objective_source, states["api.3.new"].objective_selector) == ("target", "api")
        assert (states["api.2.bbb"].objective_source, states["api.2.bbb"].objective_selector) == ("target", None)
        assert w.node_state().service_objectives == {"api": 5}

        w.on_service_objective(ServiceObjective(selector="api", objective_s=3.0, revision=4))  # late: ignored
        assert w.ctrl.containers["api.1.aaa"].objective_s == 2.0
        w.on_service_objective(ServiceObjective(selector="api", objective_s=None, revision=7))
        assert w.ctrl.containers["api.1.aaa"].objective_s == 9.0  # back to its label
        assert w.ctrl.containers["api.3.new"].managed is False
        assert w.ctrl.containers["api.2.bbb"].objective_s == 1.5
        assert w.node_state().service_objectives == {}
    finally:
        h.close()


def test_a_percentile_objective_feeds_the_percentile_of_the_batches_in_its_window():
    h = Harness()
    try:
        w = h.worker
        _start(w, "api.1.aaa", {"app": "api"})
        w.on_service_objective(ServiceObjective(selector="app=api", objective_s=2.0, revision=1,
                                                percentile=50.0, window_s=1e3))
        for latency_s in (1.0, 9.0, 2.0, 8.0, 3.0, 10.0):
            w.on_latency(LatencyEvent(container="api.1.aaa", node="n1", latency_s=latency_s, images=1, batch=0))
        # The controller sees the median of the batches in the window (1, 2, 3, 8, 9, 10), not the last one.
        assert w.ctrl.containers["api.1.aaa"].new_latency_s == 3.0
        assert len(w.windows["api.1.aaa"].batches) == 6
        states = {c.container: c for c in w.node_state().containers}
        assert (states["api.1.aaa"].percentile, states["api.1.aaa"].window_s) == (50.0, 1e3)
    finally:
        h.close()


def test_a_polled_source_reads_the_objective_s_percentile_and_window_over_its_labels():
    h = Harness()
    try:
        w = h.worker
        labels = {"dqoes.latency.source": "promql", "dqoes.latency.query": "q{quantile}[{window}]",
                  "dqoes.latency.percentile": "99", "dqoes.latency.window_s": "10", "app": "api"}
        spec = parse_source(labels)
        _start(w, "api.1.aaa", labels)
        assert objective_spec(w, "api.1.aaa", spec) == spec  # no percentile objective: the labels
        w.on_service_objective(ServiceObjective(selector="app=api", objective_s=0.2, revision=1,
                                                percentile=95.0, window_s=30.0))
        tuned = objective_spec(w, "api.1.aaa", spec)
        assert (tuned.percentile, tuned.window_s) == (95.0, 30.0)
        assert substitute(tuned.query or "", "api.1.aaa", "n1", None, tuned.quantile, tuned.window_s) == "q0.95[30s]"
        assert substitute("[{window}]", "x", "n1", None, None, 0.5) == "[500ms]"
    finally:
        h.close()
