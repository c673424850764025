"""What DQoES says back in public JSON: the cluster summary, the stored targets, the container view, and
the `{"ok": ...}` replies.

Why apart from the requests (`shared.public`): a reply is checked the other way round (built from
what DQoES knows, read by a client that must tolerate fields it does not know), and the container
view shares its fields with the internal `ContainerState` (`shared.messages.ContainerFields`).
Shapes: docs/reference/api.md.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec
import orjson
from msgspec import Meta

from shared.checked import EXPLAIN, Checked, convert, explain
from shared.fields import (
    Count,
    Finite,
    Ident,
    Invalid,
    NonNeg,
    OpenFraction,
    Percentile,
    Positive,
    SchemaError,
    Text,
    UnixS,
    WindowS,
    check_id,
    schema_error,
    show,
)
from shared.messages import (
    ContainerFields,
    LastBatchAt,
    Met,
    ObjectiveSource,
    Stale,
    ThrottledRatio,
)
from shared.schema import SCHEMA_VERSION

# --- cluster summary (public JSON) ------------------------------------------------------


class NodeSummary(Checked, frozen=True, kw_only=True):
    """One node in the cluster summary: counts per class and the q sums (s per batch)."""

    NAME: ClassVar[str] = "node_summary"
    ALIASES: ClassVar[dict[str, str]] = {"q_g_s": "slack_sum_g_s", "q_s_s": "slack_sum_s_s",
                                         "q_b_s": "slack_sum_b_s"}

    satisfied: Count
    G: Count
    S: Count
    B: Count
    pending: Count
    slack_sum_g_s: Finite
    slack_sum_s_s: Finite = 0.0
    slack_sum_b_s: Finite
    interval_s: Positive
    containers: Count
    policy: Text
    at: UnixS
    met: Count | None = None
    """Containers at or under (1 + alpha) x their objective (None: a worker too old to say)."""
    cpu_cores_used: NonNeg | None = None
    """CPU the managed containers used over the last round, in cores."""
    cpu_cores_idle: NonNeg | None = None
    """The node's cores nobody used over the last round."""


def _node_map(value: Any) -> None:
    if not isinstance(value, dict):
        raise Invalid(f"must be a map of node names to summaries, got {show(value)}")
    for node, item in value.items():
        try:
            found = explain(NodeSummary, item) if isinstance(item, dict) else Invalid(
                f"must be a map, got {show(item)}")
            if not (type(node) is str and found.problem == ""):
                check_id(node)
            if found.problem:
                raise found
        except Invalid as e:
            raise Invalid(e.problem, f"[{show(node)}]{e.sub}") from None


EXPLAIN["node_map"] = _node_map


class ClusterState(Checked, frozen=True, kw_only=True):
    """The manager's cluster summary, published as JSON on subjects.CLUSTER_STATE.

    Totals add up the nodes; `q_*_s` are sums of q = objective - latency over
    the containers of each class (seconds per batch; Q_G >= 0, Q_B <= 0).
    """

    TYPE: ClassVar[str] = "cluster_state"
    NAME: ClassVar[str] = "cluster_state"
    ALIASES: ClassVar[dict[str, str]] = NodeSummary.ALIASES

    nodes: Annotated[dict[Ident, NodeSummary], Meta(extra={"explain": "node_map"})]
    satisfied_total: Count
    G: Count
    S: Count
    B: Count
    pending: Count
    slack_sum_g_s: Finite
    slack_sum_s_s: Finite = 0.0
    slack_sum_b_s: Finite
    containers_total: Count
    at: UnixS
    met_total: Count | None = None
    """Met over the nodes that report it (None: none does)."""
    cpu_cores_used_total: NonNeg | None = None
    cpu_cores_idle_total: NonNeg | None = None

    def to_json(self) -> bytes:
        """UTF-8 JSON: {"type": "cluster_state", "v": 1, ...fields, "nodes": {...}}."""
        body: dict[str, Any] = {"type": self.TYPE, "v": SCHEMA_VERSION}
        body.update(msgspec.to_builtins(self))
        return orjson.dumps(body)

    @classmethod
    def from_json(cls, data: bytes | str) -> ClusterState:
        """Parse and check a cluster summary (unknown fields ignored); SchemaError if bad."""
        try:
            obj = orjson.loads(data)
        except Exception as e:
            raise SchemaError(f"cluster_state: not JSON ({show(str(e))})") from None
        if not isinstance(obj, dict):
            raise SchemaError(f"cluster_state: must be a JSON object, got {type(obj).__name__}")
        if obj.get("type", cls.TYPE) != cls.TYPE:
            raise SchemaError(
                f"cluster_state.type: expected 'cluster_state', got {show(obj['type'])}"
            )
        return convert(cls, obj)


# --- replies -----------------------------------------------------------------------------------


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
        raise SchemaError(f"reply: not JSON ({show(str(e))})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise SchemaError('reply: must be a JSON object with a boolean "ok"')
    return obj


# --- the stored targets and the container view (dqoes.targets.get|list, dqoes.cluster.containers) ----


class StoredTarget(Checked, frozen=True, kw_only=True):
    """One stored objective as `dqoes.targets.get` and `.list` return it: for a container or a service."""

    NAME: ClassVar[str] = "stored_target"

    container: Ident | None = None
    """The container it is set for (None: a service objective)."""
    objective_s: Positive
    alpha: OpenFraction | None = None
    revision: Count
    set_at: UnixS
    node: Ident | None = None
    """The node hosting the container now (None: no live worker reports it, or a service objective)."""
    running: bool = False
    service: Text | None = None
    """The service (a Swarm or compose service name, or a label selector key=value) it is set for."""
    percentile: Percentile | None = None
    """None: seconds per batch; else this percentile of the latencies over `window_s`."""
    window_s: WindowS | None = None
    containers: tuple[Ident, ...] = ()
    """A service objective: the containers it governs now (as their workers last reported)."""


class ContainerInfo(ContainerFields, frozen=True, kw_only=True):
    """One container in the public view (`dqoes.cluster.containers`), as its worker last reported it.

    Units: `*_s` seconds per batch, `*_cores` CPU cores, `*_at` unix seconds.
    The fields it shares with the internal `ContainerState` (name, model,
    objective, alpha, latency) are defined once, in `ContainerFields`; `met`,
    `throttled_ratio`, `last_batch_at`, `stale` and `objective_source` share
    their types and meaning (`shared.messages`: their order on the wire keeps
    them out of the common base).
    `in_band`: within the band (class S, what the paper counts as satisfied);
    None for an unmanaged container or one with no batch yet.
    """

    NAME: ClassVar[str] = "container_info"

    node: Ident
    managed: bool = False
    met: Met = None
    in_band: bool | None = None
    cls: Text | None = None
    """G (faster than the band), S (in it), B (slower), or None (pending or unmanaged)."""
    cpu_limit_cores: Positive | None = None
    """None: no limit."""
    cpu_used_cores: NonNeg | None = None
    throttled_ratio: ThrottledRatio = None
    last_batch_at: LastBatchAt = None
    stale: Stale = False
    objective_source: ObjectiveSource = None
    seen_at: UnixS
    """When its worker last reported it (the node state's time)."""
    objective_selector: Text | None = None
    """The service whose objective governs it (None: its own objective, or its label)."""
    percentile: Percentile | None = None
    """The objective's percentile (None: every batch's latency)."""
    window_s: WindowS | None = None
    request_rate_per_s: NonNeg | None = None
    """Requests per second over the last window (polled latency sources); None: not known."""


def containers_reply(rows: list[ContainerInfo], at: float) -> bytes:
    """`{"ok": true, "at": ..., "containers": [...]}` (sorted by node, then container)."""
    body = msgspec.to_builtins(sorted(rows, key=lambda r: (r.node, r.container)))
    return orjson.dumps({"ok": True, "at": at, "containers": body})


def parse_containers_reply(data: bytes) -> list[ContainerInfo]:
    """A client's view of the containers reply; SchemaError if it is not one (or not ok)."""
    obj = parse_target_reply(data)
    if not obj["ok"]:
        raise SchemaError(f"containers: {obj.get('error', 'refused')}")
    rows = obj.get("containers")
    if not isinstance(rows, list):
        raise SchemaError('containers: reply has no "containers" list')
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(convert(ContainerInfo, row))
        except SchemaError as e:
            raise schema_error("containers", f"[{i}]{e.where}", e.problem) from None
    return out
