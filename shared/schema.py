"""Every message DQoES puts on the bus, its wire format and its validation, versioned.

Why one module: the worker, the manager, the inference containers, the
dashboard and outside clients are written and deployed separately, so the
bytes between them are the contract. Each message is a frozen dataclass whose
field names carry their units; `encode` turns it into a msgpack map with a
flat envelope (`type`, `v`, `ts` in unix seconds, `sender`) followed by the
message's own fields; `decode` checks everything it reads.

Rules, in the order they bite:
- Decoding never raises anything but `SchemaError`, whatever the bytes are,
  and its message names the field (`latency.latency_s: must be a finite
  number > 0, got -3`). The bus drops such a message and counts it.
- Unknown fields in internal messages are ignored, and a message with a newer
  `v` than SCHEMA_VERSION is decoded when its required fields are there:
  a newer sender can add fields without breaking older receivers.
- The public target request (`parse_target`) is the exception: it rejects
  unknown fields, because there a typo ("objetive") must not be silently
  ignored.
- Messages validate themselves when built, so a service cannot publish a
  message its peers would reject.

Golden-bytes fixtures in tests/fixtures/golden/ pin the wire format; changing
a field name or order breaks them on purpose.

The cluster summary is JSON instead of msgpack (`ClusterState.to_json`):
it is public, and any NATS client, `nats sub` included, should read it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import msgpack
import orjson

from shared import subjects
from shared.core.types import Cls, Decision

SCHEMA_VERSION = 1
"""Version written into every message's `v`; bump when a field changes meaning."""

MAX_TARGET_BYTES = 64 * 1024
"""A public target request larger than this is rejected before it is parsed."""

MAX_OBJECTIVE_S = 86400.0
"""Largest accepted objective: a day per batch is surely a typo."""

ENVELOPE_KEYS = ("type", "v", "ts", "sender")

_MAX_TEXT_CHARS = 4096


class SchemaError(ValueError):
    """A message or request that does not fit the schema; the text names the field.

    `where` is the path below the message name (".latency_s", ".containers[2].cls",
    or "" for the message as a whole) and `problem` the reason alone.
    """

    def __init__(self, message: str, *, where: str = "", problem: str | None = None) -> None:
        super().__init__(message)
        self.where = where
        self.problem = message if problem is None else problem


class _Invalid(Exception):
    """What is wrong with one value; `sub` is the path below the field that failed."""

    def __init__(self, problem: str, sub: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.sub = sub


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --- value checks: each returns the normalized value or raises _Invalid ----------------

Check = Callable[[Any], Any]


def _number(desc: str, ok: Callable[[float], bool]) -> Check:
    def check(value: Any) -> float:
        if type(value) is float and math.isfinite(value) and ok(value):
            return value  # the common case, first (decoding is a hot path)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(f"must be {desc}, got {_show(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise _Invalid(f"must be {desc}, got {_show(value)}") from None
        if not math.isfinite(number) or not ok(number):
            raise _Invalid(f"must be {desc}, got {_show(value)}")
        return number

    return check


def _integer(minimum: int) -> Check:
    def check(value: Any) -> int:
        if type(value) is int and value >= minimum:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _Invalid(f"must be an integer >= {minimum}, got {_show(value)}")
        return int(value)

    return check


def _optional(inner: Check) -> Check:
    def check(value: Any) -> Any:
        return None if value is None else inner(value)

    return check


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"must be a string, got {_show(value)}")
    if len(value) > _MAX_TEXT_CHARS:
        raise _Invalid(f"must be at most {_MAX_TEXT_CHARS} characters, got {len(value)}")
    return str(value)


def _ident(value: Any) -> str:
    try:
        return subjects.validate_id(value)
    except ValueError as e:  # "id 'a b' contains ..." -> "'a b' contains ..." after the path
        raise _Invalid(str(e).removeprefix("id ")) from None


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"must be true or false, got {_show(value)}")
    return value


def _cls(value: Any) -> Cls | None:
    if value is None:
        return None
    if isinstance(value, str) and value in ("G", "S", "B"):
        return Cls(value)
    raise _Invalid(f"must be one of 'G', 'S', 'B' or nil, got {_show(value)}")


def _tuple_of(inner: Check) -> Check:
    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise _Invalid(f"must be a list, got {_show(value)}")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(inner(item))
            except _Invalid as e:
                raise _Invalid(e.problem, f"[{i}]{e.sub}") from None
        return tuple(out)

    return check


def _float_map(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise _Invalid(f"must be a map of names to numbers, got {_show(value)}")
    out: dict[str, float] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise _Invalid(f"keys must be non-empty strings, got {_show(key)}")
        try:
            out[key] = _FINITE(item)
        except _Invalid as e:
            raise _Invalid(e.problem, f"[{key!r}]") from None
    return out


MEMBER_KEYS = ("G", "S", "B", "pending")


def _members(value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise _Invalid(f"must be a map with keys G, S, B, pending, got {_show(value)}")
    for key in value:
        if key not in MEMBER_KEYS:
            raise _Invalid(f"unknown key {_show(key)} (allowed: G, S, B, pending)")
    out: dict[str, tuple[str, ...]] = {}
    for key in MEMBER_KEYS:
        try:
            out[key] = _IDS(value.get(key, ()))
        except _Invalid as e:
            raise _Invalid(e.problem, f"[{key!r}]{e.sub}") from None
    return out


def _nested(cls: type) -> Check:
    def check(value: Any) -> Any:
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise _Invalid(f"must be a map, got {_show(value)}")
        return _build(cls, value)

    return check


_POSITIVE = _number("a finite number > 0", lambda x: x > 0)
_NONNEG = _number("a finite number >= 0", lambda x: x >= 0)
_FINITE = _number("a finite number", lambda x: True)
_UNIX_S = _number("a unix time in seconds (finite, >= 0)", lambda x: x >= 0)
_OPEN_FRACTION = _number("a number in (0, 1)", lambda x: 0 < x < 1)
_IDS = _tuple_of(_ident)


def _f(
    check: Check,
    *,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    from_envelope: str | None = None,
) -> Any:
    """A dataclass field with its check; `from_envelope`: when absent, take that envelope key."""
    meta = {"check": check, "from_envelope": from_envelope}
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


_SPECS: dict[type, tuple[_Spec, ...]] = {}


def _specs(cls: type) -> tuple[_Spec, ...]:
    """A message class's fields with their checks, computed once (decoding is a hot path)."""
    specs = _SPECS.get(cls)
    if specs is None:
        specs = tuple(
            _Spec(f.name, f.metadata.get("check"), f.metadata.get("from_envelope"), f.default, f.default_factory)
            for f in dataclasses.fields(cls)
        )
        _SPECS[cls] = specs
    return specs


def _validate(obj: Any) -> None:
    """Check and normalize every field of a freshly built message (its __post_init__)."""
    for f in _specs(type(obj)):
        if f.check is None:
            continue
        value = getattr(obj, f.name)
        if value is None and f.source:
            continue
        try:
            normalized = f.check(value)
        except _Invalid as e:
            raise _schema_error(obj.NAME, f".{f.name}{e.sub}", e.problem) from None
        if normalized is not value:
            object.__setattr__(obj, f.name, normalized)
    try:
        obj._cross_check()
    except _Invalid as e:
        raise _schema_error(obj.NAME, e.sub, e.problem) from None


def _schema_error(name: str, where: str, problem: str) -> SchemaError:
    return SchemaError(f"{name}{where}: {problem}", where=where, problem=problem)


def _build(cls: type, data: Mapping[Any, Any], envelope: Mapping[str, Any] | None = None) -> Any:
    """Read `cls` from a decoded map: check each known field, ignore unknown ones.

    Each field is checked once here; the object is then made without running
    the same checks again in __post_init__ (only the cross-field check runs).
    """
    obj = object.__new__(cls)
    for f in _specs(cls):
        value = data.get(f.name, _ABSENT)
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
            raise _Invalid("missing required field", f".{f.name}")
        try:
            object.__setattr__(obj, f.name, f.check(raw) if f.check is not None else raw)
        except _Invalid as e:
            raise _Invalid(e.problem, f".{f.name}{e.sub}") from None
    obj._cross_check()  # raises _Invalid
    return obj


_ABSENT = object()


def _to_wire(value: Any) -> Any:
    if isinstance(value, Cls):
        return str(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


class _Checked:
    """Base of every schema dataclass: validate on construction."""

    __slots__ = ()
    NAME: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _validate(self)

    def _cross_check(self) -> None:
        """Checks that involve more than one field (override; raise _Invalid)."""


# --- internal messages (msgpack) ------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyEvent(_Checked):
    """Inference container -> worker: one batch finished.

    `cpu_s` is the CPU time the batch used (0.0: not measured); `finished_at`
    is when it finished (unix s; absent on the wire: the envelope's ts).
    """

    TYPE: ClassVar[str] = "latency"
    NAME: ClassVar[str] = "latency"

    container: str = _f(_ident)
    node: str = _f(_ident)
    latency_s: float = _f(_POSITIVE)
    images: int = _f(_integer(1))
    batch: int = _f(_integer(0))
    cpu_s: float = _f(_NONNEG, default=0.0)
    model: str | None = _f(_optional(_text), default=None)
    finished_at: float | None = _f(_UNIX_S, default=None, from_envelope="ts")


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerDecisionMsg(_Checked):
    """One container's part of a round: class, gap q = objective - latency, old and new limit.

    Limits and shares are fractions of the node (1.0 = all its cores); None:
    no limit / not known yet. `cls` None: no batch yet (pending).
    """

    NAME: ClassVar[str] = "container_decision"

    container: str = _f(_ident)
    cls: Cls | None = _f(_cls, default=None)
    q_s: float | None = _f(_optional(_FINITE), default=None)
    latency_s: float | None = _f(_optional(_POSITIVE), default=None)
    cpu_share: float | None = _f(_optional(_NONNEG), default=None)
    old_limit: float | None = _f(_optional(_POSITIVE), default=None)
    new_limit: float | None = _f(_optional(_POSITIVE), default=None)
    reason: str = _f(_text, default="")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionMsg(_Checked):
    """Worker -> anyone: what one control round on one node decided.

    `round` counts rounds on the worker; `at` is when it ran (unix s);
    `interval_s` the delay to the next round; `q_g_s`/`q_b_s` the sums of
    q over G and B (seconds per batch); `extra` policy-specific numbers.
    """

    TYPE: ClassVar[str] = "decision"
    NAME: ClassVar[str] = "decision"

    node: str = _f(_ident)
    policy: str = _f(_text)
    round: int = _f(_integer(0))
    at: float = _f(_UNIX_S)
    event: str | None = _f(_optional(_text), default=None)
    listener: str = _f(_text, default="")
    interval_s: float = _f(_POSITIVE)
    q_g_s: float = _f(_FINITE)
    q_b_s: float = _f(_FINITE)
    satisfied: int = _f(_integer(0))
    containers: tuple[ContainerDecisionMsg, ...] = _f(_tuple_of(_nested(ContainerDecisionMsg)))
    extra: dict[str, float] = _f(_float_map, factory=dict)

    @classmethod
    def from_decision(cls, d: Decision, round: int, at: float) -> DecisionMsg:
        """The message for a core `Decision`; `at` is wall-clock (the core's now_s may be virtual)."""
        return cls(
            node=d.node,
            policy=d.policy,
            round=round,
            at=at,
            event=d.event,
            listener=d.listener,
            interval_s=d.interval_s,
            q_g_s=d.q_g_s,
            q_b_s=d.q_b_s,
            satisfied=d.satisfied,
            containers=tuple(
                ContainerDecisionMsg(
                    container=c.name,
                    cls=c.cls,
                    q_s=c.q_s,
                    latency_s=c.latency_s,
                    cpu_share=c.cpu_share,
                    old_limit=c.old_limit,
                    new_limit=c.new_limit,
                    reason=c.reason,
                )
                for c in d.containers
            ),
            extra=dict(d.extra),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerState(_Checked):
    """One container in a node's state. `managed` False: seen but not controlled (no objective)."""

    NAME: ClassVar[str] = "container_state"

    container: str = _f(_ident)
    model: str | None = _f(_optional(_text), default=None)
    objective_s: float | None = _f(_optional(_POSITIVE), default=None)
    alpha: float | None = _f(_optional(_OPEN_FRACTION), default=None)
    latency_s: float | None = _f(_optional(_POSITIVE), default=None)
    cls: Cls | None = _f(_cls, default=None)
    q_s: float | None = _f(_optional(_FINITE), default=None)
    limit: float | None = _f(_optional(_POSITIVE), default=None)
    cpu_share: float | None = _f(_optional(_NONNEG), default=None)
    managed: bool = _f(_boolean, default=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState(_Checked):
    """Worker -> manager and dashboard: everything about one node after a round.

    `members` maps G, S, B and pending to container names (all four keys are
    always present after construction); `expected` lists containers that
    have an objective but are not running yet; `params` the policy's
    parameters in force (alpha, beta, initial_interval_s, ...).
    """

    TYPE: ClassVar[str] = "node_state"
    NAME: ClassVar[str] = "node_state"

    node: str = _f(_ident)
    policy: str = _f(_text)
    cores: float = _f(_POSITIVE)
    round: int = _f(_integer(0))
    at: float = _f(_UNIX_S)
    interval_s: float = _f(_POSITIVE)
    q_g_s: float = _f(_FINITE)
    q_b_s: float = _f(_FINITE)
    satisfied: int = _f(_integer(0))
    members: dict[str, tuple[str, ...]] = _f(_members)
    containers: tuple[ContainerState, ...] = _f(_tuple_of(_nested(ContainerState)))
    expected: tuple[str, ...] = _f(_IDS, default=())
    params: dict[str, float] = _f(_float_map, factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectiveAssign(_Checked):
    """Manager -> worker: the objective for one container (`objective_s` None clears it).

    `alpha` None: the node's default. `revision` is the key-value revision it
    came from, so a worker can ignore an older assignment arriving late.
    """

    TYPE: ClassVar[str] = "objective"
    NAME: ClassVar[str] = "objective"

    container: str = _f(_ident)
    objective_s: float | None = _f(_optional(_POSITIVE))
    alpha: float | None = _f(_optional(_OPEN_FRACTION), default=None)
    revision: int = _f(_integer(0))


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlMsg(_Checked):
    """Operator -> worker: change policy parameters at runtime; None leaves one unchanged."""

    TYPE: ClassVar[str] = "control"
    NAME: ClassVar[str] = "control"

    alpha: float | None = _f(_optional(_OPEN_FRACTION), default=None)
    beta: float | None = _f(_optional(_OPEN_FRACTION), default=None)
    initial_interval_s: float | None = _f(_optional(_POSITIVE), default=None)
    max_interval_s: float | None = _f(_optional(_POSITIVE), default=None)

    def _cross_check(self) -> None:
        lo, hi = self.initial_interval_s, self.max_interval_s
        if lo is not None and hi is not None and hi < lo:
            raise _Invalid(f"must be >= initial_interval_s ({lo:g}), got {hi:g}", ".max_interval_s")


Message = LatencyEvent | DecisionMsg | NodeState | ObjectiveAssign | ControlMsg
MESSAGE_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls for cls in (LatencyEvent, DecisionMsg, NodeState, ObjectiveAssign, ControlMsg)
}
M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded message with its envelope: who sent it, when (unix s), at which version."""

    msg: Message
    type: str
    v: int
    ts: float
    sender: str


def encode(msg: Message, sender: str, ts: float | None = None) -> bytes:
    """The wire bytes of `msg`: a msgpack map, envelope first, then the fields in order.

    `ts` (unix s) defaults to now. Deterministic for a given (msg, sender, ts).
    """
    if type(msg) not in MESSAGE_TYPES.values():
        raise TypeError(f"not a schema message: {type(msg).__name__}")
    if not isinstance(sender, str):
        raise TypeError(f"sender must be a string, got {type(sender).__name__}")
    ts_s = time.time() if ts is None else ts
    try:
        ts_s = _UNIX_S(ts_s)
    except _Invalid as e:
        raise _schema_error(msg.NAME, ".ts", e.problem) from None
    out: dict[str, Any] = {"type": msg.TYPE, "v": SCHEMA_VERSION, "ts": ts_s, "sender": sender}
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        source = f.metadata.get("from_envelope")
        if value is None and source:
            value = out[source]
        out[f.name] = _to_wire(value)
    return msgpack.packb(out, use_bin_type=True)


def decode_envelope(data: bytes | bytearray | memoryview) -> Envelope:
    """Decode wire bytes into the message and its envelope; SchemaError on anything wrong."""
    try:
        return _decode_envelope(data)
    except SchemaError:
        raise
    except Exception as e:  # a safety net: the contract is "only SchemaError"
        raise SchemaError(f"message: undecodable (internal error: {e!r})") from None


_ENVELOPE_CHECKS: tuple[tuple[str, Check], ...] = (("v", _integer(1)), ("ts", _UNIX_S), ("sender", _text))


def _decode_envelope(data: Any) -> Envelope:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SchemaError(f"message: expected bytes, got {type(data).__name__}")
    try:
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
    except Exception as e:
        raise SchemaError(f"message: not msgpack ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise SchemaError(f"message: must be a msgpack map, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind is None:
        raise _schema_error("message", ".type", "missing required field")
    if not isinstance(kind, str):
        raise _schema_error("message", ".type", f"must be a string, got {_show(kind)}")
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise _schema_error("message", ".type", f"unknown message type {_show(kind)}")
    envelope: dict[str, Any] = {}
    for key, check in _ENVELOPE_CHECKS:
        if key not in obj:
            raise _schema_error(kind, f".{key}", "missing required field")
        try:
            envelope[key] = check(obj[key])
        except _Invalid as e:
            raise _schema_error(kind, f".{key}", e.problem) from None
    try:
        msg = _build(cls, obj, envelope)
    except _Invalid as e:
        raise _schema_error(kind, e.sub, e.problem) from None
    return Envelope(
        msg=msg, type=kind, v=envelope["v"], ts=envelope["ts"], sender=envelope["sender"]
    )


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Decode wire bytes into a message; SchemaError (naming the field) on anything wrong."""
    return decode_envelope(data).msg


def decode_as(data: bytes | bytearray | memoryview, cls: type[M]) -> M:
    """Decode and insist on one message type (SchemaError otherwise)."""
    msg = decode(data)
    if not isinstance(msg, cls):
        expected = getattr(cls, "TYPE", cls.__name__)
        raise SchemaError(f"message.type: expected {expected!r}, got {msg.TYPE!r}")
    return msg


# --- cluster summary (public JSON) ------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSummary(_Checked):
    """One node in the cluster summary: counts per class and the q sums (s per batch)."""

    NAME: ClassVar[str] = "node_summary"

    satisfied: int = _f(_integer(0))
    G: int = _f(_integer(0))
    S: int = _f(_integer(0))
    B: int = _f(_integer(0))
    pending: int = _f(_integer(0))
    q_g_s: float = _f(_FINITE)
    q_s_s: float = _f(_FINITE, default=0.0)
    q_b_s: float = _f(_FINITE)
    interval_s: float = _f(_POSITIVE)
    containers: int = _f(_integer(0))
    policy: str = _f(_text)
    at: float = _f(_UNIX_S)


def _node_map(value: Any) -> dict[str, NodeSummary]:
    if not isinstance(value, Mapping):
        raise _Invalid(f"must be a map of node names to summaries, got {_show(value)}")
    out: dict[str, NodeSummary] = {}
    check = _nested(NodeSummary)
    for node, item in value.items():
        try:
            out[_ident(node)] = check(item)
        except _Invalid as e:
            raise _Invalid(e.problem, f"[{_show(node)}]{e.sub}") from None
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterState(_Checked):
    """The manager's cluster summary, published as JSON on subjects.CLUSTER_STATE.

    Totals add up the nodes; `q_*_s` are sums of q = objective - latency over
    the containers of each class (seconds per batch; Q_G >= 0, Q_B <= 0).
    """

    TYPE: ClassVar[str] = "cluster_state"
    NAME: ClassVar[str] = "cluster_state"

    nodes: dict[str, NodeSummary] = _f(_node_map)
    satisfied_total: int = _f(_integer(0))
    G: int = _f(_integer(0))
    S: int = _f(_integer(0))
    B: int = _f(_integer(0))
    pending: int = _f(_integer(0))
    q_g_s: float = _f(_FINITE)
    q_s_s: float = _f(_FINITE, default=0.0)
    q_b_s: float = _f(_FINITE)
    containers_total: int = _f(_integer(0))
    at: float = _f(_UNIX_S)

    def to_json(self) -> bytes:
        """UTF-8 JSON: {"type": "cluster_state", "v": 1, ...fields, "nodes": {...}}."""
        body = {"type": self.TYPE, "v": SCHEMA_VERSION}
        body.update(_to_wire(self))
        return orjson.dumps(body)

    @classmethod
    def from_json(cls, data: bytes | str) -> ClusterState:
        """Parse and check a cluster summary (unknown fields ignored); SchemaError if bad."""
        try:
            obj = orjson.loads(data)
        except Exception as e:
            raise SchemaError(f"cluster_state: not JSON ({_show(str(e))})") from None
        if not isinstance(obj, dict):
            raise SchemaError(f"cluster_state: must be a JSON object, got {type(obj).__name__}")
        if obj.get("type", cls.TYPE) != cls.TYPE:
            raise SchemaError(
                f"cluster_state.type: expected 'cluster_state', got {_show(obj['type'])}"
            )
        try:
            return _build(cls, obj)
        except _Invalid as e:
            raise _schema_error("cluster_state", e.sub, e.problem) from None


def aggregate(node_states: Iterable[NodeState], at: float) -> ClusterState:
    """Add up node states into the cluster summary (newest state per node wins).

    Q_S (`q_s_s`) is not in NodeState; it is summed from the containers of
    class S. `containers` counts every container a node reports.
    """
    latest: dict[str, NodeState] = {}
    for ns in node_states:
        old = latest.get(ns.node)
        if old is None or ns.at >= old.at:
            latest[ns.node] = ns
    nodes: dict[str, NodeSummary] = {}
    for name in sorted(latest):
        ns = latest[name]
        nodes[name] = NodeSummary(
            satisfied=ns.satisfied,
            G=len(ns.members["G"]),
            S=len(ns.members["S"]),
            B=len(ns.members["B"]),
            pending=len(ns.members["pending"]),
            q_g_s=ns.q_g_s,
            q_s_s=math.fsum(c.q_s for c in ns.containers if c.cls is Cls.S and c.q_s is not None),
            q_b_s=ns.q_b_s,
            interval_s=ns.interval_s,
            containers=len(ns.containers),
            policy=ns.policy,
            at=ns.at,
        )
    summaries = list(nodes.values())
    return ClusterState(
        nodes=nodes,
        satisfied_total=sum(s.satisfied for s in summaries),
        G=sum(s.G for s in summaries),
        S=sum(s.S for s in summaries),
        B=sum(s.B for s in summaries),
        pending=sum(s.pending for s in summaries),
        q_g_s=math.fsum(s.q_g_s for s in summaries),
        q_s_s=math.fsum(s.q_s_s for s in summaries),
        q_b_s=math.fsum(s.q_b_s for s in summaries),
        containers_total=sum(s.containers for s in summaries),
        at=at,
    )


# --- public target requests (dqoes.targets) ---------------------------------------------

TARGET_FIELDS = ("container", "objective", "objective_s", "alpha")


def _objective(value: Any) -> float:
    """The objective of a public request, with a reason a person can act on."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"must be a number of seconds per batch, got {_show(value)}")
    try:
        seconds = float(value)
    except OverflowError:
        raise _Invalid(
            f"must be at most {MAX_OBJECTIVE_S:g} seconds per batch, got a huge number"
        ) from None
    if not math.isfinite(seconds):
        raise _Invalid(f"must be a finite number of seconds per batch, got {_show(value)}")
    if seconds <= 0:
        raise _Invalid(f"must be > 0 seconds per batch, got {_show(value)}")
    if seconds > MAX_OBJECTIVE_S:
        raise _Invalid(
            f"must be at most {MAX_OBJECTIVE_S:g} seconds per batch (a day), got {_show(value)}"
        )
    return seconds


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetRequest(_Checked):
    """One objective asked for on the public subject: seconds per batch for a container."""

    NAME: ClassVar[str] = "target"

    container: str = _f(_ident)
    objective_s: float = _f(_objective)
    alpha: float | None = _f(_optional(_OPEN_FRACTION), default=None)

    def to_json(self) -> bytes:
        """The request as a client sends it: {"container": ..., "objective": ..., ["alpha": ...]}."""
        body: dict[str, Any] = {"container": self.container, "objective": self.objective_s}
        if self.alpha is not None:
            body["alpha"] = self.alpha
        return orjson.dumps(body)


def _load_map(payload: bytes) -> Any:
    """JSON first (what `nats req` sends), then msgpack."""
    try:
        return orjson.loads(payload)
    except Exception as json_error:
        try:
            return msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception:
            raise SchemaError(
                f"payload is neither JSON nor msgpack (JSON: {_show(str(json_error))})"
            ) from None


def parse_target(payload: bytes | bytearray | memoryview) -> TargetRequest:
    """Parse a public target request strictly; SchemaError with a one-line reason if bad.

    Accepts a JSON object or msgpack map {"container": str, "objective": s per
    batch, "alpha": optional}; "objective_s" is a synonym for "objective".
    Unknown fields are rejected (typo protection).
    """
    try:
        return _parse_target(payload)
    except SchemaError:
        raise
    except Exception as e:  # a safety net: the contract is "only SchemaError"
        raise SchemaError(f"target: undecodable (internal error: {e!r})") from None


def _parse_target(payload: Any) -> TargetRequest:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise SchemaError(f"payload must be bytes, got {type(payload).__name__}")
    size = len(payload)
    if size > MAX_TARGET_BYTES:
        raise SchemaError(f"payload is {size} bytes; at most {MAX_TARGET_BYTES} are accepted")
    data = bytes(payload)
    if not data.strip():
        raise SchemaError('empty payload; expected {"container": "<name>", "objective": <s>}')
    obj = _load_map(data)
    if not isinstance(obj, dict):
        raise SchemaError(f"payload must be a JSON object or msgpack map, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in TARGET_FIELDS]
    if unknown:
        raise SchemaError(
            f"unknown field {_show(unknown[0])} (allowed: container, objective, objective_s, alpha)"
        )
    if "container" not in obj:
        raise SchemaError("missing field 'container'")
    if "objective" in obj and "objective_s" in obj:
        raise SchemaError("give 'objective' or 'objective_s', not both")
    key = "objective" if "objective" in obj else "objective_s"
    if key not in obj:
        raise SchemaError("missing field 'objective' (seconds per batch)")
    try:
        return TargetRequest(
            container=obj["container"], objective_s=obj[key], alpha=obj.get("alpha")
        )
    except SchemaError as e:
        # Name the field as the client spelled it: "objective: must be ...".
        name = e.where.removeprefix(".")
        name = key if name == "objective_s" else name
        raise SchemaError(f"{name}: {e.problem}", where=f".{name}", problem=e.problem) from None


def target_reply_ok(**fields: Any) -> bytes:
    """JSON reply to an accepted target request: {"ok": true, ...fields}."""
    return orjson.dumps({"ok": True, **fields})


def target_reply_error(message: str) -> bytes:
    """JSON reply to a rejected target request: {"ok": false, "error": message}."""
    return orjson.dumps({"ok": False, "error": str(message)})


def parse_target_reply(data: bytes) -> dict[str, Any]:
    """A client's view of the reply: the JSON object, checked to carry a boolean "ok"."""
    try:
        obj = orjson.loads(data)
    except Exception as e:
        raise SchemaError(f"reply: not JSON ({_show(str(e))})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise SchemaError('reply: must be a JSON object with a boolean "ok"')
    return obj
