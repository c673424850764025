"""The manager's logic: DQoES's QoE Analyst.

It accepts objectives from clients (the public `dqoes.targets`), keeps them
durable (a JetStream key-value bucket, so they survive a restart of the
manager or of NATS), hands each to the worker hosting the container — also
when the container appears later — and adds the workers' node states up into
the cluster-wide view. A service objective (for every container of a Swarm
or compose service, or of a label selector) goes to every worker, which
applies it to the matching containers, present and future: the manager
compares what each node state says it holds and hands over the rest. Bad input never changes a stored objective: a target is
validated, stored, and only then handed over or acknowledged.

Storage and publishing are given as small async functions, so the logic can be
driven in tests by a real NATS server or anything that behaves the same.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import msgspec
import orjson

from shared import subjects
from shared.core.types import Cls
from shared.public import (
    ClusterState,
    ContainerInfo,
    NodeSummary,
    StoredTarget,
    TargetRequest,
    containers_reply,
    parse_empty_request,
    parse_node_filter,
    parse_subject_request,
    parse_target,
    target_reply_error,
    target_reply_ok,
)
from shared.ratelog import RateLimitedLog
from shared.schema import NodeState, ObjectiveAssign, SchemaError, ServiceObjective

log = logging.getLogger(__name__)

Send = Callable[[str, ObjectiveAssign | ServiceObjective], Awaitable[None]]

SERVICE_KEY_PREFIX = "_service/"
"""Service objectives' keys in the bucket; no container name starts with '_', so none collides."""


def service_key(selector: str) -> str:
    """The key-value key of a service objective; ValueError if the selector cannot be one."""
    key = SERVICE_KEY_PREFIX + selector
    if not subjects.is_kv_key(key):
        raise ValueError(f"service {selector!r} cannot be a key-value key "
                         "(allowed: letters, digits, '-', '_', '/', '=', and '.' between parts)")
    return key


class Store(Protocol):
    """Where objectives live: the key-value bucket (see `services.manager.app`)."""

    async def items(self) -> dict[str, tuple[int, bytes]]:
        """Every key with its (revision, value)."""

    async def put(self, key: str, value: bytes) -> int:
        """Store a value; its new revision."""

    async def delete(self, key: str) -> None:
        """Delete a key (raises if the store cannot be written)."""


@dataclass(frozen=True, slots=True)
class Objective:
    """A stored objective: for `container`, or (when `service` is set) for a service's containers."""

    container: str
    objective_s: float
    alpha: float | None
    revision: int
    set_at: float
    service: str | None = None
    percentile: float | None = None
    window_s: float | None = None

    @property
    def key(self) -> str:
        return service_key(self.service) if self.service is not None else subjects.kv_key(self.container)

    def to_json(self) -> bytes:
        body: dict[str, object] = ({"service": self.service} if self.service is not None
                                   else {"container": self.container})
        body |= {"objective_s": self.objective_s, "alpha": self.alpha, "set_at": self.set_at}
        if self.percentile is not None:
            body |= {"percentile": self.percentile, "window_s": self.window_s}
        return orjson.dumps(body)

    @classmethod
    def from_request(cls, t: TargetRequest, revision: int, set_at: float) -> Objective:
        return cls(t.container or "", t.objective_s, t.alpha, revision, set_at, t.service, t.percentile,
                   t.window_s)

    @classmethod
    def from_json(cls, data: bytes, revision: int) -> Objective:
        obj = orjson.loads(data)
        t = TargetRequest(container=obj.get("container"), service=obj.get("service"),
                          objective_s=obj["objective_s"], alpha=obj.get("alpha"),
                          percentile=obj.get("percentile"), window_s=obj.get("window_s"))
        return cls.from_request(t, revision, float(obj.get("set_at", 0.0)))

    def assign(self) -> ObjectiveAssign:
        return ObjectiveAssign(container=self.container, objective_s=self.objective_s, alpha=self.alpha,
                               revision=self.revision, percentile=self.percentile, window_s=self.window_s)

    def to_service(self) -> ServiceObjective:
        return ServiceObjective(selector=self.service or "", objective_s=self.objective_s, alpha=self.alpha,
                                revision=self.revision, percentile=self.percentile, window_s=self.window_s)

    def describe(self) -> str:
        what = f"service {self.service}" if self.service is not None else self.container
        how = f"{self.objective_s:g} s" if self.percentile is None else \
            f"p{self.percentile:g} <= {self.objective_s:g} s over {self.window_s or 'the source window'} s"
        return f"{how} for {what}"


class TargetRejected(Exception):
    """A target request that changes nothing; the message is the reply's error."""


class Manager:
    """Objectives, where containers are, and the cluster summary."""

    def __init__(
        self,
        store: Store,
        send: Send,
        *,
        stale_after_s: float = 15.0,
        resend_after_s: float = 5.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.send = send
        self.stale_after_s = stale_after_s
        self.resend_after_s = resend_after_s
        self.wall = wall
        self.objectives: dict[str, Objective] = {}
        self.services: dict[str, Objective] = {}
        """Service objectives by selector."""
        self._sent_services: dict[tuple[str, str], tuple[int, float]] = {}
        """(node, selector) -> (revision, when) last handed over, so a node is not flooded."""
        self.states: dict[str, NodeState] = {}
        self.received_at: dict[str, float] = {}
        self._sent: dict[str, tuple[str, int, float]] = {}
        self.accepted = 0
        self.rejected = 0
        self.rejections = RateLimitedLog(log, logging.INFO)
        """Rejected requests: one log line per 5 s with a count (any client can send them)."""
        self.cleared = 0

    async def load(self) -> int:
        """Read every stored objective (at start). Returns how many."""
        for key, (rev, data) in (await self.store.items()).items():
            try:
                o = Objective.from_json(data, rev)
            except (ValueError, KeyError, SchemaError, TypeError) as e:
                log.warning("stored objective %s is unreadable and was skipped: %s", key, e)
                continue
            if o.service is not None:
                self.services[o.service] = o
            else:
                self.objectives[o.container] = o
        log.info("loaded %d stored objective(s) for containers and %d for services",
                 len(self.objectives), len(self.services))
        return len(self.objectives) + len(self.services)

    # -- where containers are -------------------------------------------------

    def live_states(self) -> list[NodeState]:
        now = self.wall()
        return [s for n, s in self.states.items() if now - self.received_at[n] <= self.stale_after_s]

    def locate(self, container: str) -> tuple[str | None, bool]:
        """(node hosting it, running?) — node None if no live worker knows it."""
        expected_on = None
        for s in self.live_states():
            if any(c.container == container for c in s.containers):
                return s.node, True
            if container in s.expected:
                expected_on = s.node
        return expected_on, False

    async def on_node_state(self, ns: NodeState) -> None:
        prev = self.states.get(ns.node)
        # A worker that (re)started announces itself with round 0, or its round
        # count went back: it holds no hand-over, so hand over at once rather
        # than waiting out `resend_after_s` (issue 11: 2.5-4.5 s on old objectives).
        fresh = ns.round == 0 or (prev is not None and ns.round < prev.round)
        self.states[ns.node] = ns
        self.received_at[ns.node] = self.wall()
        now = self.wall()
        if fresh:
            for name, sent in list(self._sent.items()):
                if sent[0] == ns.node:
                    del self._sent[name]
            for key in [k for k in self._sent_services if k[0] == ns.node]:
                del self._sent_services[key]
        await self._reconcile_services(ns, now)
        for c in ns.containers:
            o = self.objectives.get(c.container)
            if o is None:
                continue
            if (c.objective_s == o.objective_s and c.alpha == o.alpha and c.percentile == o.percentile
                    and c.objective_selector is None):
                self._sent[c.container] = (ns.node, o.revision, now)
                continue
            last = self._sent.get(c.container)
            if last is not None and last[:2] == (ns.node, o.revision) and now - last[2] < self.resend_after_s:
                continue  # just handed over; the worker will report it next time
            await self._hand(o, ns.node)

    async def _hand(self, o: Objective, node: str) -> None:
        self._sent[o.container] = (node, o.revision, self.wall())
        await self.send(subjects.objectives(node), o.assign())
        log.info("objective %s handed to %s", o.describe(), node)

    async def _reconcile_services(self, ns: NodeState, now: float) -> None:
        """Hand a node the service objectives it lacks (or holds at another revision); take back the
        ones cleared. At most once per `resend_after_s` per node and service."""
        held = ns.service_objectives
        wanted: list[ServiceObjective] = [o.to_service() for sel, o in self.services.items()
                                          if held.get(sel) != o.revision]
        wanted += [ServiceObjective(selector=sel, objective_s=None, revision=rev + 1)
                   for sel, rev in held.items() if sel not in self.services]
        for msg in wanted:
            key = (ns.node, msg.selector)
            last = self._sent_services.get(key)
            if last is not None and last[0] == msg.revision and now - last[1] < self.resend_after_s:
                continue
            self._sent_services[key] = (msg.revision, now)
            await self.send(subjects.objectives(ns.node), msg)

    # -- targets ----------------------------------------------------------------

    async def on_target(self, payload: bytes) -> bytes:
        """Handle one public target request; the JSON reply (also when nobody asked for one)."""
        try:
            o, node, running = await self.set_target(payload)
        except TargetRejected as e:
            self.rejected += 1
            self.rejections.log("target rejected", "target rejected: %s", e)
            return target_reply_error(str(e))
        self.accepted += 1
        if o.service is not None:
            return target_reply_ok(service=o.service, objective_s=o.objective_s, alpha=o.alpha,
                                   percentile=o.percentile, window_s=o.window_s, revision=o.revision,
                                   containers=self.governed(o.service))
        extra = {} if o.percentile is None else {"percentile": o.percentile, "window_s": o.window_s}
        return target_reply_ok(container=o.container, objective_s=o.objective_s, alpha=o.alpha,
                               node=node, running=running, revision=o.revision, **extra)

    async def set_target(self, payload: bytes) -> tuple[Objective, str | None, bool]:
        try:
            t = parse_target(payload)
        except SchemaError as e:
            raise TargetRejected(str(e)) from None
        if t.service is not None:
            return await self.set_service_target(t), None, False
        assert t.container is not None
        try:
            key = subjects.kv_key(t.container)
        except ValueError as e:
            raise TargetRejected(str(e)) from None
        node, running = self.locate(t.container)
        if node is None and t.container not in self.objectives:
            raise TargetRejected(
                f"unknown container {t.container!r}: not running on any node and not expected by any worker"
            )
        o = Objective.from_request(t, 0, self.wall())
        try:
            rev = await self.store.put(key, o.to_json())
        except Exception as e:  # durability first: not stored, not accepted
            raise TargetRejected(f"could not store the objective: {e}") from None
        o = Objective.from_request(t, rev, o.set_at)
        self.objectives[o.container] = o
        if node is not None:
            await self._hand(o, node)
        log.info("objective %s stored (revision %d)", o.describe(), rev)
        return o, node, running

    async def set_service_target(self, t: TargetRequest) -> Objective:
        """Store a service objective, then hand it to every live worker (the others get it when they
        report: `_reconcile_services`). No container need match yet: replicas may come later."""
        assert t.service is not None
        try:
            key = service_key(t.service)
        except ValueError as e:
            raise TargetRejected(str(e)) from None
        o = Objective.from_request(t, 0, self.wall())
        try:
            rev = await self.store.put(key, o.to_json())
        except Exception as e:
            raise TargetRejected(f"could not store the objective: {e}") from None
        o = Objective.from_request(t, rev, o.set_at)
        self.services[t.service] = o
        now = self.wall()
        for ns in self.live_states():
            self._sent_services[(ns.node, t.service)] = (rev, now)
            await self.send(subjects.objectives(ns.node), o.to_service())
        log.info("objective %s stored (revision %d)", o.describe(), rev)
        return o

    def governed(self, selector: str) -> list[str]:
        """The containers a service objective governs now, as their workers last reported."""
        return sorted(c.container for s in self.live_states() for c in s.containers
                      if c.objective_selector == selector)

    # -- the objective lifecycle: get, list, clear --------------------------------

    def stored(self, o: Objective) -> StoredTarget:
        if o.service is not None:
            return StoredTarget(service=o.service, objective_s=o.objective_s, alpha=o.alpha, revision=o.revision,
                                set_at=o.set_at, percentile=o.percentile, window_s=o.window_s,
                                containers=tuple(self.governed(o.service)))
        node, running = self.locate(o.container)
        return StoredTarget(container=o.container, objective_s=o.objective_s, alpha=o.alpha,
                            revision=o.revision, set_at=o.set_at, node=node, running=running,
                            percentile=o.percentile, window_s=o.window_s)

    def on_get(self, payload: bytes) -> bytes:
        """`dqoes.targets.get`: {"ok": true, "target": {...}}, or ok false for no objective."""
        try:
            kind, name = parse_subject_request(payload, "get")
        except SchemaError as e:
            return target_reply_error(str(e))
        o = (self.services if kind == "service" else self.objectives).get(name)
        if o is None:
            return target_reply_error(f"no objective stored for {kind} {name!r}" if kind == "service"
                                      else f"no objective stored for {name!r}")
        return orjson.dumps({"ok": True, "target": to_json_obj(self.stored(o))})

    def on_list(self, payload: bytes) -> bytes:
        """`dqoes.targets.list`: {"ok": true, "targets": [...]}: services by selector, then containers by name."""
        try:
            parse_empty_request(payload, "list")
        except SchemaError as e:
            return target_reply_error(str(e))
        rows = [to_json_obj(self.stored(self.services[k])) for k in sorted(self.services)]
        rows += [to_json_obj(self.stored(self.objectives[k])) for k in sorted(self.objectives)]
        return orjson.dumps({"ok": True, "targets": rows})

    async def on_clear(self, payload: bytes) -> bytes:
        """`dqoes.targets.clear`: delete the stored objective, tell the worker; the JSON reply.

        The container becomes unmanaged (or falls back to its own
        `dqoes.objective_s` label): its worker stops controlling it and
        releases its CPU limit. Deleted from the store before it is
        acknowledged, like a set.
        """
        try:
            kind, name = parse_subject_request(payload, "clear")
        except SchemaError as e:
            self.rejected += 1
            return target_reply_error(str(e))
        if kind == "service":
            return await self.clear_service(name)
        o = self.objectives.get(name)
        if o is None:
            self.rejected += 1
            return target_reply_error(f"no objective stored for {name!r}")
        try:
            await self.store.delete(subjects.kv_key(name))
        except Exception as e:
            self.rejected += 1
            return target_reply_error(f"could not delete the objective: {e}")
        del self.objectives[name]
        self._sent.pop(name, None)
        node, running = self.locate(name)
        # Any later put gets a higher KV revision than the delete marker, so
        # revision + 1 orders this clear between the old and the next objective.
        revision = o.revision + 1
        if node is not None:
            await self.send(subjects.objectives(node),
                            ObjectiveAssign(container=name, objective_s=None, alpha=None, revision=revision))
        self.cleared += 1
        log.info("objective for %s cleared (was %g s)", name, o.objective_s)
        return target_reply_ok(container=name, cleared=True, previous_objective_s=o.objective_s,
                               node=node, running=running)

    async def clear_service(self, selector: str) -> bytes:
        """Delete a service objective and take it back from every live worker."""
        o = self.services.get(selector)
        if o is None:
            self.rejected += 1
            return target_reply_error(f"no objective stored for service {selector!r}")
        try:
            await self.store.delete(service_key(selector))
        except Exception as e:
            self.rejected += 1
            return target_reply_error(f"could not delete the objective: {e}")
        governed = self.governed(selector)
        del self.services[selector]
        now = self.wall()
        for ns in self.live_states():
            self._sent_services[(ns.node, selector)] = (o.revision + 1, now)
            await self.send(subjects.objectives(ns.node),
                            ServiceObjective(selector=selector, objective_s=None, revision=o.revision + 1))
        self.cleared += 1
        log.info("objective for service %s cleared (was %g s)", selector, o.objective_s)
        return target_reply_ok(service=selector, cleared=True, previous_objective_s=o.objective_s,
                               containers=governed)

    # -- the cluster view -------------------------------------------------------

    def cluster_state(self) -> ClusterState:
        return aggregate(self.live_states(), self.wall())

    def container_rows(self, node: str | None = None) -> list[ContainerInfo]:
        return container_rows(s for s in self.live_states() if node is None or s.node == node)

    def on_containers(self, payload: bytes) -> bytes:
        """`dqoes.cluster.containers`: every container of every live node (or of one)."""
        try:
            node = parse_node_filter(payload)
        except SchemaError as e:
            return target_reply_error(str(e))
        return containers_reply(self.container_rows(node), self.wall())


def to_json_obj(row: StoredTarget | ContainerInfo) -> dict[str, object]:
    return msgspec.structs.asdict(row)


def container_rows(node_states: Iterable[NodeState]) -> list[ContainerInfo]:
    """The public per-container view of node states (pure; the dashboard shows the same)."""
    rows = []
    for ns in node_states:
        for c in ns.containers:
            managed = c.managed and c.objective_s is not None
            cls = c.cls if managed else None
            met = c.met if c.met is not None else (None if cls is None else cls in (Cls.G, Cls.S))
            used = c.cpu_cores_used
            if used is None and c.cpu_share is not None:
                used = c.cpu_share * ns.cores
            rows.append(ContainerInfo(
                node=ns.node, container=c.container, model=c.model, managed=managed,
                objective_s=c.objective_s, alpha=c.alpha, latency_s=c.latency_s,
                met=met if managed else None, in_band=None if cls is None else cls is Cls.S,
                cls=None if cls is None else cls.value,
                cpu_limit_cores=None if c.limit is None else c.limit * ns.cores,
                cpu_used_cores=used, throttled_ratio=c.throttled_ratio,
                last_batch_at=c.last_batch_at, stale=c.stale, seen_at=ns.at,
                objective_source=c.objective_source if managed else None,
                objective_selector=c.objective_selector if managed else None,
                percentile=c.percentile if managed else None, window_s=c.window_s if managed else None,
                request_rate_per_s=c.request_rate_per_s,
            ))
    return rows


def aggregate(node_states: Iterable[NodeState], at: float) -> ClusterState:
    """Add up node states into the cluster summary (newest state per node wins).

    Pure: the manager publishes it and the dashboard's tests check their
    numbers against it. `containers` counts every container a node reports.
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
            slack_sum_g_s=ns.slack_sum_g_s,
            slack_sum_s_s=ns.slack_sum_s_s or 0.0,
            slack_sum_b_s=ns.slack_sum_b_s,
            interval_s=ns.interval_s,
            containers=len(ns.containers),
            policy=ns.policy,
            at=ns.at,
            met=ns.met,
            cpu_cores_used=ns.cpu_cores_used,
            cpu_cores_idle=ns.cpu_cores_idle,
        )
    summaries = list(nodes.values())
    return ClusterState(
        nodes=nodes,
        satisfied_total=sum(s.satisfied for s in summaries),
        G=sum(s.G for s in summaries),
        S=sum(s.S for s in summaries),
        B=sum(s.B for s in summaries),
        pending=sum(s.pending for s in summaries),
        slack_sum_g_s=_sum(s.slack_sum_g_s for s in summaries),
        slack_sum_s_s=_sum(s.slack_sum_s_s for s in summaries),
        slack_sum_b_s=_sum(s.slack_sum_b_s for s in summaries),
        containers_total=sum(s.containers for s in summaries),
        at=at,
        met_total=_count(s.met for s in summaries),
        cpu_cores_used_total=_total(s.cpu_cores_used for s in summaries),
        cpu_cores_idle_total=_total(s.cpu_cores_idle for s in summaries),
    )


def _total(xs: Iterable[int | float | None]) -> int | float | None:
    """The sum of what the nodes report, None when none reports it (older workers)."""
    known = [x for x in xs if x is not None]
    if not known:
        return None
    return sum(known) if all(isinstance(x, int) for x in known) else _sum(known)


def _count(xs: Iterable[int | None]) -> int | None:
    """The sum of counts the nodes report, None when none reports one."""
    known = [x for x in xs if x is not None]
    return sum(known) if known else None


def _sum(xs: Iterable[float]) -> float:
    """A sum that saturates instead of raising: each node's value is finite, their sum may not be."""
    try:
        total = math.fsum(xs)
    except OverflowError:
        total = math.inf
    return total if math.isfinite(total) else math.copysign(1e300, total)
