"""quick_init and slot_builder: the value types keep their constructor's meaning and stay frozen."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from shared.core.classification import Classification, Classified
from shared.core.types import BatchObs, Cls, ContainerDecision, ContainerView, Decision, NodeView
from shared.core.values import _twin, quick_init, slot_builder

QUICK = (BatchObs, ContainerView, NodeView, ContainerDecision, Decision, Classified, Classification)


def _plain_twin(cls: type) -> type:
    """The same fields as a frozen slotted dataclass with the generated __init__."""
    spec = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(
        "Twin", [(n, t, dataclasses.field(default=f.default, default_factory=f.default_factory)) for n, t, f in spec],
        frozen=True, slots=True)


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: c.__name__)
def test_signature_is_the_dataclass_one(cls: type) -> None:
    assert str(inspect.signature(cls.__init__)) == str(inspect.signature(_plain_twin(cls).__init__))


def _sample(cls: type) -> dict:
    view = ContainerView("c1", 10.0, 0.1, 9.5, 9.0, 0.2, 0.25)
    values = {
        BatchObs: dict(latency_s=9.5, finished_at_s=12.0, limit=0.25, clean=False, index=3, cpu_s=2.1,
                       since_s=5.0, prev_limit=0.2),
        ContainerView: dict(name="c1", objective_s=10.0, alpha=0.1, latency_s=9.5, last_latency_s=9.0,
                            cpu_share=0.2, limit=0.25, prev_cls=Cls.S, prev_slack_s=1.0,
                            batches=(BatchObs(9.5, 12.0, 0.25, True, 3),), workload="resnet50@10",
                            follows_limit=True),
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


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: c.__name__)
def test_same_values_by_keyword_position_and_default(cls: type) -> None:
    kw = _sample(cls)
    twin = _plain_twin(cls)
    by_kw, by_pos = cls(**kw), cls(*kw.values())
    assert by_kw == by_pos
    assert _values(by_kw) == _values(twin(**kw)) == list(kw.values())
    required = {f.name: kw[f.name] for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert _values(cls(**required)) == _values(twin(**required))


def _values(obj: object) -> list:
    return [getattr(obj, f.name) for f in dataclasses.fields(obj)]  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: c.__name__)
def test_still_frozen_hashable_replaceable_and_picklable(cls: type) -> None:
    obj = cls(**_sample(cls))
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, first, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(obj, first)
    assert pickle.loads(pickle.dumps(obj)) == obj
    assert dataclasses.replace(obj) == obj
    if cls is not Decision:  # its `extra` is a dict
        assert hash(obj) == hash(cls(**_sample(cls)))


def test_a_default_factory_runs_for_each_instance() -> None:
    a = Decision("n", 0.0, "dqoes", (), 0.0, 0.0, 0, 5.0)
    b = Decision("n", 0.0, "dqoes", (), 0.0, 0.0, 0, 5.0)
    assert a.extra == {} and a.extra is not b.extra


def test_wrong_arguments_fail_as_a_dataclass_would() -> None:
    with pytest.raises(TypeError):
        ContainerView("c1", 10.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        ContainerView("c1", 10.0, 0.1, None, None, None, None, nope=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Classified(None, None, None, False, 1)  # type: ignore[call-arg]


def test_refuses_what_it_cannot_copy() -> None:
    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        x: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class HasInitVar:
        x: int
        y: dataclasses.InitVar[int] = 0

    @dataclasses.dataclass(frozen=True, slots=True)
    class KwOnly:
        x: int
        y: int = dataclasses.field(default=0, kw_only=True)

    @dataclasses.dataclass(frozen=True, slots=True)
    class NotInInit:
        x: int
        y: int = dataclasses.field(default=0, init=False)

    for cls in (NotFrozen, NoSlots, PostInit, HasInitVar, KwOnly, NotInInit):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


def test_inherited_slots() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Base:
        x: int

    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Child(Base):
        y: int = 2

    c = Child(1)
    assert (c.x, c.y) == (1, 2) and c == Child(x=1, y=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.x = 3  # type: ignore[misc]


def test_slot_builder_builds_what_the_constructor_would_without_its_checks() -> None:
    from shared.schema import LatencyEvent

    build = slot_builder(LatencyEvent)
    kw = dict(container="c01", node="n1", latency_s=2.5, images=10, batch=3, cpu_s=1.2, model="resnet50",
              finished_at=1.7e9, follows_limit=True)
    ev = build(*kw.values())
    assert type(ev) is LatencyEvent and ev == LatencyEvent(**kw)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.latency_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        build(*list(kw.values())[:-1])
    with pytest.raises(ValueError):  # the constructor checks; the builder is for values already checked
        LatencyEvent(**{**kw, "latency_s": -1.0})
    assert build(*{**kw, "latency_s": -1.0}.values()).latency_s == -1.0

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    with pytest.raises(TypeError, match="slot_builder"):
        slot_builder(NotFrozen)


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: c.__name__)
def test_every_value_type_is_built_through_its_twin_and_ends_as_itself(cls: type) -> None:
    assert _twin(cls) is not None  # the fast path, not the fallback, serves the hot types
    assert "_twin" in cls.__init__.__code__.co_names
    obj = cls(**_sample(cls))
    assert type(obj) is cls and obj.__class__ is cls and isinstance(obj, cls)


def test_a_subclass_instance_keeps_its_class() -> None:
    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Point:
        x: int
        y: int = 0

    class Named(Point):
        __slots__ = ("label",)

    n = Named(1, 2)
    assert type(n) is Named and (n.x, n.y) == (1, 2)
    assert type(Point(3)) is Point and Point(3) == Point(x=3, y=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.x = 5  # type: ignore[misc]


def test_where_no_twin_fits_the_descriptors_set_the_fields() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Base:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Child(Base):
        y: int = 2

    assert _twin(Child) is None  # its base freezes its own fields: the twin's stores would raise
    build = slot_builder(Child)
    assert build(1, 3) == Child(1, 3) and type(build(1, 3)) is Child


def test_a_weakref_slot_is_kept() -> None:
    import weakref

    @quick_init
    @dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
    class Ref:
        x: int

    r = Ref(4)
    assert type(r) is Ref and weakref.ref(r)() is r and r == Ref(4)


def test_the_wire_builder_goes_through_the_twin_past_its_checked_base() -> None:
    from shared.schema import LatencyEvent

    assert _twin(LatencyEvent) is not None
    build = slot_builder(LatencyEvent)
    assert "_twin" in build.__code__.co_names
    ev = build(container="c01", node="n1", latency_s=2.5, images=10, batch=3, cpu_s=1.2,
                                    model=None, finished_at=1.0, follows_limit=False)
    assert type(ev) is LatencyEvent
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.node = "n2"  # type: ignore[misc]
