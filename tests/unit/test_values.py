"""The core's value types (msgspec Structs): built by position or keyword alike, frozen, hashable, copied."""

from __future__ import annotations

import inspect
import pickle

import msgspec
import pytest

from shared.core.classification import Classification, Classified
from shared.core.types import BatchObs, Cls, ContainerDecision, ContainerView, Decision, NodeView

VALUES = (BatchObs, ContainerView, NodeView, ContainerDecision, Decision, Classified, Classification)


def _sample(cls: type) -> dict:
    view = ContainerView("c1", 10.0, 0.1, 9.5, 9.0, 0.2, 0.25)
    values = {
        BatchObs: dict(latency_s=9.5, finished_at_s=12.0, limit=0.25, clean=False, index=3, cpu_s=2.1,
                       since_s=5.0, prev_limit=0.2, span_s=10.0),
        ContainerView: dict(name="c1", objective_s=10.0, alpha=0.1, latency_s=9.5, last_latency_s=9.0,
                            cpu_share=0.2, limit=0.25, prev_cls=Cls.S, prev_slack_s=1.0,
                            batches=(BatchObs(9.5, 12.0, 0.25, True, 3),), workload="resnet50@10",
                            follows_limit=True, request_rate_per_s=12.5),
        NodeView: dict(node="n1", cores=4.0, now_s=30.0, containers=(view,), event="added"),
        ContainerDecision: dict(name="c1", cls=Cls.B, slack_s=-2.0, latency_s=12.0, cpu_share=0.2,
                                old_limit=0.2, new_limit=0.3, reason="B: grow", planned_limit=0.25),
        Decision: dict(node="n1", now_s=30.0, policy="dqoes", containers=(), slack_sum_g_s=0.0,
                       slack_sum_b_s=-2.0, satisfied=0, interval_s=5.0, listener="kept", event=None,
                       extra={"r_g": 0.1}, met=1),
        Classified: dict(view=view, cls=Cls.S, slack_s=0.5, fresh=True),
        Classification: dict(items=(), slack_sum_g_s=1.0, slack_sum_b_s=-1.0, r_g=0.2, r_b=0.3,
                             satisfied=2, met=3),
    }
    return values[cls]


def _values(obj: msgspec.Struct) -> list:
    return [getattr(obj, name) for name in obj.__struct_fields__]


@pytest.mark.parametrize("cls", VALUES, ids=lambda c: c.__name__)
def test_same_values_by_keyword_position_and_default(cls: type) -> None:
    kw = _sample(cls)
    by_kw, by_pos = cls(**kw), cls(*kw.values())
    assert by_kw == by_pos
    assert _values(by_kw) == list(kw.values())
    fields = msgspec.structs.fields(cls)
    assert [f.name for f in fields] == list(inspect.signature(cls).parameters) == list(kw)
    required = {f.name: kw[f.name] for f in fields if f.required}
    defaults = [f.default if f.default_factory is msgspec.NODEFAULT else f.default_factory() for f in fields]
    assert _values(cls(**required)) == [kw[f.name] if f.required else d for f, d in zip(fields, defaults, strict=True)]


@pytest.mark.parametrize("cls", VALUES, ids=lambda c: c.__name__)
def test_frozen_hashable_replaceable_and_picklable(cls: type) -> None:
    obj = cls(**_sample(cls))
    first = obj.__struct_fields__[0]
    with pytest.raises(AttributeError):
        setattr(obj, first, None)
    with pytest.raises(AttributeError):
        delattr(obj, first)
    assert pickle.loads(pickle.dumps(obj)) == obj
    assert msgspec.structs.replace(obj) == obj
    changed = msgspec.structs.replace(obj, **{first: "other"})
    assert getattr(changed, first) == "other" and changed != obj
    if cls is not Decision:  # its `extra` is a dict
        assert hash(obj) == hash(cls(**_sample(cls)))


def test_a_default_factory_runs_for_each_instance() -> None:
    a = Decision("n", 0.0, "dqoes", (), 0.0, 0.0, 0, 5.0)
    b = Decision("n", 0.0, "dqoes", (), 0.0, 0.0, 0, 5.0)
    assert a.extra == {} and a.extra is not b.extra


def test_wrong_arguments_fail() -> None:
    with pytest.raises(TypeError):
        ContainerView("c1", 10.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ContainerView("c1", 10.0, 0.1, None, None, None, None, nope=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Classified(None, None, None, False, 1)  # type: ignore[call-arg]
