"""The objective form's checks: text typed by a person -> a target request, or a clear reason.

Why here and not only in the manager: a form that sends whatever was typed
shows people the manager's wording for mistakes the page could have caught,
and puts invalid requests on the bus. These checks are the manager's own
(`shared.schema.TargetRequest`), applied before anything is sent, with
messages that name the form's fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shared import subjects
from shared.public import MAX_OBJECTIVE_S, TargetRequest
from shared.schema import SchemaError


@dataclass(frozen=True)
class FormResult:
    """Either `body` (the JSON object to send) or `error` (what to fix), never both."""

    body: dict[str, Any] | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.body is not None


def _number(text: str, field: str) -> tuple[float | None, str | None]:
    raw = text.strip()
    try:
        value = float(raw)
    except ValueError:
        return None, f"{field}: {raw!r} is not a number"
    if not math.isfinite(value):
        return None, f"{field}: must be a finite number, got {raw!r}"
    return value, None


def validate_target(
    container: str | None, objective: str | None, alpha: str | None = "", *, service: str | None = "",
    percentile: str | None = "", window_s: str | None = "",
) -> FormResult:
    """Check the form's fields as typed; the request body or one message naming the field.

    container: a container name or id (no whitespace, '*', '>' or '~'); or
    service: a Swarm or compose service name, or a label selector key=value (one of the two).
    objective: seconds, a number > 0 and at most a day (86400): per batch, or at the percentile.
    alpha: optional tolerance band, a number strictly between 0 and 1.
    percentile (optional, 0 < p < 100) and window_s (optional, seconds, needs a percentile).
    """
    name = (container or "").strip()
    svc = (service or "").strip()
    if name and svc:
        return FormResult(error="container, service: give one of them, not both")
    if not name and not svc:
        return FormResult(error="container: required (the container's name or id), or a service")
    if name:
        try:
            subjects.validate_id(name, "container")
        except ValueError as e:
            return FormResult(error=str(e))
    if not (objective or "").strip():
        return FormResult(error="objective: required (seconds per batch, e.g. 30)")
    objective_s, err = _number(objective or "", "objective")
    if err:
        return FormResult(error=f"{err} (seconds per batch, e.g. 30)")
    assert objective_s is not None
    if objective_s <= 0:
        return FormResult(
            error=f"objective: must be more than 0 seconds per batch, got {objective_s:g}"
        )
    if objective_s > MAX_OBJECTIVE_S:
        return FormResult(
            error=f"objective: must be at most {MAX_OBJECTIVE_S:g} seconds per batch "
            f"(a day), got {objective_s:g}"
        )
    alpha_value: float | None = None
    if (alpha or "").strip():
        alpha_value, err = _number(alpha or "", "alpha")
        if err:
            return FormResult(error=f"{err} (leave it empty for the node's default)")
        assert alpha_value is not None
        if not 0 < alpha_value < 1:
            return FormResult(error=f"alpha: must be strictly between 0 and 1, got {alpha_value:g}")
    extra: dict[str, float] = {}
    for key, text in (("percentile", percentile), ("window_s", window_s)):
        if (text or "").strip():
            value, err = _number(text or "", key)
            if err:
                return FormResult(error=f"{err} (leave it empty for seconds per batch)")
            assert value is not None
            extra[key] = value
    try:  # the manager's own checks, so nothing it would refuse is sent
        req = TargetRequest.build(container=name or None, service=svc or None, objective_s=objective_s,
                                  alpha=alpha_value, **extra)
    except SchemaError as e:
        return FormResult(error=str(e))
    body: dict[str, Any] = {"service": req.service} if req.service else {"container": req.container}
    body["objective"] = req.objective_s
    for key in ("alpha", "percentile", "window_s"):
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    return FormResult(body=body)


def validate_clear(container: str | None, service: str | None = "") -> FormResult:
    """The clear request for the form's container (or service) field: {"container": name}, or what to fix."""
    name = (container or "").strip()
    svc = (service or "").strip()
    if svc and not name:
        try:
            TargetRequest.build(service=svc, objective_s=1.0)
        except SchemaError as e:
            return FormResult(error=str(e))
        return FormResult(body={"service": svc})
    if not name:
        return FormResult(error="container: required to clear its objective (the container's name or id)")
    try:
        subjects.validate_id(name, "container")
    except ValueError as e:
        return FormResult(error=str(e))
    return FormResult(body={"container": name})


def submit_clear(
    container: str | None,
    to: Sequence[str],
    send: Callable[[str, dict[str, Any]], dict[str, Any]] | None,
    service: str | None = "",
) -> list[tuple[str, dict[str, Any]]]:
    """What pressing "Clear objective" does (`send` is `Collector.request_clear`); as `submit`."""
    checked = validate_clear(container, service)
    if not checked.ok:
        return [("", not_sent(f"{checked.error} (nothing was sent)"))]
    if send is None or not to:
        return [("", not_sent("no cluster to send to: nothing was sent"))]
    assert checked.body is not None
    return [(label, send(label, checked.body)) for label in to]


def describe_reply(reply: dict[str, Any]) -> str:
    """One line for a target reply: what was stored or cleared, or why it was refused."""
    if not reply.get("ok"):
        return f"refused: {reply.get('error', 'no reason given')}"
    if reply.get("cleared") and reply.get("service"):
        return (f"objective for service {reply.get('service')} cleared: its containers fall back to their own "
                "objectives or labels, or become unmanaged")
    if reply.get("cleared"):
        return (f"objective for {reply.get('container')} cleared: unmanaged now, its CPU limit "
                "released (unless it carries its own dqoes.objective_s label)")
    if reply.get("service"):
        governed = reply.get("containers") or []
        return (f"objective for service {reply['service']}: {objective_words(reply)} (governs "
                f"{len(governed)} container(s) now and every replica that joins, revision {reply.get('revision')})")
    node = reply.get("node") or "no node yet"
    state = "running" if reply.get("running") else "expected"
    objective = reply.get("objective_s")
    shown = f"{objective:g}" if isinstance(objective, int | float) else str(objective)
    text = f"objective for {reply.get('container')}: {shown} s a batch ({state} on {node}"
    if reply.get("revision") is not None:
        text += f", revision {reply['revision']}"
    return text + ")"


def objective_words(t: dict[str, Any]) -> str:
    """`0.2 s a batch`, or `p95 0.2 s over 30 s` for a percentile objective."""
    objective = t.get("objective_s")
    shown = f"{objective:g}" if isinstance(objective, int | float) else str(objective)
    if t.get("percentile") is None:
        return f"{shown} s a batch"
    window = t.get("window_s")
    over = "the source's window" if window is None else f"{window:g} s"
    return f"p{t['percentile']:g} {shown} s over {over}"


def not_sent(error: str) -> dict[str, Any]:
    """A reply for a request that never reached a manager (the page shows `error` as it is)."""
    return {"ok": False, "error": error, "answered": False}


def submit(
    container: str | None,
    objective: str | None,
    alpha: str | None,
    to: Sequence[str],
    send: Callable[[str, dict[str, Any]], dict[str, Any]] | None,
    *,
    service: str | None = "",
    percentile: str | None = "",
    window_s: str | None = "",
) -> list[tuple[str, dict[str, Any]]]:
    """What pressing "Set objective" does: (stack label, reply) for each stack in `to`.

    The fields are checked first; a bad field, or no cluster to send to,
    sends nothing and gives one reply labelled "" that says why.
    `send(label, body)` is `Collector.request_target`.
    """
    checked = validate_target(container, objective, alpha, service=service, percentile=percentile,
                              window_s=window_s)
    if not checked.ok:
        return [("", not_sent(f"{checked.error} (nothing was sent)"))]
    if send is None or not to:
        return [("", not_sent("no cluster to send to: nothing was sent"))]
    assert checked.body is not None
    return [(label, send(label, checked.body)) for label in to]


TARGET_COLUMNS = ("for", "objective", "alpha", "from", "where", "revision")


def targets_rows(targets: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored objectives (`dqoes.targets.list`) as rows: what each is for, its kind, where it applies."""
    rows = []
    for t in targets:
        alpha = "default" if t.get("alpha") is None else f"{t['alpha']:g}"
        if t.get("service") is not None:
            governed = t.get("containers") or []
            where = f"{len(governed)} container(s)" + (f": {', '.join(governed)}" if governed else "")
            rows.append({"for": t["service"], "objective": objective_words(t), "alpha": alpha, "from": "service",
                         "where": where, "revision": t.get("revision")})
        else:
            state = "running" if t.get("running") else "not running"
            rows.append({"for": t.get("container"), "objective": objective_words(t), "alpha": alpha,
                         "from": "container", "where": f"{state} on {t.get('node') or 'no node yet'}",
                         "revision": t.get("revision")})
    return rows
