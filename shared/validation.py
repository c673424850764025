"""Checked dataclasses: the validation every message and public request is built on.

Why its own module: the wire messages (`shared.schema`), the public JSON
requests and replies (`shared.public`) and anything later that crosses a
process boundary need the same guarantees, and they should not each grow
their own checks. A field is declared with `checked(CHECK, ...)`; building
the dataclass (or `build(cls, mapping)` from decoded data) runs every check
and names the failing field in a `SchemaError` ("latency.latency_s: must be
a finite number > 0, got -3").

Decoding paths call `build`, which checks each field once and never raises
anything but `Invalid`; callers turn that into a `SchemaError` with the
message's name in front.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shared import subjects
from shared.core import bounds

MAX_TEXT_CHARS = 4096
"""Longest text field accepted in a message."""

class SchemaError(ValueError):
    """A message or request that does not fit the schema; the text names the field.

    `where` is the path below the message name (".latency_s", ".containers[2].cls",
    or "" for the message as a whole) and `problem` the reason alone.
    """

    def __init__(self, message: str, *, where: str = "", problem: str | None = None) -> None:
        super().__init__(message)
        self.where = where
        self.problem = message if problem is None else problem


class Invalid(Exception):
    """What is wrong with one value; `sub` is the path below the field that failed."""

    def __init__(self, problem: str, sub: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.sub = sub


def show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- value checks: each returns the normalized value or raises Invalid ----------------

Check = Callable[[Any], Any]


def number(desc: str, ok: Callable[[float], bool]) -> Check:
    def check(value: Any) -> float:
        if type(value) is float and math.isfinite(value) and ok(value):
            return value  # the common case, first (decoding is a hot path)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(f"must be {desc}, got {show(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise Invalid(f"must be {desc}, got {show(value)}") from None
        if not math.isfinite(number) or not ok(number):
            raise Invalid(f"must be {desc}, got {show(value)}")
        return number

    return check


def integer(minimum: int) -> Check:
    def check(value: Any) -> int:
        if type(value) is int and value >= minimum:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise Invalid(f"must be an integer >= {minimum}, got {show(value)}")
        return int(value)

    return check


def optional(inner: Check) -> Check:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    return check


def one_of(*choices: str) -> Check:
    """One of a few fixed strings."""
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise Invalid(f"must be one of {', '.join(repr(c) for c in choices)}, got {show(value)}")
        return value

    return check


def text(value: Any) -> str:
    if not isinstance(value, str):
        raise Invalid(f"must be a string, got {show(value)}")
    if len(value) > MAX_TEXT_CHARS:
        raise Invalid(f"must be at most {MAX_TEXT_CHARS} characters, got {len(value)}")
    return str(value)


def ident(value: Any) -> str:
    try:
        return subjects.validate_id(value)
    except ValueError as e:  # "id 'a b' contains ..." -> "'a b' contains ..." after the path
        raise Invalid(str(e).removeprefix("id ")) from None


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"must be true or false, got {show(value)}")
    return value


def tuple_of(inner: Check) -> Check:
    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise Invalid(f"must be a list, got {show(value)}")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(inner(item))
            except Invalid as e:
                raise Invalid(e.problem, f"[{i}]{e.sub}") from None
        return tuple(out)

    return check


def float_map(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise Invalid(f"must be a map of names to numbers, got {show(value)}")
    out: dict[str, float] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise Invalid(f"keys must be non-empty strings, got {show(key)}")
        try:
            out[key] = FINITE(item)
        except Invalid as e:
            raise Invalid(e.problem, f"[{key!r}]") from None
    return out


PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def param_map(value: Any) -> dict[str, float]:
    """A float_map whose keys are parameter names (a policy's dataclass fields): anything else is
    refused here, before a worker echoes it into its reply and its log."""
    out = float_map(value)
    for key in out:
        if not PARAM_NAME.fullmatch(key):
            raise Invalid(f"keys must be parameter names (a letter or _, then letters, digits or _; "
                          f"at most 64), got {show(key)}")
    return out


def nested(cls: type) -> Check:
    def check(value: Any) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise Invalid(f"must be a map, got {show(value)}")
        return build(cls, value)

    return check


POSITIVE = number("a finite number > 0", lambda x: x > 0)
def seconds_within(lo: float, hi: float, what: str) -> Check:
    """A number > 0 (POSITIVE's message), then within [lo, hi] seconds (issue 11's bounds)."""
    def check(value: Any) -> float:
        x = POSITIVE(value)
        if x < lo:
            raise Invalid(f"must be at least {lo:g} seconds{what}, got {show(value)}")
        if x > hi:
            raise Invalid(f"must be at most {hi:g} seconds{what}, got {show(value)}")
        return x

    return check


OBJECTIVE = seconds_within(bounds.MIN_OBJECTIVE_S, bounds.MAX_OBJECTIVE_S, " per batch")
LATENCY = seconds_within(0.0, bounds.MAX_LATENCY_S, " (a week)")
INTERVAL = seconds_within(bounds.MIN_INTERVAL_S, bounds.MAX_INTERVAL_S, "")
NONNEG = number("a finite number >= 0", lambda x: x >= 0)
FINITE = number("a finite number", lambda x: True)
UNIX_S = number("a unix time in seconds (finite, >= 0)", lambda x: x >= 0)
OPEN_FRACTION = number("a number in (0, 1)", lambda x: 0 < x < 1)
FRACTION = number("a number in [0, 1]", lambda x: 0 <= x <= 1)
IDS = tuple_of(ident)


def checked(
    check: Check,
    *,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    from_envelope: str | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A dataclass field with its check.

    `from_envelope`: when absent, take that envelope key. `aliases`: older wire
    names of the field, read when the field itself is absent (a renamed field
    keeps decoding from senders of an earlier schema version).
    """
    meta = {"check": check, "from_envelope": from_envelope, "aliases": aliases}
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# --- building and checking dataclasses -----------------------------------------------


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    check: Check | None
    source: str | None
    default: Any
    factory: Any
    aliases: tuple[str, ...] = ()


_SPECS: dict[type, tuple[_Spec, ...]] = {}


def specs(cls: type) -> tuple[_Spec, ...]:
    """A message class's fields with their checks, computed once (decoding is a hot path)."""
    specs = _SPECS.get(cls)
    if specs is None:
        specs = tuple(
            _Spec(f.name, f.metadata.get("check"), f.metadata.get("from_envelope"), f.default, f.default_factory,
                  f.metadata.get("aliases", ()))
            for f in dataclasses.fields(cls)
        )
        _SPECS[cls] = specs
    return specs


def validate(obj: Any) -> None:
    """Check and normalize every field of a freshly built message (its __post_init__)."""
    for f in specs(type(obj)):
        if f.check is None:
            continue
        value = getattr(obj, f.name)
        if value is None and f.source:
            continue
        try:
            normalized = f.check(value)
        except Invalid as e:
            raise schema_error(obj.NAME, f".{f.name}{e.sub}", e.problem) from None
        if normalized is not value:
            object.__setattr__(obj, f.name, normalized)
    try:
        obj._cross_check()
    except Invalid as e:
        raise schema_error(obj.NAME, e.sub, e.problem) from None


def schema_error(name: str, where: str, problem: str) -> SchemaError:
    return SchemaError(f"{name}{where}: {problem}", where=where, problem=problem)


def build(cls: type, data: Mapping[Any, Any], envelope: Mapping[str, Any] | None = None) -> Any:
    """Read `cls` from a decoded map: check each known field, ignore unknown ones.

    Each field is checked once here; the object is then made without running
    the same checks again in __post_init__ (only the cross-field check runs).
    """
    obj: Any = object.__new__(cls)
    for f in specs(cls):
        value = data.get(f.name, _ABSENT)
        if value is _ABSENT:
            for old in f.aliases:
                value = data.get(old, _ABSENT)
                if value is not _ABSENT:
                    break
        if value is not _ABSENT and not (value is None and f.source):
            raw = value
        elif f.source and envelope is not None:
            raw = envelope[f.source]
        elif f.default is not dataclasses.MISSING:
            object.__setattr__(obj, f.name, f.default)
            continue
        elif f.factory is not dataclasses.MISSING:
            object.__setattr__(obj, f.name, f.factory())
            continue
        else:
            raise Invalid("missing required field", f".{f.name}")
        try:
            object.__setattr__(obj, f.name, f.check(raw) if f.check is not None else raw)
        except Invalid as e:
            raise Invalid(e.problem, f".{f.name}{e.sub}") from None
    obj._cross_check()  # raises Invalid
    return obj


_ABSENT = object()


_SCALARS = frozenset({str, int, float, bool, type(None), bytes})
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
"""Each dataclass's field names, read once: a decision of 100 containers has some 900 values, and asking
`dataclasses` for each one's fields took most of the time a worker spent encoding it."""


def to_wire(value: Any) -> Any:
    """A value as msgpack/JSON can carry it: dataclasses as maps, enums by value."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, enum.Enum):
        return value.value
    names = _FIELD_NAMES.get(kind)
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(value))
    if names is not None:
        return {name: to_wire(getattr(value, name)) for name in names}
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    return value


class Checked:
    """Base of every schema dataclass: validate on construction."""

    __slots__ = ()
    NAME: ClassVar[str] = ""

    def __post_init__(self) -> None:
        validate(self)

    def _cross_check(self) -> None:
        """Checks that involve more than one field (override; raise Invalid)."""
