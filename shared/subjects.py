"""Every NATS subject DQoES uses, built in one place.

Why one module: a subject is an interface between processes written by
different people. Building them by string formatting all over the code is how
a worker ends up publishing on `dqoes.latency.c01.node1` while the manager
listens on `dqoes.latency.node1.c01`. Here the event kind always comes before
the ids (`dqoes.<kind>.<node>[.<container>]`), so a subscriber can take one
kind for one node or for all nodes with a wildcard.

Ids (node and container names) are validated before they become tokens:
non-empty, at most 200 characters, printable, no whitespace, no NATS wildcard
('*', '>'). Docker container names and host names may contain '.', which NATS
uses to separate tokens, so a '.' is written as '~' inside a token
(`token("web.1") == "web~1"`; `untoken` reverses it). '~' never occurs in a
Docker name, and an id containing one is rejected so the mapping stays
reversible.

Also here: the name of the JetStream key-value bucket the manager keeps
objectives in, and `kv_key`, because KV keys are subjects underneath too.
"""

from __future__ import annotations

import re

PREFIX = "dqoes"
MAX_ID_CHARS = 200

# --- cluster-wide subjects -------------------------------------------------

TARGETS = f"{PREFIX}.targets"
"""Public: any client publishes or requests one objective here (JSON or msgpack)."""

CLUSTER_STATE = f"{PREFIX}.cluster.state"
"""Public: the manager publishes the cluster summary here (JSON)."""

CLUSTER_QUERY = f"{PREFIX}.cluster.query"
"""Public: request/reply; the manager answers with the cluster summary (JSON)."""

TARGETS_GET = f"{PREFIX}.targets.get"
"""Public: request {"container": name}; the manager replies with its stored objective (JSON)."""

TARGETS_LIST = f"{PREFIX}.targets.list"
"""Public: request (empty or {}); the manager replies with every stored objective (JSON)."""

TARGETS_CLEAR = f"{PREFIX}.targets.clear"
"""Public: request {"container": name}; the manager deletes its objective and replies (JSON)."""

TARGETS_ALL = f"{PREFIX}.targets.>"
"""The three objective-lifecycle subjects above (permissions, not `dqoes.targets` itself)."""

CLUSTER_CONTAINERS = f"{PREFIX}.cluster.containers"
"""Public: request (empty, or {"node": name}); the manager replies with every container (JSON)."""

LATENCY_ALL = f"{PREFIX}.latency.>"
"""Every latency event of every node (dashboards, recorders)."""

DECISIONS_ALL = f"{PREFIX}.decisions.*"
STATE_ALL = f"{PREFIX}.state.*"
OBJECTIVES_ALL = f"{PREFIX}.objectives.*"
CONTROL_ALL = f"{PREFIX}.control.*"

KV_OBJECTIVES = "dqoes_objectives"

SUBMIT = f"{PREFIX}.submit"
"""Clients -> manager (request/reply, public JSON): start a training job; the manager places it
(Algorithm 4 under FlowCon, spread otherwise) and replies naming the node."""
PROGRESS_ALL = f"{PREFIX}.progress.>"
TRAINING_ALL = f"{PREFIX}.training.*"
LAUNCH_ALL = f"{PREFIX}.launch.*"

JOIN_REQUEST = f"{PREFIX}.join.request"
"""A joining node -> the control plane's registrar (request/reply, JSON; shared/joining.py): the
only subject the anonymous `join` identity may publish on."""
KV_CONTROL = "dqoes_control_plane"
"""A control plane on several hosts: the join registry (key `registry`) and its members' client URLs
(`member.<name>`), replicated; only the members' registrar identity may use it."""
KV_LEADER = "dqoes_manager_lease"
"""A control plane on several hosts: the lease (key `manager`) of the member whose manager runs."""
"""JetStream key-value bucket holding the durable objectives (one key per container)."""

_KINDS_WITH_NODE = ("decisions", "state", "objectives", "control", "training", "launch")
_FORBIDDEN = frozenset("*>~")
_KV_KEY_RE = re.compile(r"^[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*$")


_GOOD_ID = re.compile(r"[^\s*>~]{1," + str(MAX_ID_CHARS) + "}")

_IDS_SEEN_MAX = 4096
"""Most ids remembered as good; past it the memory starts again (a flood of new names costs each its
full check, never unbounded memory)."""
_ids_seen: set[str] = set()


def is_good_id(name: str) -> bool:
    """Whether a string can be a node or container id on the bus, in one pass (this runs per message).

    Ids already found good (plain `str` only) pass at a set lookup; a bad one is never remembered.
    """
    if type(name) is not str:
        return _GOOD_ID.fullmatch(name) is not None and name.isprintable()
    if name in _ids_seen:
        return True
    if _GOOD_ID.fullmatch(name) is None or not name.isprintable():
        return False
    if len(_ids_seen) >= _IDS_SEEN_MAX:
        _ids_seen.clear()
    _ids_seen.add(name)
    return True


def validate_id(name: object, what: str = "id") -> str:
    """Return `name` if it can be a node or container id on the bus, else raise ValueError.

    The error names the id (repr, truncated) and says what is wrong with it.
    """
    if isinstance(name, str) and is_good_id(name):
        return name  # the common case
    if not isinstance(name, str):
        raise ValueError(f"{what} must be a string, got {_show(name)}")
    if not name:
        raise ValueError(f"{what} must not be empty")
    if len(name) > MAX_ID_CHARS:
        raise ValueError(f"{what} {_show(name)} is longer than {MAX_ID_CHARS} characters")
    if not name.isprintable() or any(ch.isspace() for ch in name):
        raise ValueError(f"{what} {_show(name)} contains whitespace or unprintable characters")
    bad = sorted(set(name) & _FORBIDDEN)
    if bad:
        raise ValueError(f"{what} {_show(name)} contains {''.join(bad)!r} (not allowed in ids)")
    return name


def token(name: str, what: str = "id") -> str:
    """The subject token for a node or container id: validated, '.' written as '~'."""
    return validate_id(name, what).replace(".", "~")


def untoken(tok: str) -> str:
    """The id a subject token stands for (inverse of `token`); ValueError if it is no token."""
    if not isinstance(tok, str) or "." in tok:
        raise ValueError(f"not a subject token: {_show(tok)}")
    name = tok.replace("~", ".")
    validate_id(name)
    return name


# --- per-node and per-container subjects -----------------------------------


def latency(node: str, container: str) -> str:
    """Inference container -> its worker: one finished batch (`LatencyEvent`, msgpack)."""
    return f"{PREFIX}.latency.{token(node, 'node')}.{token(container, 'container')}"


def latency_of_node(node: str) -> str:
    """What a worker subscribes to: the latency events of every container on its node."""
    return f"{PREFIX}.latency.{token(node, 'node')}.*"


def decisions(node: str) -> str:
    """Worker -> anyone: one round's decision (`DecisionMsg`, msgpack)."""
    return f"{PREFIX}.decisions.{token(node, 'node')}"


def state(node: str) -> str:
    """Worker -> manager, dashboard: the node's state (`NodeState`, msgpack)."""
    return f"{PREFIX}.state.{token(node, 'node')}"


def objectives(node: str) -> str:
    """Manager -> worker: an objective for one of its containers (`ObjectiveAssign`, msgpack)."""
    return f"{PREFIX}.objectives.{token(node, 'node')}"


def control(node: str) -> str:
    """Operator -> worker: parameter reads and changes (`ControlMsg` request, `ControlReply`, msgpack)."""
    return f"{PREFIX}.control.{token(node, 'node')}"


def progress(node: str, job: str) -> str:
    """Training job -> its worker: evaluation values (`Progress`) and completion (`JobDone`), msgpack."""
    return f"{PREFIX}.progress.{token(node, 'node')}.{token(job, 'job')}"


def progress_of_node(node: str) -> str:
    """What a worker subscribes to: every training job of its node."""
    return f"{PREFIX}.progress.{token(node, 'node')}.*"


def training(node: str) -> str:
    """Worker -> manager, dashboard: the node's training state (`TrainingState`, msgpack)."""
    return f"{PREFIX}.training.{token(node, 'node')}"


def launch(node: str) -> str:
    """Manager -> worker (request/reply): start a training job there (`Launch` -> `LaunchReply`)."""
    return f"{PREFIX}.launch.{token(node, 'node')}"


def parse(subject: str) -> tuple[str, tuple[str, ...]]:
    """Split one of our concrete subjects into (kind, ids), ids decoded.

    `parse("dqoes.latency.n1.web~1") == ("latency", ("n1", "web.1"))`;
    `parse("dqoes.targets") == ("targets", ())`, `parse("dqoes.targets.get") ==
    ("targets.get", ())`. ValueError for anything else.
    """
    parts = subject.split(".") if isinstance(subject, str) else []
    if len(parts) < 2 or parts[0] != PREFIX:
        raise ValueError(f"not a {PREFIX} subject: {_show(subject)}")
    kind, rest = parts[1], parts[2:]
    expected = {"latency": 2, "progress": 2, "targets": 0, "submit": 0, **{k: 1 for k in _KINDS_WITH_NODE}}
    if kind == "cluster" and rest in (["state"], ["query"], ["containers"]):
        return f"cluster.{rest[0]}", ()
    if kind == "targets" and rest in (["get"], ["list"], ["clear"]):
        return f"targets.{rest[0]}", ()
    if kind not in expected or len(rest) != expected[kind]:
        raise ValueError(f"not a {PREFIX} subject: {_show(subject)}")
    return kind, tuple(untoken(t) for t in rest)


def is_kv_key(key: str) -> bool:
    """Whether a string can be a key-value key as it is."""
    return isinstance(key, str) and bool(_KV_KEY_RE.match(key))


def kv_key(container: str) -> str:
    """The key-value key for a container's objective.

    KV keys allow fewer characters than subject tokens (letters, digits,
    '-', '_', '/', '=', and '.' between parts), so ids outside that set are
    rejected with a ValueError naming them. Docker names and ids fit.
    """
    validate_id(container, "container")
    if not _KV_KEY_RE.match(container):
        raise ValueError(
            f"container {_show(container)} cannot be a key-value key "
            "(allowed: letters, digits, '-', '_', '/', '=', and '.' between parts)"
        )
    return container


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
