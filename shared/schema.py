"""Every message DQoES puts on the bus between its own processes: wire format, versioned.

Why one module: the worker, the manager, the inference containers, the
dashboard and outside tools are written and deployed separately, so the
bytes between them are the contract. Each message is a frozen dataclass whose
field names carry their units, built on `shared.validation`; `encode` turns
it into a msgpack map with a flat envelope (`type`, `v`, `ts` in unix
seconds, `sender`) followed by the message's own fields; `decode` checks
everything it reads.

Rules, in the order they bite:
- Decoding never raises anything but `SchemaError`, whatever the bytes are,
  and its message names the field (`latency.latency_s: must be a finite
  number > 0, got -3`). The bus drops such a message and counts it.
- Unknown fields are ignored, and a message with a newer `v` than
  SCHEMA_VERSION is decoded when its required fields are there: a newer
  sender can add fields without breaking older receivers.
- A renamed field keeps its old wire name as an alias, read when the new
  name is absent, so messages of an earlier version still decode.
- Messages validate themselves when built, so a service cannot publish a
  message its peers would reject.

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

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import msgpack

from shared import subjects as subjects_mod
from shared.core import bounds
from shared.core.types import Cls, Decision
from shared.core.values import slot_builder
from shared.validation import (
    FINITE,
    FRACTION,
    IDS,
    INTERVAL,
    LATENCY,
    MAX_TEXT_CHARS,
    NONNEG,
    OBJECTIVE,
    OPEN_FRACTION,
    POSITIVE,
    UNIX_S,
    Check,
    Checked,
    Invalid,
    SchemaError,
    boolean,
    build,
    checked,
    float_map,
    ident,
    integer,
    nested,
    one_of,
    optional,
    param_map,
    schema_error,
    show,
    text,
    to_wire,
    tuple_of,
)

SCHEMA_VERSION = 3
"""Version written into every message's `v`; bump when a field changes name or meaning."""

ENVELOPE_KEYS = ("type", "v", "ts", "sender")

def _cls(value: Any) -> Cls | None:
    if value is None:
        return None
    if isinstance(value, str) and value in ("G", "S", "B"):
        return Cls(value)
    raise Invalid(f"must be one of 'G', 'S', 'B' or nil, got {show(value)}")


MEMBER_KEYS = ("G", "S", "B", "pending")


def _members(value: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise Invalid(f"must be a map with keys G, S, B, pending, got {show(value)}")
    for key in value:
        if key not in MEMBER_KEYS:
            raise Invalid(f"unknown key {show(key)} (allowed: G, S, B, pending)")
    out: dict[str, tuple[str, ...]] = {}
    for key in MEMBER_KEYS:
        try:
            out[key] = IDS(value.get(key, ()))
        except Invalid as e:
            raise Invalid(e.problem, f"[{key!r}]{e.sub}") from None
    return out


# --- internal messages (msgpack) ------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LatencyEvent(Checked):
    """Inference container -> worker: one batch finished.

    `cpu_s` is the CPU time the batch used (0.0: not measured); `finished_at`
    is when it finished (unix s; absent on the wire: the envelope's ts);
    `follows_limit` says its intra-op threads follow its CPU limit
    (max(1, floor(limit)); false or absent: a fixed thread count).
    """

    TYPE: ClassVar[str] = "latency"
    NAME: ClassVar[str] = "latency"

    container: str = checked(ident)
    node: str = checked(ident)
    latency_s: float = checked(LATENCY)
    images: int = checked(integer(1))
    batch: int = checked(integer(0))
    cpu_s: float = checked(NONNEG, default=0.0)
    model: str | None = checked(optional(text), default=None)
    finished_at: float | None = checked(UNIX_S, default=None, from_envelope="ts")
    follows_limit: bool = checked(boolean, default=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerDecisionMsg(Checked):
    """One container's part of a round: class, gap q = objective - latency, old and new limit.

    Limits and shares are fractions of the node (1.0 = all its cores); None:
    no limit / not known yet. `cls` None: no batch yet (pending).
    """

    NAME: ClassVar[str] = "container_decision"

    container: str = checked(ident)
    cls: Cls | None = checked(_cls, default=None)
    slack_s: float | None = checked(optional(FINITE), default=None, aliases=("q_s",))
    latency_s: float | None = checked(optional(POSITIVE), default=None)
    cpu_share: float | None = checked(optional(NONNEG), default=None)
    old_limit: float | None = checked(optional(POSITIVE), default=None)
    new_limit: float | None = checked(optional(POSITIVE), default=None)
    reason: str = checked(text, default="")


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionMsg(Checked):
    """Worker -> anyone: what one control round on one node decided.

    `round` counts rounds on the worker; `at` is when it ran (unix s);
    `interval_s` the delay to the next round; `slack_sum_g_s`/`slack_sum_b_s` the sums of
    q over G and B (seconds per batch); `extra` policy-specific numbers.
    """

    TYPE: ClassVar[str] = "decision"
    NAME: ClassVar[str] = "decision"

    node: str = checked(ident)
    policy: str = checked(text)
    round: int = checked(integer(0))
    at: float = checked(UNIX_S)
    event: str | None = checked(optional(text), default=None)
    listener: str = checked(text, default="")
    interval_s: float = checked(POSITIVE)
    slack_sum_g_s: float = checked(FINITE, aliases=("q_g_s",))
    slack_sum_b_s: float = checked(FINITE, aliases=("q_b_s",))
    satisfied: int = checked(integer(0))
    containers: tuple[ContainerDecisionMsg, ...] = checked(tuple_of(nested(ContainerDecisionMsg)))
    extra: dict[str, float] = checked(float_map, factory=dict)

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerState(Checked):
    """One container in a node's state. `managed` False: seen but not controlled (no objective)."""

    NAME: ClassVar[str] = "container_state"

    container: str = checked(ident)
    model: str | None = checked(optional(text), default=None)
    objective_s: float | None = checked(optional(POSITIVE), default=None)
    alpha: float | None = checked(optional(OPEN_FRACTION), default=None)
    latency_s: float | None = checked(optional(POSITIVE), default=None)
    cls: Cls | None = checked(_cls, default=None)
    slack_s: float | None = checked(optional(FINITE), default=None, aliases=("q_s",))
    limit: float | None = checked(optional(POSITIVE), default=None)
    cpu_share: float | None = checked(optional(NONNEG), default=None)
    managed: bool = checked(boolean, default=True)
    met: bool | None = checked(optional(boolean), default=None)
    """v3: latency at or under (1 + alpha) x the objective (G or S); None: unmanaged or no batch yet."""
    cpu_cores_used: float | None = checked(optional(NONNEG), default=None)
    """v3: CPU used over the last round, in cores (cpu_share x the node's cores)."""
    throttled_ratio: float | None = checked(optional(FRACTION), default=None)
    """v3: share of CFS periods throttled since the previous reading (cpu.stat); None: not measured."""
    last_batch_at: float | None = checked(optional(UNIX_S), default=None)
    """v3: when the worker last heard a batch from it (unix s); None: never."""
    stale: bool = checked(boolean, default=False)
    """No batch for longer than the worker's stale threshold: its limit is kept, it is not met."""
    objective_source: str | None = checked(optional(one_of("target", "label")), default=None)
    """Added within v3: where the objective in force comes from, "target" (the objective store, set
    through dqoes.targets; it wins) or "label" (the container's dqoes.objective_s); None: no objective."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState(Checked):
    """Worker -> manager and dashboard: everything about one node after a round.

    `members` maps G, S, B and pending to container names (all four keys are
    always present after construction); `slack_sum_*_s` are Q_G, Q_B and Q_S,
    the sums of slack (objective - latency) over each class; `expected` lists containers that
    have an objective but are not running yet; `params` the policy's
    parameters in force (alpha, beta, initial_interval_s, ...).
    """

    TYPE: ClassVar[str] = "node_state"
    NAME: ClassVar[str] = "node_state"

    node: str = checked(ident)
    policy: str = checked(text)
    cores: float = checked(POSITIVE)
    round: int = checked(integer(0))
    at: float = checked(UNIX_S)
    interval_s: float = checked(POSITIVE)
    slack_sum_g_s: float = checked(FINITE, aliases=("q_g_s",))
    slack_sum_b_s: float = checked(FINITE, aliases=("q_b_s",))
    satisfied: int = checked(integer(0))
    members: dict[str, tuple[str, ...]] = checked(_members)
    containers: tuple[ContainerState, ...] = checked(tuple_of(nested(ContainerState)))
    expected: tuple[str, ...] = checked(IDS, default=())
    params: dict[str, float] = checked(param_map, factory=dict)
    slack_sum_s_s: float | None = checked(optional(FINITE), default=None)
    """Q_S: the sum of slack over S (v2; computed from `containers` when a v1 sender left it out)."""
    met: int | None = checked(optional(integer(0)), default=None)
    """v3: containers meeting their objective (G and S); None from older senders."""
    cpu_cores_used: float | None = checked(optional(NONNEG), default=None)
    """v3: CPU the containers used over the last round, in cores."""
    cpu_cores_idle: float | None = checked(optional(NONNEG), default=None)
    """v3: the node's cores its containers left unused over the last round."""

    def _cross_check(self) -> None:
        if self.slack_sum_s_s is None:
            try:
                total = math.fsum(
                    c.slack_s for c in self.containers if c.cls is Cls.S and c.slack_s is not None
                )
            except OverflowError:
                total = math.inf
            if not math.isfinite(total):
                raise Invalid("the slack of the S containers does not sum to a finite number", ".containers")
            object.__setattr__(self, "slack_sum_s_s", total)


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectiveAssign(Checked):
    """Manager -> worker: the objective for one container (`objective_s` None clears it).

    `alpha` None: the node's default. `revision` is the key-value revision it
    came from, so a worker can ignore an older assignment arriving late.
    """

    TYPE: ClassVar[str] = "objective"
    NAME: ClassVar[str] = "objective"

    container: str = checked(ident)
    objective_s: float | None = checked(optional(OBJECTIVE))
    alpha: float | None = checked(optional(OPEN_FRACTION), default=None)
    revision: int = checked(integer(0))


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlMsg(Checked):
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

    alpha: float | None = checked(optional(OPEN_FRACTION), default=None)
    beta: float | None = checked(optional(OPEN_FRACTION), default=None)
    initial_interval_s: float | None = checked(optional(INTERVAL), default=None)
    max_interval_s: float | None = checked(optional(INTERVAL), default=None)
    params: dict[str, float] = checked(param_map, factory=dict)
    policy: str | None = checked(optional(ident), default=None)

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlReply(Checked):
    """Worker -> operator (v3): the answer to a `ControlMsg` request.

    `ok` False: nothing changed and `error` says why; either way `params` are
    the parameters in force afterwards and `policy` the policy holding them.
    """

    TYPE: ClassVar[str] = "control_reply"
    NAME: ClassVar[str] = "control_reply"

    node: str = checked(ident)
    policy: str = checked(text)
    ok: bool = checked(boolean)
    error: str = checked(text, default="")
    params: dict[str, float] = checked(param_map, factory=dict)
    changed: tuple[str, ...] = checked(tuple_of(text), default=())


# --- training jobs (FlowCon; v3 added these types, no field of an older type changed) -------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress(Checked):
    """Training job -> its worker: the evaluation value E after a step or an epoch.

    `value` is E in the job's own unit (a loss: finite, >= 0); `epoch` and
    `step` count from 0; `cpu_s` is the job's own CPU time so far (0.0: not
    measured); `at` is when it was measured (absent on the wire: the
    envelope's ts). A job whose loss is not finite publishes nothing for that
    step: decoding refuses such a value.
    """

    TYPE: ClassVar[str] = "progress"
    NAME: ClassVar[str] = "progress"

    job: str = checked(ident)
    node: str = checked(ident)
    value: float = checked(NONNEG)
    epoch: int = checked(integer(0))
    step: int = checked(integer(0), default=0)
    eval_fn: str | None = checked(optional(text), default=None)
    model: str | None = checked(optional(text), default=None)
    cpu_s: float = checked(NONNEG, default=0.0)
    at: float | None = checked(UNIX_S, default=None, from_envelope="ts")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDone(Checked):
    """Training job -> its worker: finished (`ok`) or gave up (`ok` false, `reason`)."""

    TYPE: ClassVar[str] = "job_done"
    NAME: ClassVar[str] = "job_done"

    job: str = checked(ident)
    node: str = checked(ident)
    epochs: int = checked(integer(0))
    duration_s: float = checked(NONNEG)
    value: float | None = checked(optional(NONNEG), default=None)
    ok: bool = checked(boolean, default=True)
    reason: str = checked(text, default="")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingJobState(Checked):
    """One training job in a worker's training state. `limit` is a fraction of the node."""

    NAME: ClassVar[str] = "training_job_state"

    job: str = checked(ident)
    stage: str = checked(text)
    model: str | None = checked(optional(text), default=None)
    value: float | None = checked(optional(NONNEG), default=None)
    progress: float | None = checked(optional(NONNEG), default=None)
    growth: float | None = checked(optional(NONNEG), default=None)
    cpu_cores: float | None = checked(optional(NONNEG), default=None)
    limit: float | None = checked(optional(POSITIVE), default=None)
    stale: bool = checked(boolean, default=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingState(Checked):
    """Worker -> manager and dashboard: the training side of a node after a round (Algorithm 4's input).

    `training_share` is the fraction of the node training jobs may use under
    the worker's CPU split (docs/guide/training.md); `alpha` FlowCon's threshold
    (-1: every job completing).
    """

    TYPE: ClassVar[str] = "training_state"
    NAME: ClassVar[str] = "training_state"

    node: str = checked(ident)
    policy: str = checked(text)
    cores: float = checked(POSITIVE)
    round: int = checked(integer(0))
    at: float = checked(UNIX_S)
    interval_s: float = checked(POSITIVE)
    training_share: float = checked(POSITIVE)
    jobs: tuple[TrainingJobState, ...] = checked(tuple_of(nested(TrainingJobState)))
    alpha: float | None = checked(optional(FINITE), default=None)
    free_competition: bool = checked(boolean, default=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch(Checked):
    """Manager -> worker (request): start training job `job` of `model` on this node."""

    TYPE: ClassVar[str] = "launch"
    NAME: ClassVar[str] = "launch"

    job: str = checked(ident)
    model: str = checked(text)
    epochs: int | None = checked(optional(integer(1)), default=None)
    image: str | None = checked(optional(text), default=None)
    threads: int | None = checked(optional(integer(1)), default=None)
    seed: int = checked(integer(0), default=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchReply(Checked):
    """Worker -> manager: whether the job started."""

    TYPE: ClassVar[str] = "launch_reply"
    NAME: ClassVar[str] = "launch_reply"

    ok: bool = checked(boolean)
    node: str = checked(ident)
    job: str = checked(ident)
    error: str = checked(text, default="")


Message = (LatencyEvent | DecisionMsg | NodeState | ObjectiveAssign | ControlMsg | ControlReply | Progress | JobDone
           | TrainingState | Launch | LaunchReply)
MESSAGE_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls for cls in (LatencyEvent, DecisionMsg, NodeState, ObjectiveAssign, ControlMsg, ControlReply,
                              Progress, JobDone, TrainingState, Launch, LaunchReply)
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
        ts_s = UNIX_S(ts_s)
    except Invalid as e:
        raise schema_error(msg.NAME, ".ts", e.problem) from None
    out: dict[str, Any] = {"type": msg.TYPE, "v": SCHEMA_VERSION, "ts": ts_s, "sender": sender}
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        source = f.metadata.get("from_envelope")
        if value is None and source:
            value = out[source]
        out[f.name] = to_wire(value)
    return msgpack.packb(out, use_bin_type=True)


def decode_envelope(data: bytes | bytearray | memoryview) -> Envelope:
    """Decode wire bytes into the message and its envelope; SchemaError on anything wrong."""
    try:
        return _decode_envelope(data)
    except SchemaError:
        raise
    except Exception as e:  # a safety net: the contract is "only SchemaError"
        raise SchemaError(f"message: undecodable (internal error: {e!r})") from None


_ENVELOPE_CHECKS: tuple[tuple[str, Check], ...] = (("v", integer(1)), ("ts", UNIX_S), ("sender", text))


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
        raise schema_error("message", ".type", "missing required field")
    if not isinstance(kind, str):
        raise schema_error("message", ".type", f"must be a string, got {show(kind)}")
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise schema_error("message", ".type", f"unknown message type {show(kind)}")
    envelope: dict[str, Any] = {}
    for key, check in _ENVELOPE_CHECKS:
        if key not in obj:
            raise schema_error(kind, f".{key}", "missing required field")
        try:
            envelope[key] = check(obj[key])
        except Invalid as e:
            raise schema_error(kind, f".{key}", e.problem) from None
    try:
        msg = build(cls, obj, envelope)
    except Invalid as e:
        raise schema_error(kind, e.sub, e.problem) from None
    return Envelope(
        msg=msg, type=kind, v=envelope["v"], ts=envelope["ts"], sender=envelope["sender"]
    )


_MAX_LATENCY_S = bounds.MAX_LATENCY_S
_build_latency = slot_builder(LatencyEvent)
_is_good_id = subjects_mod.is_good_id


def _id_ok(value: Any) -> bool:
    return type(value) is str and _is_good_id(value)


def decode_latency(data: bytes | bytearray | memoryview) -> LatencyEvent:
    """A `LatencyEvent` from wire bytes, the worker's hot path (tens of thousands a second).

    The common, well-formed message is checked field by field inline and
    built without the generic machinery; anything else (another type, an
    odd value, a missing field) goes through `decode_as`, so the result and
    the errors are exactly the generic decoder's. SchemaError only.
    """
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:
        obj = None
    if type(obj) is dict and obj.get("type") == "latency":
        g = obj.get
        v, ts, sender = g("v"), g("ts"), g("sender")
        lat, images, batch = g("latency_s"), g("images"), g("batch")
        cpu, model, fin = g("cpu_s", 0.0), g("model"), g("finished_at")
        follows = g("follows_limit", False)
        if (type(v) is int and v >= 1 and type(ts) is float and 0.0 <= ts < math.inf
                and type(sender) is str and len(sender) <= MAX_TEXT_CHARS
                and type(lat) is float and 0.0 < lat <= _MAX_LATENCY_S
                and type(images) is int and images >= 1 and type(batch) is int and batch >= 0
                and type(cpu) is float and 0.0 <= cpu < math.inf
                and (model is None or (type(model) is str and len(model) <= MAX_TEXT_CHARS))
                and (fin is None or (type(fin) is float and 0.0 <= fin < math.inf))
                and type(follows) is bool
                and _id_ok(g("container")) and _id_ok(g("node"))):
            return _build_latency(container=g("container"), node=g("node"), latency_s=lat, images=images,
                                  batch=batch, cpu_s=cpu, model=model, finished_at=ts if fin is None else fin,
                                  follows_limit=follows)
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
