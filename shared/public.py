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
with a one-line reason a person can act on. What DQoES answers (the cluster
summary, the container view, the replies) is in `shared.replies`, and
re-exported here. Shapes: docs/reference/api.md.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, ClassVar

import msgpack
import orjson
from msgspec import Meta

from shared.checked import EXPLAIN, Checked
from shared.core import bounds
from shared.core.objectives import parse_selector
from shared.fields import (
    Count,
    Count1,
    Ident,
    Invalid,
    OpenFraction,
    Percentile,
    SchemaError,
    Text,
    WindowS,
    check_id,
    show,
)
from shared.replies import (
    ClusterState,
    ContainerInfo,
    NodeSummary,
    StoredTarget,
    containers_reply,
    parse_containers_reply,
    parse_target_reply,
    target_reply_error,
    target_reply_ok,
)

__all__ = [
    "ClusterState", "ContainerInfo", "NodeSummary", "SchemaError", "StoredTarget", "containers_reply",
    "parse_containers_reply", "parse_target_reply", "target_reply_error", "target_reply_ok",
]

MAX_TARGET_BYTES = 64 * 1024
"""A public target request larger than this is rejected before it is parsed."""

MAX_OBJECTIVE_S = bounds.MAX_OBJECTIVE_S
"""Largest accepted objective: a day per batch is surely a typo."""
MIN_OBJECTIVE_S = bounds.MIN_OBJECTIVE_S
"""Smallest accepted objective: a millisecond per batch."""

# --- public target requests (dqoes.targets) ---------------------------------------------

TARGET_FIELDS = ("container", "service", "objective", "objective_s", "alpha", "percentile", "window_s")


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


def _service(value: Any) -> None:
    """A service name or a label selector `key=value` (`shared.core.objectives.parse_selector`)."""
    try:
        parse_selector(value)
    except ValueError as e:
        raise Invalid(str(e)) from None


EXPLAIN["service"] = _service
Service = Annotated[str, Meta(max_length=256, extra={"explain": "service"})]


class TargetRequest(Checked, frozen=True, kw_only=True):
    """One objective asked for on the public subject, for a container or for a service.

    Seconds per batch by default; with `percentile` (and `window_s`), the objective is that
    percentile of the latencies over the window. A service objective (`service`: a Swarm or compose
    service name, or a label selector `app=api`) governs every matching container, present and
    future; a container's own objective wins over it.
    """

    NAME: ClassVar[str] = "target"

    container: Ident | None = None
    service: Service | None = None
    objective_s: Annotated[float, Meta(ge=MIN_OBJECTIVE_S, le=MAX_OBJECTIVE_S, extra={"explain": "objective"})]
    alpha: OpenFraction | None = None
    percentile: Percentile | None = None
    window_s: WindowS | None = None

    def _cross_check(self) -> None:
        if (self.container is None) == (self.service is None):
            raise Invalid("give 'container' or 'service', one of them", ".container")
        if self.service is not None:
            _service(self.service)
        if self.window_s is not None and self.percentile is None:
            raise Invalid("a window needs a percentile (per-batch objectives have none)", ".window_s")

    @property
    def subject(self) -> str:
        """What it is set for, as a person reads it: `api` (container) or `service api`."""
        return f"service {self.service}" if self.service is not None else str(self.container)

    def to_json(self) -> bytes:
        """The request as a client sends it: {"container"|"service": ..., "objective": ..., [...]}."""
        body: dict[str, Any] = ({"service": self.service} if self.service is not None
                                else {"container": self.container})
        body["objective"] = self.objective_s
        for key in ("alpha", "percentile", "window_s"):
            if getattr(self, key) is not None:
                body[key] = getattr(self, key)
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
        raise SchemaError(f"unknown field {show(unknown[0])} (allowed: {', '.join(TARGET_FIELDS)})")
    if "container" in obj and "service" in obj:
        raise SchemaError("give 'container' or 'service', not both")
    if "container" not in obj and "service" not in obj:
        raise SchemaError("missing field 'container' (or 'service')")
    if "objective" in obj and "objective_s" in obj:
        raise SchemaError("give 'objective' or 'objective_s', not both")
    key = "objective" if "objective" in obj else "objective_s"
    if key not in obj:
        raise SchemaError("missing field 'objective' (seconds per batch)")
    try:
        return TargetRequest.build(container=obj.get("container"), service=obj.get("service"),
                                   objective_s=obj[key], alpha=obj.get("alpha"),
                                   percentile=obj.get("percentile"), window_s=obj.get("window_s"))
    except SchemaError as e:
        # Name the field as the client spelled it: "objective: must be ...".
        name = e.where.removeprefix(".")
        name = key if name == "objective_s" else name
        raise SchemaError(f"{name}: {e.problem}", where=f".{name}", problem=e.problem) from None


# --- the objective lifecycle (dqoes.targets.get|list|clear) and the container view's filter -------


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
    _, name = parse_subject_request(payload, what, services=False)
    return name


def parse_subject_request(payload: bytes | bytearray | memoryview, what: str = "request",
                          services: bool = True) -> tuple[str, str]:
    """`{"container": "<name>"}` or `{"service": "<selector>"}` (get and clear): ("container" or
    "service", the name); SchemaError if bad."""
    allowed = ("container", "service") if services else ("container",)
    try:
        obj = _parse_object(payload, allowed, what)
        if services and "container" in obj and "service" in obj:
            raise SchemaError(f"{what}: give 'container' or 'service', not both")
        if services and "service" in obj:
            try:
                _service(obj["service"])
            except Invalid as e:
                raise SchemaError(f"service: {e.problem}") from None
            return "service", obj["service"]
        if "container" not in obj:
            raise SchemaError(f'{what}: missing field \'container\'; expected {{"container": "<name>"}}'
                              + (' or {"service": "<name or key=value>"}' if services else ""))
        try:
            return "container", check_id(obj["container"])
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
