"""Every message DQoES puts on the bus between its own processes: wire format, versioned.

Why one module: the worker, the manager, the inference containers, the
dashboard and outside tools are written and deployed separately, so the
bytes between them are the contract. Each message is a frozen msgspec
Struct whose field names carry their units and whose types carry their
rules (`shared.fields`); `encode` turns it into a msgpack map with a flat
envelope (`type`, `v`, `ts` in unix seconds, `sender`) followed by the
message's own fields; `decode` checks everything it reads (msgspec, in one
pass per part).

Rules, in the order they bite:
- Decoding never raises anything but `SchemaError`, whatever the bytes are,
  and its message names the field (`latency.latency_s: must be a finite
  number > 0, got -3`). The bus drops such a message and counts it.
- Unknown fields are ignored, and a message with a newer `v` than
  SCHEMA_VERSION is decoded when its required fields are there: a newer
  sender can add fields without breaking older receivers.
- A renamed field keeps its old wire name as an alias, read when the new
  name is absent, so messages of an earlier version still decode.
- `encode` checks the message as its peers will (it decodes its own bytes)
  and raises SchemaError instead of sending one they would reject; building
  a message checks its ids and cross-field rules, `Cls.build(**fields)`
  every rule (for values a person typed).

Versions: 1 named a container's objective-minus-latency `q_s` and the class
sums `q_g_s`/`q_b_s`; 2 names them `slack_s` and `slack_sum_g_s`/
`slack_sum_s_s`/`slack_sum_b_s` (a reader could not tell `q_s`, one
container's gap, from `q_s_s`, the sum over S) and adds `slack_sum_s_s` to
the node state; 3 adds what an operator reads (a container's `met`,
`throttled_ratio`, `cpu_cores_used`, `last_batch_at`; a node's `met`,
`cpu_cores_used`, `cpu_cores_idle`), a policy's own parameters by name in
`control.params`, and the worker's `control_reply` (all new fields optional,
so v2 bytes decode unchanged), and the training-job types `progress`,
`job_done`, `training_state`, `launch`, `launch_reply` (FlowCon); later
within v3, optional: a batch's `follows_limit` and `control.policy`; then service and percentile
objectives: the type `service_objective`, an objective's `percentile`/`window_s`, a container's
`objective_selector`, `percentile`, `window_s`, `request_rate_per_s`, a node's `service_objectives`. Golden-bytes fixtures in tests/fixtures/golden/
pin the wire format (v1 and v2 fixtures are kept and must still decode).

The public JSON a client speaks (target requests, the cluster summary) is in
`shared.public`.
"""
from __future__ import annotations

import math
import time
from typing import Any, TypeVar

import msgpack
import msgspec

from shared.checked import explain, refusal, with_aliases
from shared.fields import MAX_TEXT_CHARS, Count1, SchemaError, Text, UnixS, schema_error, show
from shared.messages import (
    MEMBER_KEYS,
    ContainerDecisionMsg,
    ContainerFields,
    ContainerState,
    ControlMsg,
    ControlReply,
    DecisionMsg,
    LatencyEvent,
    Message,
    NodeState,
    ObjectiveAssign,
    ServiceObjective,
)
from shared.training_messages import (
    JobDone,
    Launch,
    LaunchReply,
    Progress,
    TrainingJobState,
    TrainingState,
)

__all__ = [
    "MAX_TEXT_CHARS", "MEMBER_KEYS", "ContainerDecisionMsg", "ContainerFields", "ContainerState", "ControlMsg",
    "ControlReply", "DecisionMsg", "JobDone", "LatencyEvent", "Launch", "LaunchReply", "Message", "NodeState",
    "ObjectiveAssign", "Progress", "SchemaError", "ServiceObjective", "TrainingJobState", "TrainingState",
]

SCHEMA_VERSION = 3
"""Version written into every message's `v`; bump when a field changes name or meaning."""
RENAMED_AT = 2
"""The version that renamed fields (`q_s` -> `slack_s`, ...): an older message is read with `ALIASES`."""

ENVELOPE_KEYS = ("type", "v", "ts", "sender")

MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (LatencyEvent, DecisionMsg, NodeState, ObjectiveAssign, ControlMsg, ControlReply,
                              ServiceObjective, Progress, JobDone, TrainingState, Launch, LaunchReply)
}
M = TypeVar("M")


class Envelope(msgspec.Struct, frozen=True):
    """A decoded message with its envelope: who sent it, when (unix s), at which version."""

    msg: Message
    type: str
    v: int
    ts: float
    sender: str


# --- the codec ------------------------------------------------------------------------------------------


class _Head(msgspec.Struct):
    """The envelope as it is read first (msgspec skips the message's own fields)."""

    type: str
    v: Count1
    ts: UnixS
    sender: Text


_HEAD = msgspec.msgpack.Decoder(_Head)
_DECODERS = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in MESSAGE_TYPES.items()}
_LATENCY = msgspec.msgpack.Decoder(LatencyEvent)
_ENCODER = msgspec.msgpack.Encoder()
"""Its bytes are msgpack-python's (`packb(..., use_bin_type=True)`) for every value a message holds:
the golden-bytes tests and a property test compare them. (msgspec's JSON differs from orjson's in
float exponents, "1e16" for "1e+16", so the public JSON stays with orjson.)"""


def encode(msg: Message, sender: str, ts: float | None = None) -> bytes:
    """The wire bytes of `msg`: a msgpack map, envelope first, then the fields in order.

    `ts` (unix s) defaults to now. Deterministic for a given (msg, sender, ts). The bytes are
    decoded once as a peer will: SchemaError (naming the field) instead of bytes a peer would refuse,
    and what is sent is the message as decoded (numbers as floats where the field is a float).
    """
    cls = type(msg)
    decoder = _DECODERS.get(getattr(cls, "TYPE", ""))
    if decoder is None or MESSAGE_TYPES[cls.TYPE] is not cls:
        raise TypeError(f"not a schema message: {cls.__name__}")
    if not isinstance(sender, str):
        raise TypeError(f"sender must be a string, got {type(sender).__name__}")
    ts_s = time.time() if ts is None else ts
    if isinstance(ts_s, bool) or not isinstance(ts_s, int | float) or not 0 <= ts_s < math.inf:
        raise schema_error(msg.NAME, ".ts", f"must be a unix time in seconds (finite, >= 0), got {show(ts_s)}")
    ts_s = float(ts_s)
    out: dict[str, Any] = {"type": cls.TYPE, "v": SCHEMA_VERSION, "ts": ts_s, "sender": sender}
    out.update(msgspec.structs.asdict(msg))
    if cls.FROM_TS is not None and out[cls.FROM_TS] is None:
        out[cls.FROM_TS] = ts_s
    data = _ENCODER.encode(out)
    try:
        checked = decoder.decode(data)
    except msgspec.ValidationError as e:
        raise refusal(cls, msgspec.msgpack.decode(data), e) from None
    # Sent as a peer reads it: an int built where a float belongs goes as a float, so the bytes are the
    # same however the message was built (the golden files pin them).
    out.update(msgspec.structs.asdict(checked))
    return _ENCODER.encode(out)


def decode_envelope(data: bytes | bytearray | memoryview) -> Envelope:
    """Decode wire bytes into the message and its envelope; SchemaError on anything wrong."""
    try:
        head = _HEAD.decode(data)
        decoder = _DECODERS.get(head.type)
        if decoder is not None and head.v >= RENAMED_AT:
            return _envelope(decoder.decode(data), head)
    except (msgspec.MsgspecError, TypeError):
        pass
    try:
        return _decode_slowly(data)
    except SchemaError:
        raise
    except Exception as e:  # a safety net: the contract is "only SchemaError"
        raise SchemaError(f"message: undecodable (internal error: {e!r})") from None


def _envelope(msg: Message, head: _Head) -> Envelope:
    if msg.FROM_TS is not None and getattr(msg, msg.FROM_TS) is None:
        msgspec.structs.force_setattr(msg, msg.FROM_TS, head.ts)
    return Envelope(msg, head.type, head.v, head.ts, head.sender)


def _decode_slowly(data: Any) -> Envelope:
    """The path for whatever the fast one refused (and for messages before RENAMED_AT): read into
    Python values first, so that the error can name the field."""
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
        raise schema_error("message", ".type", "missing required field")
    if not isinstance(kind, str):
        raise schema_error("message", ".type", f"must be a string, got {show(kind)}")
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise schema_error("message", ".type", f"unknown message type {show(kind)}")
    found = explain(_Head, obj)
    if found.problem:
        raise schema_error(kind, found.sub, found.problem)
    head = _Head(type=kind, v=obj["v"], ts=float(obj["ts"]), sender=obj["sender"])
    fields = with_aliases(cls, obj)
    try:
        msg = msgspec.convert(fields, cls)
    except msgspec.ValidationError as e:
        raise refusal(cls, fields, e, kind) from None
    return _envelope(msg, head)


def decode_latency(data: bytes | bytearray | memoryview) -> LatencyEvent:
    """A `LatencyEvent` from wire bytes, the worker's hot path (tens of thousands a second).

    The envelope, then the event, each read by msgspec; anything else (another type, an odd value, a
    missing field) goes through `decode_as`, so the errors are exactly the generic decoder's.
    SchemaError only.
    """
    try:
        head = _HEAD.decode(data)
        if head.type == "latency" and head.v >= RENAMED_AT:
            msg = _LATENCY.decode(data)
            if msg.finished_at is None:
                msgspec.structs.force_setattr(msg, "finished_at", head.ts)
            return msg
    except (msgspec.MsgspecError, TypeError):
        pass
    return decode_as(data, LatencyEvent)


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
