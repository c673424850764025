"""The public contract in JSON: what any NATS client sends to DQoES and reads back.

Why apart from the wire messages (`shared.schema`): outside clients (the
`nats` CLI, a nats.js program, the dashboard's form) speak this, not
msgpack, and the rules differ. A target request rejects unknown fields,
because there a typo ("objetive") must not be silently ignored; replies are
`{"ok": true, ...}` or `{"ok": false, "error": "<reason>"}`; the cluster
summary is JSON so that `nats sub dqoes.cluster.state` is readable.

The objective lifecycle (`dqoes.targets.get|list|clear`) and the container
view (`dqoes.cluster.containers`) are small request/reply exchanges in the
same style: requests with unknown fields are refused, replies carry "ok".

Requests are parsed strictly and never raise anything but `SchemaError`
with a one-line reason a person can act on. Shapes: docs/reference/api.md.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, ClassVar

import msgpack
import msgspec
import orjson
from msgspec import Meta

from shared.checked import EXPLAIN, Checked, convert, explain
from shared.core import bounds
from shared.fields import (
    Count,
    Count1,
    Finite,
    Ident,
    Invalid,
    NonNeg,
    OpenFraction,
    Positive,
    SchemaError,
    Text,
    UnixS,
    check_id,
    schema_error,
    show,
)
from shared.messages import ContainerFields, Met, ObjectiveSource, ThrottledRatio
from shared.schema import SCHEMA_VERSION

MAX_TARGET_BYTES = 64 * 1024
"""A public target request larger than this is rejected before it is parsed."""

MAX_OBJECTIVE_S = bounds.MAX_OBJECTIVE_S
"""Largest accepted objective: a day per batch is surely a typo."""
MIN_OBJECTIVE_S = bounds.MIN_OBJECTIVE_S
"""Smallest accepted objective: a millisecond per batch."""

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


# --- public target requests (dqoes.targets) ---------------------------------------------

TARGET_FIELDS = ("container", "objective", "objective_s", "alpha")


def _objective(value: Any) -> None:
    """The objective of a public request, in words a person can act on (the bounds: `ObjectiveS`)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(f"must be a number of seconds per batch, got {show(value)}")
    try:
        seconds = float(value)
    except OverflowError:
        raise Invalid(
            f"must be at most {MAX_OBJECTIVE_S:g} seconds per batch, got a huge number"
        ) from None
    if not math.isfinite(seconds):
        raise Invalid(f"must be a finite number of seconds per batch, got {show(value)}")
    if seconds <= 0:
        raise Invalid(f"must be > 0 seconds per batch, got {show(value)}")
    if seconds < MIN_OBJECTIVE_S:
        raise Invalid(f"must be at least {MIN_OBJECTIVE_S:g} seconds per batch, got {show(value)}")
    if seconds > MAX_OBJECTIVE_S:
        raise Invalid(
            f"must be at most {MAX_OBJECTIVE_S:g} seconds per batch (a day), got {show(value)}"
        )


EXPLAIN["objective"] = _objective


class TargetRequest(Checked, frozen=True, kw_only=True):
    """One objective asked for on the public subject: seconds per batch for a container."""

    NAME: ClassVar[str] = "target"

    container: Ident
    objective_s: Annotated[float, Meta(ge=MIN_OBJECTIVE_S, le=MAX_OBJECTIVE_S, extra={"explain": "objective"})]
    alpha: OpenFraction | None = None

    def to_json(self) -> bytes:
        """The request as a client sends it: {"container": ..., "objective": ..., ["alpha": ...]}."""
        body: dict[str, Any] = {"container": self.container, "objective": self.objective_s}
        if self.alpha is not None:
            body["alpha"] = self.alpha
        return orjson.dumps(body)


class DuplicateKey(ValueError):
    """A JSON object or msgpack map naming one key twice."""


def _no_duplicates(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"duplicate key {show(key)}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(payload: bytes) -> Any:
    """JSON with every object's keys unique (else DuplicateKey); NaN and Infinity refused.

    `{"container": "nope", "container": "c07"}` must not quietly mean c07
    (issue 11): a client that sends a key twice gets an error, not the last one.
    """
    return json.loads(payload, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


def _load_map(payload: bytes) -> Any:
    """JSON first (what `nats req` sends), then msgpack; a key twice is refused in both."""
    try:
        return loads_strict(payload)
    except DuplicateKey as e:
        raise SchemaError(f"payload names a key twice ({e})") from None
    except Exception as json_error:
        try:
            return msgpack.unpackb(payload, raw=False, strict_map_key=False,
                                   object_pairs_hook=_no_duplicates)
        except DuplicateKey as e:
            raise SchemaError(f"payload names a key twice ({e})") from None
        except Exception:
            raise SchemaError(
                f"payload is neither JSON nor msgpack (JSON: {show(str(json_error))})"
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
            f"unknown field {show(unknown[0])} (allowed: container, objective, objective_s, alpha)"
        )
    if "container" not in obj:
        raise SchemaError("missing field 'container'")
    if "objective" in obj and "objective_s" in obj:
        raise SchemaError("give 'objective' or 'objective_s', not both")
    key = "objective" if "objective" in obj else "objective_s"
    if key not in obj:
        raise SchemaError("missing field 'objective' (seconds per batch)")
    try:
        return TargetRequest.build(container=obj["container"], objective_s=obj[key], alpha=obj.get("alpha"))
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
        raise SchemaError(f"reply: not JSON ({show(str(e))})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise SchemaError('reply: must be a JSON object with a boolean "ok"')
    return obj


# --- the objective lifecycle (dqoes.targets.get|list|clear) and the container view -------


def _parse_object(payload: Any, allowed: tuple[str, ...], what: str) -> dict[str, Any]:
    """A small public request: empty, or a JSON object / msgpack map with only `allowed` keys."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise SchemaError(f"payload must be bytes, got {type(payload).__name__}")
    if len(payload) > MAX_TARGET_BYTES:
        raise SchemaError(f"payload is {len(payload)} bytes; at most {MAX_TARGET_BYTES} are accepted")
    data = bytes(payload)
    if not data.strip():
        return {}
    obj = _load_map(data)
    if not isinstance(obj, dict):
        raise SchemaError(f"{what}: payload must be a JSON object or msgpack map, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        names = ", ".join(allowed) or "none"
        raise SchemaError(f"{what}: unknown field {show(unknown[0])} (allowed: {names})")
    return obj


def parse_container_request(payload: bytes | bytearray | memoryview, what: str = "request") -> str:
    """`{"container": "<name>"}` (get and clear): the container name; SchemaError if bad."""
    try:
        obj = _parse_object(payload, ("container",), what)
        if "container" not in obj:
            raise SchemaError(f'{what}: missing field \'container\'; expected {{"container": "<name>"}}')
        try:
            return check_id(obj["container"])
        except Invalid as e:
            raise SchemaError(f"container: {e.problem}") from None
    except SchemaError:
        raise
    except Exception as e:  # a safety net: the contract is "only SchemaError"
        raise SchemaError(f"{what}: undecodable (internal error: {e!r})") from None


def parse_empty_request(payload: bytes | bytearray | memoryview, what: str = "list") -> None:
    """Empty, `{}` or `null`: a request that takes no arguments; SchemaError otherwise."""
    if isinstance(payload, bytes | bytearray | memoryview) and bytes(payload).strip() == b"null":
        return
    try:
        _parse_object(payload, (), what)
    except SchemaError:
        raise
    except Exception as e:
        raise SchemaError(f"{what}: undecodable (internal error: {e!r})") from None


def parse_node_filter(payload: bytes | bytearray | memoryview) -> str | None:
    """Empty, `{}` or `{"node": "<name>"}` (the containers query): the node or None."""
    if isinstance(payload, bytes | bytearray | memoryview) and bytes(payload).strip() == b"null":
        return None
    try:
        obj = _parse_object(payload, ("node",), "containers")
        if obj.get("node") is None:
            return None
        try:
            return check_id(obj["node"])
        except Invalid as e:
            raise SchemaError(f"node: {e.problem}") from None
    except SchemaError:
        raise
    except Exception as e:
        raise SchemaError(f"containers: undecodable (internal error: {e!r})") from None


class StoredTarget(Checked, frozen=True, kw_only=True):
    """One stored objective as `dqoes.targets.get` and `.list` return it."""

    NAME: ClassVar[str] = "stored_target"

    container: Ident
    objective_s: Positive
    alpha: OpenFraction | None = None
    revision: Count
    set_at: UnixS
    node: Ident | None = None
    """The node hosting the container now (None: no live worker reports it)."""
    running: bool = False


class ContainerInfo(ContainerFields, frozen=True, kw_only=True):
    """One container in the public view (`dqoes.cluster.containers`), as its worker last reported it.

    Units: `*_s` seconds per batch, `*_cores` CPU cores, `*_at` unix seconds.
    The fields it shares with the internal `ContainerState` (name, model,
    objective, alpha, latency) are defined once, in `ContainerFields`; `met`,
    `throttled_ratio` and `objective_source` share their types and meaning.
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
    last_batch_at: UnixS | None = None
    stale: bool = False
    """It stopped publishing batches: its limit is kept and it is not counted as met."""
    objective_source: ObjectiveSource = None
    seen_at: UnixS
    """When its worker last reported it (the node state's time)."""


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


# --- training jobs: `dqoes.submit` ------------------------------------------------------

SUBMIT_FIELDS = ("model", "name", "epochs", "node", "image", "threads", "seed")
MAX_EPOCHS = 100_000


class SubmitRequest(Checked, frozen=True, kw_only=True):
    """A training job asked for on `dqoes.submit`: which workload, optionally where and how long.

    `node` asks for a node (the manager checks it is there) instead of letting
    the policy place the job; `image` is the container image (Docker workers);
    `name` defaults to one the manager makes up.
    """

    NAME: ClassVar[str] = "submit"

    model: Text
    name: Ident | None = None
    epochs: Annotated[int, Meta(ge=1, le=MAX_EPOCHS)] | None = None
    node: Ident | None = None
    image: Text | None = None
    threads: Count1 | None = None
    seed: Count = 0

    def to_json(self) -> bytes:
        return orjson.dumps({k: getattr(self, k) for k in SUBMIT_FIELDS if getattr(self, k) is not None})


def parse_submit(payload: bytes | bytearray | memoryview) -> SubmitRequest:
    """Parse a submit request (JSON object or msgpack map) strictly; SchemaError with one line if bad."""
    try:
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise SchemaError(f"payload must be bytes, got {type(payload).__name__}")
        if len(payload) > MAX_TARGET_BYTES:
            raise SchemaError(f"payload is {len(payload)} bytes; at most {MAX_TARGET_BYTES} are accepted")
        data = bytes(payload)
        if not data.strip():
            raise SchemaError('empty payload; expected {"model": "cnn", ...}')
        obj = _load_map(data)
        if not isinstance(obj, dict):
            raise SchemaError(f"payload must be a JSON object or msgpack map, got {type(obj).__name__}")
        unknown = [k for k in obj if k not in SUBMIT_FIELDS]
        if unknown:
            raise SchemaError(f"unknown field {show(unknown[0])} (allowed: {', '.join(SUBMIT_FIELDS)})")
        if "model" not in obj:
            raise SchemaError("missing field 'model' (vae, cnn, mlp, lstm, gru)")
        try:
            return SubmitRequest.build(**obj)
        except SchemaError as e:
            name = e.where.removeprefix(".")
            raise SchemaError(f"{name}: {e.problem}", where=f".{name}", problem=e.problem) from None
    except SchemaError:
        raise
    except Exception as e:  # the contract is "only SchemaError"
        raise SchemaError(f"submit: undecodable (internal error: {e!r})") from None
