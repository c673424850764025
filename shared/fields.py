"""The field types every message and public request is made of, and the errors they give.

Why its own module: the wire messages (`shared.schema`), the public JSON
requests and replies (`shared.public`) and anything later that crosses a
process boundary need the same rules. Each rule is stated once, as a
msgspec constraint on an annotated type (`Positive` is a float with
`Meta(gt=0, le=<largest float>)`: finite and > 0), and msgspec applies it
while it decodes; `shared.checked` words an error from the same
constraint, in one line that names the field ("latency.latency_s: must be
a finite number > 0, got -3").

Ids (node, container, job names) follow `shared.subjects.is_good_id`
(printable, no whitespace, no `*`, `>` or `~`, at most 200 characters):
msgspec's patterns cannot say "printable", so the structs that hold ids
check them after building and decoding (`shared.checked.Checked`).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

from msgspec import Meta

from shared import subjects
from shared.core import bounds

MAX_TEXT_CHARS = 4096
"""Longest text field accepted in a message."""

_BIG = sys.float_info.max
"""A float bound that leaves out only the infinities (and NaN, which no comparison lets through)."""


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


def schema_error(name: str, where: str, problem: str) -> SchemaError:
    return SchemaError(f"{name}{where}: {problem}", where=where, problem=problem)


# --- the field types ---------------------------------------------------------------------------------

Positive = Annotated[float, Meta(gt=0, le=_BIG, description="a finite number > 0")]
NonNeg = Annotated[float, Meta(ge=0, le=_BIG, description="a finite number >= 0")]
Finite = Annotated[float, Meta(ge=-_BIG, le=_BIG, description="a finite number")]
UnixS = Annotated[float, Meta(ge=0, le=_BIG, description="a unix time in seconds (finite, >= 0)")]
OpenFraction = Annotated[float, Meta(gt=0, lt=1, description="a number in (0, 1)")]
Fraction = Annotated[float, Meta(ge=0, le=1, description="a number in [0, 1]")]
# Seconds within issue 11's bounds: the words after "seconds" in the error go in `extra`.
ObjectiveS = Annotated[float, Meta(ge=bounds.MIN_OBJECTIVE_S, le=bounds.MAX_OBJECTIVE_S,
                                   extra={"seconds": " per batch"})]
LatencyS = Annotated[float, Meta(gt=0, le=bounds.MAX_LATENCY_S, extra={"seconds": " (a week)"})]
IntervalS = Annotated[float, Meta(ge=bounds.MIN_INTERVAL_S, le=bounds.MAX_INTERVAL_S, extra={"seconds": ""})]
Percentile = Annotated[float, Meta(gt=0, lt=100, description="a percentile in (0, 100)")]
"""A percentile objective's percentile (95: p95)."""
WindowS = Annotated[float, Meta(gt=0, le=bounds.MAX_WINDOW_S, extra={"seconds": " (an hour)"})]
"""The window a percentile is taken over, in seconds (> 0)."""
Count = Annotated[int, Meta(ge=0)]
"""An integer >= 0."""
Count1 = Annotated[int, Meta(ge=1)]
"""An integer >= 1."""
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]
Ident = Annotated[str, Meta(extra={"ident": True})]
"""A node, container or job id (checked by `shared.checked.Checked.__post_init__`: `subjects.is_good_id`)."""
Ids = tuple[Ident, ...]
FloatMap = dict[Annotated[str, Meta(min_length=1)], Finite]
"""Names to finite numbers (a policy's extra figures)."""
ParamMap = dict[Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], Finite]
"""A FloatMap whose keys are parameter names (a policy's dataclass fields): anything else is refused
before a worker echoes it into its reply and its log."""


def ident_problem(value: Any) -> str:
    try:
        subjects.validate_id(value)
    except ValueError as e:  # "id 'a b' contains ..." -> "'a b' contains ..." after the path
        return str(e).removeprefix("id ")
    return f"must be an id, got {show(value)}"




def check_ids(names: Any) -> None:
    """A list of ids (Invalid naming the first bad one, "[2]")."""
    if not isinstance(names, list | tuple):
        raise Invalid(f"must be a list, got {show(names)}")
    for i, name in enumerate(names):
        if not (type(name) is str and subjects.is_good_id(name)):
            raise Invalid(ident_problem(name), f"[{i}]")


def check_id(value: Any) -> str:
    """`value` if it is an id (`subjects.is_good_id`), else Invalid saying what is wrong with it."""
    if type(value) is str and subjects.is_good_id(value):
        return value
    raise Invalid(ident_problem(value))
