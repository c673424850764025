"""The messages of the inference side and of control, as typed structs (their wire contract:
`shared.schema`).

Why apart from the codec: these are what the services build and read, field by field, with units
in the names and rules in the types (`shared.fields`); the codec around them (envelope, versions,
golden bytes) changes for other reasons. `ContainerFields` holds what the internal and the public
(`shared.public.ContainerInfo`) views of a container say alike, so each of those fields is defined
once.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from shared.checked import EXPLAIN, Checked
from shared.core.types import Cls, Decision
from shared.fields import (
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
    Percentile,
    Positive,
    Text,
    UnixS,
    WindowS,
    check_ids,
    show,
)

MEMBER_KEYS = ("G", "S", "B", "pending")
Members = Annotated[dict[str, Ids], Meta(extra={"explain": "members"})]
"""G, S, B and pending to container names (the keys are checked, and all four filled, by NodeState)."""


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
LastBatchAt = UnixS | None
"""When the worker last heard a batch from it (unix s); None: never."""
Stale = bool
"""No batch for longer than the worker's stale threshold: its limit is kept, it is not counted as met."""
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
    last_batch_at: LastBatchAt = None
    """v3 (see `LastBatchAt`)."""
    stale: Stale = False
    """See `Stale`."""
    objective_source: ObjectiveSource = None
    """Added within v3 (see `ObjectiveSource`)."""
    objective_selector: Text | None = None
    """Added within v3: the service (or label selector) whose stored objective is in force;
    None: the container's own (or its label)."""
    percentile: Percentile | None = None
    """Added within v3: the objective's percentile (None: every batch's latency)."""
    window_s: WindowS | None = None
    """Added within v3: the percentile's window, in seconds."""
    request_rate_per_s: NonNeg | None = None
    """Added within v3: requests per second over the last window (polled sources); None: not known."""


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
    service_objectives: dict[Text, Count] = msgspec.field(default_factory=dict)
    """Added within v3: the service objectives the worker holds (selector -> revision), so the
    manager hands over what it lacks and takes back what was cleared."""

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
    percentile: Percentile | None = None
    """Added within v3: govern this percentile of the batch latencies (None: every batch)."""
    window_s: WindowS | None = None
    """Added within v3: over this window, in seconds (None: the latency source's or the default)."""


class ServiceObjective(Message, frozen=True, kw_only=True):
    """Manager -> every worker (added within v3): the objective for every container of a service.

    `selector` names the service: `api` (the Swarm or compose service) or a label selector
    `app=api`; it governs present and future replicas, and a container's own objective
    (`ObjectiveAssign`) wins over it. `objective_s` None takes it back. `revision` as in
    `ObjectiveAssign`.
    """

    TYPE: ClassVar[str] = "service_objective"
    NAME: ClassVar[str] = "service_objective"

    selector: Text
    objective_s: ObjectiveS | None
    alpha: OpenFraction | None = None
    revision: Count
    percentile: Percentile | None = None
    window_s: WindowS | None = None


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
