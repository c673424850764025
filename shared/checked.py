"""Checked structs: the base of every message and request, and the one-line error for what msgspec refuses.

Why apart from the field types (`shared.fields`): msgspec checks the rules
while it decodes and says where it stopped in its own words
("Expected `float` > 0.0 - at `$.latency_s`"); the people who read DQoES's
errors were promised one line in the project's words, naming the field
("latency.latency_s: must be a finite number > 0, got -3"). When msgspec
refuses a value, `explain` walks the struct's annotated types over the
decoded data, in field order, and words the first problem from the
constraint's description and bounds, so the text follows the rule rather
than repeating it. `with_aliases` reads the older wire names of renamed
fields; `convert` is msgspec.convert with both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import msgspec
import msgspec.inspect as mi

from shared import subjects
from shared.fields import Invalid, SchemaError, ident_problem, schema_error, show

S = TypeVar("S")


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every message and request: frozen, keyword-built, ids checked after building or decoding.

    `NAME` is what an error starts with; `_cross_check` (override) checks what involves more than one
    field and may fill a field from others (`msgspec.structs.force_setattr`), raising `Invalid`.
    """

    NAME: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, kind in _id_fields(type(self)):
            value = getattr(self, name)
            if kind == "one":
                if not (type(value) is str and subjects.is_good_id(value)):
                    _bad_id(self.NAME, f".{name}", value)
            elif kind == "opt":
                if value is not None and not (type(value) is str and subjects.is_good_id(value)):
                    _bad_id(self.NAME, f".{name}", value)
            else:
                for i, item in enumerate(value):
                    if not (type(item) is str and subjects.is_good_id(item)):
                        _bad_id(self.NAME, f".{name}[{show(item) if kind == 'keys' else i}]", item)
        try:
            self._cross_check()
        except Invalid as e:
            raise schema_error(self.NAME, e.sub, e.problem) from None

    def _cross_check(self) -> None:
        """Checks that involve more than one field (override; raise Invalid)."""

    @classmethod
    def build(cls: type[S], **fields: Any) -> S:
        """Build from values a person gave (a form, the command line): every rule checked, numbers made
        floats, lists tuples; SchemaError naming the field. (Plain construction checks ids and the
        cross-field rules only; `shared.schema.encode` checks the rest before anything is sent.)"""
        return convert(cls, fields)


def _bad_id(name: str, where: str, value: Any) -> None:
    raise schema_error(name, where, ident_problem(value))


_ID_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {}


def _is_ident(t: Any) -> bool:
    return isinstance(t, mi.Metadata) and bool((t.extra or {}).get("ident"))


def _id_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """(field, kind) for each field of `cls` holding ids: one, opt (or None), many (a tuple) or keys."""
    out = _ID_FIELDS.get(cls)
    if out is None:
        found = []
        for f in _struct_info(cls).fields:
            t = f.type
            if isinstance(t, mi.Metadata) and not _is_ident(t):
                t = t.type
            if _is_ident(t):
                found.append((f.name, "one"))
            elif isinstance(t, mi.UnionType) and any(_is_ident(u) for u in t.types):
                found.append((f.name, "opt"))
            elif isinstance(t, mi.VarTupleType | mi.ListType) and _is_ident(t.item_type):
                found.append((f.name, "many"))
            elif isinstance(t, mi.DictType) and _is_ident(t.key_type):
                found.append((f.name, "keys"))
        out = _ID_FIELDS[cls] = tuple(found)
    return out


_INFO: dict[type, mi.StructType] = {}


def _struct_info(cls: type) -> mi.StructType:
    info = _INFO.get(cls)
    if info is None:
        got = mi.type_info(cls)
        assert isinstance(got, mi.StructType)
        info = _INFO[cls] = got
    return info


# --- wording an error ----------------------------------------------------------------------------------

Explainer = Callable[[Any], object]
"""Raises Invalid naming what is wrong with a value (or returns when it finds nothing)."""
EXPLAIN: dict[str, Explainer] = {}
"""Wordings of their own for a few fields (Meta(extra={"explain": name})), registered where they live."""


def explain(cls: type, data: Any) -> Invalid:
    """The first problem, in field order, with `data` read as `cls` (a Checked struct); `Invalid("")`
    when none is found (the caller then words msgspec's own message)."""
    try:
        _struct(cls, data)
    except Invalid as e:
        return e
    return Invalid("")


def _struct(cls: type, data: Any) -> None:
    if not isinstance(data, Mapping):
        raise Invalid(f"must be a map, got {show(data)}")
    for f in _struct_info(cls).fields:
        if f.name not in data:
            if f.required:
                raise Invalid("missing required field", f".{f.name}")
            continue
        try:
            _value(f.type, data[f.name])
        except Invalid as e:
            raise Invalid(e.problem, f".{f.name}{e.sub}") from None
    try:
        msgspec.convert(dict(data), cls)
    except msgspec.ValidationError as e:
        cause = e.__cause__
        if isinstance(cause, SchemaError):  # from __post_init__: the ids and the cross checks
            raise Invalid(cause.problem, cause.where) from None


def _value(t: mi.Type, v: Any, optional: bool = False) -> None:
    if isinstance(t, mi.Metadata):
        extra = t.extra or {}
        if extra.get("ident"):
            if not (type(v) is str and subjects.is_good_id(v)):
                raise Invalid(ident_problem(v))
            return
        if "explain" in extra:
            EXPLAIN[extra["explain"]](v)
            return
        if "seconds" in extra:
            _seconds(t.type, v, extra["seconds"])
            return
        _plain(t.type, v, optional, (t.extra_json_schema or {}).get("description"))
        return
    _plain(t, v, optional)


def _plain(t: mi.Type, v: Any, optional: bool = False, desc: str | None = None) -> None:
    if isinstance(t, mi.UnionType):
        if v is None and any(isinstance(u, mi.NoneType) for u in t.types):
            return
        rest = [u for u in t.types if not isinstance(u, mi.NoneType)]
        _value(rest[0], v, optional=len(rest) < len(t.types))
    elif isinstance(t, mi.FloatType):
        if not (_number(v) and _within(t, v)):
            raise Invalid(f"must be {desc or 'a number'}, got {show(v)}")
    elif isinstance(t, mi.IntType):
        if isinstance(v, bool) or not isinstance(v, int) or (t.ge is not None and v < t.ge):
            raise Invalid(f"must be an integer >= {t.ge if t.ge is not None else 0}, got {show(v)}")
        if t.le is not None and v > t.le:
            raise Invalid(f"must be at most {t.le}, got {v}")
    elif isinstance(t, mi.StrType):
        if not isinstance(v, str):
            raise Invalid(f"must be a string, got {show(v)}")
        if t.max_length is not None and len(v) > t.max_length:
            raise Invalid(f"must be at most {t.max_length} characters, got {len(v)}")
    elif isinstance(t, mi.BoolType):
        if not isinstance(v, bool):
            raise Invalid(f"must be true or false, got {show(v)}")
    elif isinstance(t, mi.EnumType):
        _choice([m.value for m in t.cls], v, " or nil" if optional else "")
    elif isinstance(t, mi.LiteralType):
        _choice(list(t.values), v, "")
    elif isinstance(t, mi.VarTupleType | mi.ListType):
        if not isinstance(v, list | tuple):
            raise Invalid(f"must be a list, got {show(v)}")
        for i, item in enumerate(v):
            try:
                _value(t.item_type, item)
            except Invalid as e:
                raise Invalid(e.problem, f"[{i}]{e.sub}") from None
    elif isinstance(t, mi.DictType):
        _float_map(t, v)
    elif isinstance(t, mi.StructType):
        _struct(t.cls, v)


def _choice(choices: list[Any], v: Any, tail: str) -> None:
    if not isinstance(v, str) or v not in choices:
        raise Invalid(f"must be one of {', '.join(repr(c) for c in choices)}{tail}, got {show(v)}")


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and (
        isinstance(v, int) or math.isfinite(v))


def _within(t: mi.FloatType, v: float) -> bool:
    try:
        x = float(v)
        return math.isfinite(x) and not (
            (t.gt is not None and not x > t.gt) or (t.ge is not None and not x >= t.ge)
            or (t.lt is not None and not x < t.lt) or (t.le is not None and not x <= t.le))
    except OverflowError:
        return False


def _seconds(t: Any, v: Any, what: str) -> None:
    """A number > 0, then within the type's bounds in seconds (issue 11's words)."""
    try:
        x = float(v) if _number(v) else math.nan
    except OverflowError:
        x = math.inf
    if not (math.isfinite(x) and x > 0):
        raise Invalid(f"must be a finite number > 0, got {show(v)}")
    lo = t.ge if t.ge is not None else 0.0
    if x < lo:
        raise Invalid(f"must be at least {lo:g} seconds{what}, got {show(v)}")
    if t.le is not None and x > t.le:
        raise Invalid(f"must be at most {t.le:g} seconds{what}, got {show(v)}")


def _float_map(t: mi.DictType, v: Any) -> None:
    if not isinstance(v, Mapping):
        raise Invalid(f"must be a map of names to numbers, got {show(v)}")
    for key, item in v.items():
        if not isinstance(key, str) or not key:
            raise Invalid(f"keys must be non-empty strings, got {show(key)}")
        if isinstance(t.key_type, mi.StrType) and t.key_type.pattern and not re.search(t.key_type.pattern, key):
            raise Invalid(f"keys must be parameter names (a letter or _, then letters, digits or _; "
                          f"at most 64), got {show(key)}")
        try:
            _value(t.value_type, item)
        except Invalid as e:
            raise Invalid(e.problem, f"[{key!r}]") from None



def with_aliases(cls: type, data: Any) -> Any:
    """`data` (a decoded map read as `cls`) with each field's older wire name, when the field itself is
    absent, read as the field (`ALIASES` {old: new} on the struct), in nested structs too; keys that
    are not strings are left out (no field can have one). The map is copied, never changed."""
    if not isinstance(data, Mapping):
        return data
    out = {k: v for k, v in data.items() if isinstance(k, str)}
    for old, new in getattr(cls, "ALIASES", {}).items():
        if new not in out and old in out:
            out[new] = out.pop(old)
    for f in _struct_info(cls).fields:
        inner = _nested_struct(f.type)
        if inner is None or f.name not in out:
            continue
        value = out[f.name]
        kind, sub = inner
        if kind == "one":
            out[f.name] = with_aliases(sub, value)
        elif kind == "many" and isinstance(value, list | tuple):
            out[f.name] = [with_aliases(sub, v) for v in value]
        elif kind == "values" and isinstance(value, Mapping):
            out[f.name] = {k: with_aliases(sub, v) for k, v in value.items()}
    return out


def _nested_struct(t: Any) -> tuple[str, type] | None:
    if isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.StructType):
        return "one", t.cls
    if isinstance(t, mi.VarTupleType | mi.ListType) and isinstance(t.item_type, mi.StructType):
        return "many", t.item_type.cls
    if isinstance(t, mi.DictType) and isinstance(t.value_type, mi.StructType):
        return "values", t.value_type.cls
    return None


def convert(cls: type[S], data: Any, name: str | None = None) -> S:
    """`cls` from decoded data (a map; older field names read), checked; SchemaError naming the field,
    prefixed with `name` (default: the struct's NAME)."""
    data = with_aliases(cls, data)
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as e:
        raise refusal(cls, data, e, name) from None


def refusal(cls: type, data: Any, error: Exception, name: str | None = None) -> SchemaError:
    """The one-line SchemaError for `data` that msgspec refused as `cls` (with `error`)."""
    label = getattr(cls, "NAME", "") if name is None else name
    found = explain(cls, data)
    if found.problem:
        return schema_error(label, found.sub, found.problem)
    cause = error.__cause__
    if isinstance(cause, SchemaError):
        return schema_error(label, cause.where, cause.problem)
    return SchemaError(f"{label}: {' '.join(str(error).split())}")
