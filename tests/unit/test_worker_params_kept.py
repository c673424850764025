"""What `dqoes control` changes outlives the worker (services/worker/statefiles.py `restored_params`).

Services are restarted when they die; an operator who set a parameter on a
node must not find it back at its default after a crash. A worker started
with another policy or other flags drops what was kept: its new configuration
is what its operator asked for last.
"""

from __future__ import annotations

import json

import pytest

from services.worker.logic import Worker
from shared.core import registry
from shared.core.controller import NodeController
from shared.core.policy import PolicyContext
from shared.runtime.factory import RuntimeSettings, make_runtime
from shared.scenarios.spec import parse_scenario
from shared.schema import ControlMsg

SCENARIO = {"name": "kept", "duration_s": 100, "nodes": [{"name": "n1", "cores": 2}],
            "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
            "containers": [{"name": "c1", "model": "m", "objective_s": 3.0}]}
KEY = {"policy": "dqoes", "settings": {"alpha": 0.1}}


def worker(params_file, key=KEY, policy: str = "dqoes") -> Worker:
    """A fresh worker process, as a restart makes it: a new policy at its configured settings."""
    runtime = make_runtime(RuntimeSettings(kind="sim", node="n1", scenario=parse_scenario(SCENARIO)))

    def build(name):
        if name not in registry.names():
            raise ValueError(f"unknown policy {name!r}")
        return registry.build(name, {}, PolicyContext(runtime.latency_curve))

    ctrl = NodeController("n1", runtime.cores, build(policy))

    async def publish(subject, msg):
        pass

    return Worker("n1", runtime, ctrl, publish, params_file=str(params_file), params_key=key, policy_factory=build)


@pytest.fixture
def kept(tmp_path):
    return tmp_path / "params-n1.json"


def test_a_restarted_worker_keeps_what_control_changed(kept):
    first = worker(kept)
    assert first.on_control(ControlMsg(alpha=0.25, beta=0.2)).ok
    assert first.on_control(ControlMsg(alpha=0.3)).ok  # later changes add up
    again = worker(kept)
    assert (again.ctrl.policy.params.alpha, again.ctrl.policy.params.beta) == (0.3, 0.2)
    assert again.controlled == {"alpha": 0.3, "beta": 0.2}
    assert again.on_control(ControlMsg()).params["alpha"] == 0.3  # a read says so too


def test_a_refused_change_keeps_nothing(kept):
    w = worker(kept)
    assert not w.on_control(ControlMsg(params={"half_life_s": 60.0})).ok
    assert not w.on_control(ControlMsg(params={"initial_interval_s": 1e4})).ok  # past max_interval_s
    assert not kept.exists()
    assert worker(kept).ctrl.policy.params.alpha == 0.1


def test_another_policy_or_other_flags_drop_what_was_kept(kept):
    assert worker(kept).on_control(ControlMsg(alpha=0.25)).ok
    w = worker(kept, key={"policy": "dqoes", "settings": {"alpha": 0.15}})
    assert w.ctrl.policy.params.alpha == 0.1 and w.controlled == {}
    assert not kept.exists()
    assert worker(kept).on_control(ControlMsg(alpha=0.25)).ok
    assert worker(kept, key={"policy": "learned", "settings": {}}, policy="learned").ctrl.policy.params.alpha == 0.1
    assert not kept.exists()


@pytest.mark.parametrize("text", ["{", "[]", '{"key": {}, "changed": {"alpha": "x"}}', '{"changed": 3}',
                                  json.dumps({"key": KEY, "changed": {"alpha": -1.0}}),
                                  json.dumps({"key": KEY, "changed": {"no_such": 1.0}})])
def test_a_bad_file_is_dropped_and_the_worker_starts_with_its_settings(kept, text, caplog):
    kept.write_text(text)
    w = worker(kept)
    assert w.ctrl.policy.params.alpha == 0.1 and w.controlled == {}
    assert not kept.exists()
    assert any("not restored" in r.getMessage() or "dropped" in r.getMessage() for r in caplog.records)


def test_the_worker_names_unknown_parameters_as_the_registry_does(kept):
    # One message for one mistake, whether a flag or a control request makes it: the parameters the
    # policy has, in its own order (the worker used to sort them).
    for policy in ("dqoes", "learned"):
        reply = worker(kept, {"policy": policy, "settings": {}}, policy).on_control(
            ControlMsg(params={"zeta": 1.0, "beta_x": 2.0}))
        with pytest.raises(ValueError) as e:
            registry.check_names(policy, ["zeta", "beta_x"])
        assert reply.ok is False and reply.error == str(e.value)
        assert reply.error.endswith(f"(it has: {', '.join(registry.param_names(policy))})")


def test_a_restarted_worker_keeps_the_policy_control_switched_to(kept):
    first = worker(kept)
    assert first.on_control(ControlMsg(alpha=0.25)).ok
    reply = first.on_control(ControlMsg(policy="learned", params={"half_life_s": 30.0}))
    assert reply.ok and reply.policy == "learned" and reply.changed == ("half_life_s", "policy")
    assert first.controlled == {"half_life_s": 30.0}  # what was set on DQoES does not carry over
    again = worker(kept)
    assert again.ctrl.policy.name == "learned" and again.ctrl.policy.params.half_life_s == 30.0
    assert not again.on_control(ControlMsg(policy="nonsense")).ok
    assert worker(kept).ctrl.policy.name == "learned"  # a refused switch keeps nothing
    # Started with other flags, the worker runs what it was started with.
    assert worker(kept, key={"policy": "dqoes", "settings": {"alpha": 0.15}}).ctrl.policy.name == "dqoes"
    assert not kept.exists()
