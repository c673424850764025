"""Quicker construction of frozen value types, kept frozen.

A round at 1,000 containers builds some 4,000 values (views, classifications,
limit updates, decisions), and a worker decodes tens of thousands of latency
events a second. A frozen slotted dataclass's generated `__init__` sets each
field through `object.__setattr__` (it must step round the `__setattr__`
that freezes it), about 0.18 us a field here: two thirds of a round's time
went to it. The functions made here fill the slots of a *twin* instead: a
class with the same slots and bases but no frozen `__setattr__`, whose
stores are plain slot writes. The instance is a twin only while its fields
are set, then becomes the frozen type (`__class__` assignment, which
CPython allows between classes of the same layout, and checks). Where no
twin fits (a base that sets attributes its own way, or a subclass instance)
each field is set through its slot's descriptor, the earlier way, about
twice as fast as the generated `__init__` where the twin is three times.
`quick_init` gives a type such an `__init__` with the dataclass's
signature and defaults; `slot_builder` builds an instance of a type whose
`__init__` checks its values (a wire message) from values already checked.
Instances stay frozen (assigning to a field still raises
`FrozenInstanceError`); equality, hashing, repr, `replace` and pickling are
the dataclass's own, and no instance is ever seen as a twin: only the
function building it holds it meanwhile.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _Factory:
    """The default of a field whose default comes from its factory (shown as the dataclass shows it)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _frozen_slotted_fields(cls: type, what: str) -> tuple[dataclasses.Field, ...]:
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{what}: {cls.__name__} is not a frozen, slotted dataclass")
    return dataclasses.fields(cls)


def _setters(cls: type, fields: tuple[dataclasses.Field, ...], what: str) -> dict[str, Any]:
    """`_set_<field>`: each field's slot descriptor's setter (inherited slots too)."""
    ns: dict[str, Any] = {}
    for f in fields:
        slot = next(k.__dict__[f.name] for k in cls.__mro__ if f.name in k.__dict__)
        if not isinstance(slot, types.MemberDescriptorType):
            raise TypeError(f"{what}: {cls.__name__}.{f.name} is not a slot")
        ns[f"_set_{f.name}"] = slot.__set__
    return ns


def _twin(cls: type) -> type | None:
    """A class with `cls`'s slots and bases, without its frozen `__setattr__`, whose instances can be given
    `cls` as their class and back; None where there is none (a base with its own `__setattr__` or
    `__init_subclass__`, or a layout CPython will not swap)."""
    if any(k.__dict__.get(hook) is not None for k in cls.__mro__[1:-1]
           for hook in ("__setattr__", "__delattr__", "__init_subclass__")):
        return None
    ns = {"__slots__": cls.__dict__["__slots__"], "__module__": cls.__module__,
          "__qualname__": f"{cls.__qualname__}.<unfrozen>"}
    try:
        twin = type(cls.__name__, cls.__bases__, ns)
        probe: Any = object.__new__(twin)
        probe.__class__ = cls
        object.__setattr__(probe, "__class__", twin)
    except TypeError:
        return None
    return twin


def _compile(name: str, args: list[str], body: list[str], ns: dict[str, Any]) -> Any:
    src = f"def {name}({', '.join(args)}):\n" + "\n".join(body) + "\n"
    exec(src, ns)  # noqa: S102 - the source is built from the class's own field names
    return ns[name]


def quick_init(cls: type[T]) -> type[T]:
    """Give a frozen, slotted dataclass an `__init__` that sets its slots directly.

    Only for plain value types: every field in `__init__`, positional or keyword, no
    `__post_init__` and no `InitVar` (refused with a TypeError, so a type that
    grows one cannot silently lose it).
    """
    fields = _frozen_slotted_fields(cls, "quick_init")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init: {cls.__name__} has a __post_init__")
    given = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if [(p.name, p.kind) for p in given] != [(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for f in fields]:
        raise TypeError(f"quick_init: {cls.__name__}'s __init__ takes more or other than its fields, in order")
    ns = _setters(cls, fields, "quick_init")
    ns["_FACTORY"] = _FACTORY
    args = ["self"]
    body: list[str] = []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            ns[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_factory_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY:\n        {f.name} = _factory_{f.name}()")
        else:
            args.append(f.name)
    by_descriptor = [f"    _set_{f.name}(self, {f.name})" for f in fields]
    twin = _twin(cls)
    if twin is None or not fields:
        body += by_descriptor
    else:
        ns["_cls"], ns["_twin"], ns["_set_class"] = cls, twin, object.__setattr__
        body += ["    if type(self) is _cls:",
                 "        _set_class(self, '__class__', _twin)",
                 *(f"        self.{f.name} = {f.name}" for f in fields),
                 "        self.__class__ = _cls",
                 "    else:  # a subclass's instance keeps its class",
                 *("    " + line for line in by_descriptor)]
    init = _compile("__init__", args, body or ["    pass"], ns)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(getattr(cls.__init__, "__annotations__", {}))
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def slot_builder(cls: type[T]) -> Callable[..., T]:
    """A function taking every field of a frozen, slotted dataclass (by name or in order), that builds an
    instance without running its `__init__` (nor its checks): for values already checked."""
    fields = _frozen_slotted_fields(cls, "slot_builder")
    ns = _setters(cls, fields, "slot_builder")
    twin = _twin(cls)
    ns["_new"], ns["_cls"], ns["_twin"] = object.__new__, cls, twin
    names = [f.name for f in fields]
    if twin is None:
        body = ["    self = _new(_cls)", *(f"    _set_{n}(self, {n})" for n in names), "    return self"]
    else:
        body = ["    self = _new(_twin)", *(f"    self.{n} = {n}" for n in names), "    self.__class__ = _cls",
                "    return self"]
    build = _compile("build", names, body, ns)
    build.__qualname__ = f"slot_builder({cls.__qualname__})"
    return build
