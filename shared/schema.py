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
within v3, optional: a batch's `follows_limit` and `control.policy`. Golden-bytes fixtures in tests/fixtures/golden/
pin the wire format (v1 and v2 fixtures are kept and must still decode).

The public JSON a client speaks (target requests, the cluster summary) is in
`shared.public`.
"""

from __future__ import annotations

import math
import time
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import msgpack
import msgspec
from msgspec import Meta

from shared.core.types import Cls, Decision
from shared.fields import (
    EXPLAIN,
    MAX_TEXT_CHARS,
    Checked,
    Count,
    Count1,
    Finite,
    FloatMap,
    Fraction,
    Ident,
    Ids,
    IntervalS,
    Invalid,
    LatencyS,
    NonNeg,
    ObjectiveS,
    OpenFraction,
    ParamMap,
    Positive,
    SchemaError,
    Text,
    UnixS,
    check_ids,
    explain,
    refusal,
    schema_error,
    show,
    with_aliases,
)

__all__ = ["MAX_TEXT_CHARS", "SchemaError"]

SCHEMA_VERSION = 3
"""Version written into every message's `v`; bump when a field changes name or meaning."""
RENAMED_AT = 2
"""The version that renamed fields (`q_s` -> `slack_s`, ...): an older message is read with `ALIASES`."""

ENVELOPE_KEYS = ("type", "v", "ts", "sender")
MEMBER_KEYS = ("G", "S", "B", "pending")
Members = Annotated[dict[Literal["G", "S", "B", "pending"], Ids], Meta(extra={"explain": "members"})]


# --- internal messages (msgpack) ------------------------------------------------------


class Message(Checked, frozen=True, kw_only=True):
    """A message with a type of its own on the wire (the envelope's `type`)."""

    TYPE: ClassVar[str] = ""
    FROM_TS: ClassVar[str | None] = None
    """A field that, when None, takes the envelope's ts (on the wire and when decoded)."""
    ALIASES: ClassVar[dict[str, str]] = {}
    """Older wire names of renamed fields, {old: new}: read when the new name is absent."""


class LatencyEvent(Message, frozen=True, kw_only=True):
    """Inference container -> worker: one batch finished.

    `cpu_s` is the CPU time the batch used (0.0: not measured); `finished_at`
    is when it finished (unix s; absent on the wire: the envelope's ts);
    `follows_limit` says its intra-op threads follow its CPU limit
    (max(1, floor(limit)); false or absent: a fixed thread count).
    """

    TYPE: ClassVar[str] = "latency"
    NAME: ClassVar[str] = "latency"
    FROM_TS: ClassVar[str | None] = "finished_at"

    container: Ident
    node: Ident
    latency_s: LatencyS
    images: Count1
    batch: Count
    cpu_s: NonNeg = 0.0
    model: Text | None = None
    finished_at: UnixS | None = None
    follows_limit: bool = False


class ContainerDecisionMsg(Checked, frozen=True, kw_only=True):
    """One container's part of a round: class, gap q = objective - latency, old and new limit.

    Limits and shares are fractions of the node (1.0 = all its cores); None:
    no limit / not known yet. `cls` None: no batch yet (pending).
    """

    NAME: ClassVar[str] = "container_decision"
    ALIASES: ClassVar[dict[str, str]] = {"q_s": "slack_s"}

    container: Ident
    cls: Cls | None = None
    slack_s: Finite | None = None
    latency_s: Positive | None = None
    cpu_share: NonNeg | None = None
    old_limit: Positive | None = None
    new_limit: Positive | None = None
    reason: Text = ""


class DecisionMsg(Message, frozen=True, kw_only=True):
    """Worker -> anyone: what one control round on one node decided.

    `round` counts rounds on the worker; `at` is when it ran (unix s);
    `interval_s` the delay to the next round; `slack_sum_g_s`/`slack_sum_b_s` the sums of
    q over G and B (seconds per batch); `extra` policy-specific numbers.
    """

    TYPE: ClassVar[str] = "decision"
    NAME: ClassVar[str] = "decision"
    ALIASES: ClassVar[dict[str, str]] = {"q_g_s": "slack_sum_g_s", "q_b_s": "slack_sum_b_s"}

    node: Ident
    policy: Text
    round: Count
    at: UnixS
    event: Text | None = None
    listener: Text = ""
    interval_s: Positive
    slack_sum_g_s: Finite
    slack_sum_b_s: Finite
    satisfied: Count
    containers: tuple[ContainerDecisionMsg, ...]
    extra: FloatMap = msgspec.field(default_factory=dict)

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
            slack_sum_g_s=d.slack_sum_g_s,
            slack_sum_b_s=d.slack_sum_b_s,
            satisfied=d.satisfied,
            containers=tuple(
                ContainerDecisionMsg(
                    container=c.name,
                    cls=c.cls,
                    slack_s=c.slack_s,
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


class ContainerFields(Checked, frozen=True, kw_only=True):
    """What the internal (`ContainerState`) and the public (`shared.public.ContainerInfo`) views of a
    container say alike, defined once. Units: seconds per batch."""

    container: Ident
    model: Text | None = None
    objective_s: Positive | None = None
    alpha: OpenFraction | None = None
    latency_s: Positive | None = None


Met = bool | None
"""At or under (1 + alpha) x the objective (classes G and S); None: unmanaged or no batch yet."""
ThrottledRatio = Fraction | None
"""Share of CFS periods throttled since the previous reading (cpu.stat); None: not measured."""
ObjectiveSource = Literal["target", "label"] | None
"""Where the objective in force comes from: "target" (the objective store, set through dqoes.targets;
it wins) or "label" (the container's dqoes.objective_s label); None: no objective, or unknown."""


class ContainerState(ContainerFields, frozen=True, kw_only=True):
    """One container in a node's state. `managed` False: seen but not controlled (no objective)."""

    NAME: ClassVar[str] = "container_state"
    ALIASES: ClassVar[dict[str, str]] = {"q_s": "slack_s"}

    cls: Cls | None = None
    slack_s: Finite | None = None
    limit: Positive | None = None
    cpu_share: NonNeg | None = None
    managed: bool = True
    met: Met = None
    """v3 (see `Met`)."""
    cpu_cores_used: NonNeg | None = None
    """v3: CPU used over the last round, in cores (cpu_share x the node's cores)."""
    throttled_ratio: ThrottledRatio = None
    """v3 (see `ThrottledRatio`)."""
    last_batch_at: UnixS | None = None
    """v3: when the worker last heard a batch from it (unix s); None: never."""
    stale: bool = False
    """No batch for longer than the worker's stale threshold: its limit is kept, it is not met."""
    objective_source: ObjectiveSource = None
    """Added within v3 (see `ObjectiveSource`)."""


class NodeState(Message, frozen=True, kw_only=True):
    """Worker -> manager and dashboard: everything about one node after a round.

    `members` maps G, S, B and pending to container names (all four keys are
    always present after construction); `slack_sum_*_s` are Q_G, Q_B and Q_S,
    the sums of slack (objective - latency) over each class; `expected` lists containers that
    have an objective but are not running yet; `params` the policy's
    parameters in force (alpha, beta, initial_interval_s, ...).
    """

    TYPE: ClassVar[str] = "node_state"
    NAME: ClassVar[str] = "node_state"
    ALIASES: ClassVar[dict[str, str]] = {"q_g_s": "slack_sum_g_s", "q_b_s": "slack_sum_b_s"}

    node: Ident
    policy: Text
    cores: Positive
    round: Count
    at: UnixS
    interval_s: Positive
    slack_sum_g_s: Finite
    slack_sum_b_s: Finite
    satisfied: Count
    members: Members
    containers: tuple[ContainerState, ...]
    expected: Ids = ()
    params: ParamMap = msgspec.field(default_factory=dict)
    slack_sum_s_s: Finite | None = None
    """Q_S: the sum of slack over S (v2; computed from `containers` when a v1 sender left it out)."""
    met: Count | None = None
    """v3: containers meeting their objective (G and S); None from older senders."""
    cpu_cores_used: NonNeg | None = None
    """v3: CPU the containers used over the last round, in cores."""
    cpu_cores_idle: NonNeg | None = None
    """v3: the node's cores its containers left unused over the last round."""

    def _cross_check(self) -> None:
        try:
            members = _members(self.members)
        except Invalid as e:
            raise Invalid(e.problem, f".members{e.sub}") from None
        if members is not self.members:
            msgspec.structs.force_setattr(self, "members", members)
        if self.slack_sum_s_s is None:
            try:
                total = math.fsum(
                    c.slack_s for c in self.containers if c.cls is Cls.S and c.slack_s is not None
                )
            except OverflowError:
                total = math.inf
            if not math.isfinite(total):
                raise Invalid("the slack of the S containers does not sum to a finite number", ".containers")
            msgspec.structs.force_setattr(self, "slack_sum_s_s", total)


def _members(value: Any) -> dict[str, tuple[str, ...]]:
    """All four keys, each a tuple of ids (Invalid naming the key otherwise); `value` itself if so."""
    if not isinstance(value, dict):
        raise Invalid(f"must be a map with keys G, S, B, pending, got {show(value)}")
    for key in value:
        if key not in MEMBER_KEYS:
            raise Invalid(f"unknown key {show(key)} (allowed: G, S, B, pending)")
    for key, names in value.items():
        try:
            check_ids(names)
        except Invalid as e:
            raise Invalid(e.problem, f"[{key!r}]{e.sub}") from None
    if len(value) == 4 and all(type(v) is tuple for v in value.values()):
        return value
    return {key: tuple(value.get(key, ())) for key in MEMBER_KEYS}


EXPLAIN["members"] = _members


class ObjectiveAssign(Message, frozen=True, kw_only=True):
    """Manager -> worker: the objective for one container (`objective_s` None clears it).

    `alpha` None: the node's default. `revision` is the key-value revision it
    came from, so a worker can ignore an older assignment arriving late.
    """

    TYPE: ClassVar[str] = "objective"
    NAME: ClassVar[str] = "objective"

    container: Ident
    objective_s: ObjectiveS | None
    alpha: OpenFraction | None = None
    revision: Count


class ControlMsg(Message, frozen=True, kw_only=True):
    """Operator -> worker: change the policy or its parameters at runtime; None leaves one unchanged.

    `params` (v3) names any parameter of the policy in force (its parameters
    dataclass in `shared/core`), e.g. {"dead_band": 0.05}; the worker checks
    the names and values against the policy and answers a request with a
    `ControlReply`. `policy` (added within v3, optional like the others)
    switches the node to another registered policy first, `params` then
    apply to that one; an unknown policy changes nothing. A message with
    nothing to change is a read.
    """

    TYPE: ClassVar[str] = "control"
    NAME: ClassVar[str] = "control"

    alpha: OpenFraction | None = None
    beta: OpenFraction | None = None
    initial_interval_s: IntervalS | None = None
    max_interval_s: IntervalS | None = None
    params: ParamMap = msgspec.field(default_factory=dict)
    policy: Ident | None = None

    def asked(self) -> dict[str, float]:
        """Every parameter this message sets, by name (the named fields, then `params`)."""
        named = {k: v for k, v in (("alpha", self.alpha), ("beta", self.beta),
                                   ("initial_interval_s", self.initial_interval_s),
                                   ("max_interval_s", self.max_interval_s)) if v is not None}
        return named | dict(self.params)

    def _cross_check(self) -> None:
        lo, hi = self.initial_interval_s, self.max_interval_s
        if lo is not None and hi is not None and hi < lo:
            raise Invalid(f"must be >= initial_interval_s ({lo:g}), got {hi:g}", ".max_interval_s")


class ControlReply(Message, frozen=True, kw_only=True):
    """Worker -> operator (v3): the answer to a `ControlMsg` request.

    `ok` False: nothing changed and `error` says why; either way `params` are
    the parameters in force afterwards and `policy` the policy holding them.
    """

    TYPE: ClassVar[str] = "control_reply"
    NAME: ClassVar[str] = "control_reply"

    node: Ident
    policy: Text
    ok: bool
    error: Text = ""
    params: ParamMap = msgspec.field(default_factory=dict)
    changed: tuple[Text, ...] = ()


# --- training jobs (FlowCon; v3 added these types, no field of an older type changed) -------------


class Progress(Message, frozen=True, kw_only=True):
    """Training job -> its worker: the evaluation value E after a step or an epoch.

    `value` is E in the job's own unit (a loss: finite, >= 0); `epoch` and
    `step` count from 0; `cpu_s` is the job's own CPU time so far (0.0: not
    measured); `at` is when it was measured (absent on the wire: the
    envelope's ts). A job whose loss is not finite publishes nothing for that
    step: decoding refuses such a value.
    """

    TYPE: ClassVar[str] = "progress"
    NAME: ClassVar[str] = "progress"
    FROM_TS: ClassVar[str | None] = "at"

    job: Ident
    node: Ident
    value: NonNeg
    epoch: Count
    step: Count = 0
    eval_fn: Text | None = None
    model: Text | None = None
    cpu_s: NonNeg = 0.0
    at: UnixS | None = None


class JobDone(Message, frozen=True, kw_only=True):
    """Training job -> its worker: finished (`ok`) or gave up (`ok` false, `reason`)."""

    TYPE: ClassVar[str] = "job_done"
    NAME: ClassVar[str] = "job_done"

    job: Ident
    node: Ident
    epochs: Count
    duration_s: NonNeg
    value: NonNeg | None = None
    ok: bool = True
    reason: Text = ""


class TrainingJobState(Checked, frozen=True, kw_only=True):
    """One training job in a worker's training state. `limit` is a fraction of the node."""

    NAME: ClassVar[str] = "training_job_state"

    job: Ident
    stage: Text
    model: Text | None = None
    value: NonNeg | None = None
    progress: NonNeg | None = None
    growth: NonNeg | None = None
    cpu_cores: NonNeg | None = None
    limit: Positive | None = None
    stale: bool = False


class TrainingState(Message, frozen=True, kw_only=True):
    """Worker -> manager and dashboard: the training side of a node after a round (Algorithm 4's input).

    `training_share` is the fraction of the node training jobs may use under
    the worker's CPU split (docs/guide/training.md); `alpha` FlowCon's threshold
    (-1: every job completing).
    """

    TYPE: ClassVar[str] = "training_state"
    NAME: ClassVar[str] = "training_state"

    node: Ident
    policy: Text
    cores: Positive
    round: Count
    at: UnixS
    interval_s: Positive
    training_share: Positive
    jobs: tuple[TrainingJobState, ...]
    alpha: Finite | None = None
    free_competition: bool = False


class Launch(Message, frozen=True, kw_only=True):
    """Manager -> worker (request): start training job `job` of `model` on this node."""

    TYPE: ClassVar[str] = "launch"
    NAME: ClassVar[str] = "launch"

    job: Ident
    model: Text
    epochs: Count1 | None = None
    image: Text | None = None
    threads: Count1 | None = None
    seed: Count = 0


class LaunchReply(Message, frozen=True, kw_only=True):
    """Worker -> manager: whether the job started."""

    TYPE: ClassVar[str] = "launch_reply"
    NAME: ClassVar[str] = "launch_reply"

    ok: bool
    node: Ident
    job: Ident
    error: Text = ""


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (LatencyEvent, DecisionMsg, NodeState, ObjectiveAssign, ControlMsg, ControlReply,
                              Progress, JobDone, TrainingState, Launch, LaunchReply)
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
_LATENCY = _DECODERS["latency"]
_ENCODER = msgspec.msgpack.Encoder()
"""Its bytes are msgpack-python's (`packb(..., use_bin_type=True)`) for these maps: the golden-bytes
tests compare them."""


def encode(msg: Message, sender: str, ts: float | None = None) -> bytes:
    """The wire bytes of `msg`: a msgpack map, envelope first, then the fields in order.

    `ts` (unix s) defaults to now. Deterministic for a given (msg, sender, ts). The bytes are
    decoded once as a peer will: SchemaError (naming the field) instead of bytes a peer would refuse.
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
        decoder.decode(data)
    except msgspec.ValidationError as e:
        raise refusal(cls, msgspec.msgpack.decode(data), e) from None
    return data


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
