"""Inputs at the edges: bounds, rate-limited rejection logs, objective revisions that only the store moves."""

from __future__ import annotations

import logging

import pytest

from bench.fuzz_inputs import Harness
from shared import schema
from shared.core.bounds import MAX_INTERVAL_S, MIN_INTERVAL_S, objective_problem
from shared.core.dqoes import DQoESParams
from shared.public import parse_target_reply
from shared.runtime.docker import parse_labels
from shared.schema import ControlMsg, LatencyEvent, ObjectiveAssign, SchemaError


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def test_five_thousand_bad_requests_write_one_line_with_a_count(h, caplog):
    now = [0.0]
    h.manager.rejections.clock = lambda: now[0]
    with caplog.at_level(logging.INFO, logger="services.manager.logic"):
        for _ in range(5000):
            reply = parse_target_reply(h.run(h.manager.on_target(b'{"container": "nope", "objective": 3}')))
            assert not reply["ok"]
        now[0] = 6.0
        h.run(h.manager.on_target(b'{"container": "nope", "objective": 3}'))
    lines = [r.getMessage() for r in caplog.records if "target rejected" in r.getMessage()]
    assert len(lines) == 2
    assert "4999 more since the last line" in lines[1]
    assert h.manager.rejected == 5001


def test_a_forged_revision_cannot_freeze_an_objective(h):
    w = h.worker
    w.on_objective(ObjectiveAssign(container="c1", objective_s=9.0, revision=2**62))
    assert w.ctrl.containers["c1"].objective_s == 9.0
    real = ObjectiveAssign(container="c1", objective_s=4.0, revision=5)
    w.on_objective(real)  # once: could be an old message arriving late
    assert w.ctrl.containers["c1"].objective_s == 9.0
    w.on_objective(real)  # the manager re-sends what its store holds: the store wins
    assert w.ctrl.containers["c1"].objective_s == 4.0
    w.on_objective(ObjectiveAssign(container="c1", objective_s=6.0, revision=6))
    assert w.ctrl.containers["c1"].objective_s == 6.0


@pytest.mark.parametrize("interval", [5e-324, 0.0, MIN_INTERVAL_S / 2, MAX_INTERVAL_S * 2, float("nan")])
def test_intervals_outside_the_bounds_are_refused_everywhere(h, interval):
    with pytest.raises(SchemaError):
        ControlMsg.build(initial_interval_s=interval)
    with pytest.raises(SchemaError):
        schema.encode(ControlMsg(initial_interval_s=interval), "op")
    with pytest.raises(ValueError):
        DQoESParams(initial_interval_s=interval)
    before = h.worker.ctrl.policy.params
    try:
        msg = ControlMsg(params={"initial_interval_s": interval})
    except SchemaError:
        return  # not even a message (NaN)
    reply = h.worker.on_control(msg)
    assert not reply.ok and h.worker.ctrl.policy.params == before


@pytest.mark.parametrize("value, ok", [(5e-324, False), (0.0009, False), (0.001, True), (86400, True),
                                       (86400.5, False), (float("inf"), False), (True, False)])
def test_objective_bounds(value, ok):
    assert (objective_problem(value) is None) is ok
    if not isinstance(value, bool) and value > 0:
        objective, _, error = parse_labels({"dqoes.objective_s": repr(value)})
        assert (objective is not None) is ok and (error is None) is ok


def test_latency_events_beyond_a_week_are_refused():
    with pytest.raises(SchemaError, match="latency_s"):
        LatencyEvent.build(container="c1", node="n1", latency_s=8 * 86400.0, images=1, batch=0)
    with pytest.raises(SchemaError, match="latency_s"):
        schema.encode(LatencyEvent(container="c1", node="n1", latency_s=8 * 86400.0, images=1, batch=0), "c")
