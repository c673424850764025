"""Live data: follow one or more running clusters over NATS and keep a bounded history.

Why a collector of its own: Streamlit reruns the page script on every
refresh and for every browser tab, while the bus delivers messages
continuously. A `Collector` runs its own asyncio loop in a background thread,
subscribes with the shared `Bus` to every worker's node states
(`dqoes.state.*`), decisions (`dqoes.decisions.*`) and the manager's summary
(`dqoes.cluster.state`) of each NATS URL it is given, and keeps per node a
ring buffer of the last `history_rounds` samples. The page only asks for a
`snapshot()`; it never waits on the bus, except for a target request, which
it hands to the collector's loop.

Nothing here needs a cluster: an unreachable URL is retried every few
seconds, and the snapshot says which URLs answer, so the page can say plainly
that it shows recorded runs only.

The tables are built incrementally (`History.run`): a refresh turns only the
samples that arrived since the last one into rows, so a page with 40
containers x 1,000 rounds per stack refreshes in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
import pandas as pd

from dashboard.data import (
    CONTAINER_COLUMNS,
    ROUND_COLUMNS,
    RunData,
    containers_frame,
    rounds_frame,
    state_rows,
)
from dashboard.forms import not_sent
from shared import auth, subjects
from shared.aio import wait_event
from shared.bus import Bus, BusError, Incoming, NoResponders, RequestTimeout
from shared.public import ClusterState, parse_target_reply
from shared.schema import DecisionMsg, NodeState, SchemaError, TrainingState

log = logging.getLogger(__name__)

HISTORY_ROUNDS = 1000
"""Samples kept per node (a worker publishes one per round and at least one a second)."""

CONNECTING, CONNECTED, UNREACHABLE = "connecting", "connected", "unreachable"


@dataclass
class _Sample:
    seq: int
    round_row: tuple[Any, ...]
    container_rows: list[tuple[Any, ...]]


class History:
    """One cluster's recent past: per node a ring buffer of samples, and its latest messages.

    Not thread-safe; the `Collector` holds a lock around it. `clock` gives
    the time axis origin: `t_s` of a sample is its `at` minus `t0`, and `t0`
    is the first `at` seen by any History sharing the same `TimeOrigin`.
    """

    def __init__(
        self, label: str, history_rounds: int = HISTORY_ROUNDS, origin: TimeOrigin | None = None
    ) -> None:
        self.label = label
        self.history_rounds = history_rounds
        self.origin = origin or TimeOrigin()
        self.samples: dict[str, deque[_Sample]] = {}
        self.latest: dict[str, NodeState] = {}
        self.decisions = DecisionLog()
        self.cluster: ClusterState | None = None
        self.cluster_at: float | None = None
        self.states = 0
        self.decisions_seen = 0
        self.version = 0
        self._seq = 0
        # Incremental tables: samples added since the last `run()`, and the last tables.
        self._pending: list[_Sample] = []
        self._dropped = False
        self._frames: tuple[pd.DataFrame, pd.DataFrame] | None = None
        self._run: RunData | None = None
        self._run_version = -1
        self.training_rows: deque[dict[str, Any]] = deque(maxlen=history_rounds * 20)
        """Per training job per training round (`dqoes.training.*`): the Training page's live rows."""

    # -- ingest ------------------------------------------------------------------------

    def add_state(self, ns: NodeState) -> None:
        """One node state: a new sample for its node (listener and event from its decision)."""
        self.states += 1
        self.version += 1
        self._seq += 1
        self.latest[ns.node] = ns
        d = self.decisions.for_round(ns.node, ns.round)
        round_row, rows = state_rows(
            ns, self._seq, self.origin.t_s(ns.at), d.listener if d else "", d.event if d else None
        )
        buf = self.samples.get(ns.node)
        if buf is None:
            buf = self.samples[ns.node] = deque(maxlen=self.history_rounds)
        if len(buf) == buf.maxlen:
            self._dropped = True
        sample = _Sample(self._seq, round_row, rows)
        buf.append(sample)
        self._pending.append(sample)
        if len(self._pending) > self.history_rounds * max(1, len(self.samples)):
            self._pending.clear()  # nobody has asked for a long time: rebuild from the buffers
            self._frames = None

    def add_decision(self, msg: DecisionMsg) -> None:
        self.decisions_seen += 1
        self.version += 1
        self.decisions.add(msg)

    def add_training_state(self, ts: TrainingState) -> None:
        """One worker's training round: a row per job (list, G, CPU share of the node, limit)."""
        self.version += 1
        t = self.origin.t_s(ts.at)
        for j in ts.jobs:
            self.training_rows.append({
                "t": t, "node": ts.node, "job": j.job, "stage": j.stage, "growth": j.growth,
                "cpu_share": None if j.cpu_cores is None else j.cpu_cores / ts.cores, "limit": j.limit,
                "policy": ts.policy})

    def add_cluster_state(self, cs: ClusterState, received_at: float) -> None:
        self.version += 1
        self.cluster = cs
        self.cluster_at = received_at

    # -- tables --------------------------------------------------------------------------

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The rounds and containers tables of every sample in the buffers."""
        if self._frames is None:
            samples = sorted((s for buf in self.samples.values() for s in buf), key=lambda s: s.seq)
            self._frames = _build(samples)
        elif self._pending:
            rounds, containers = self._frames
            new_rounds, new_containers = _build(self._pending)
            rounds = (
                pd.concat([rounds, new_rounds], ignore_index=True) if len(rounds) else new_rounds
            )
            containers = (
                pd.concat([containers, new_containers], ignore_index=True)
                if len(containers)
                else new_containers
            )
            if self._dropped:
                first = {node: buf[0].seq for node, buf in self.samples.items() if buf}
                rounds = _keep_from(rounds, first)
                containers = _keep_from(containers, first)
            self._frames = (rounds, containers)
        self._pending.clear()
        self._dropped = False
        return self._frames

    def run(self, policy_hint: str = "") -> RunData:
        """This cluster as a RunData (cached until a new message arrives)."""
        if self._run is not None and self._run_version == self.version:
            return self._run
        rounds, containers = self.frames()
        policies = sorted({ns.policy for ns in self.latest.values()})
        self._run = RunData(
            label=self.label,
            rounds=rounds,
            containers=containers,
            policy=policies[0] if len(policies) == 1 else (policy_hint or ", ".join(policies)),
            scenario="live",
            live=True,
            nodes={n: ns.cores for n, ns in sorted(self.latest.items())},
            containers_total=sum(len(ns.containers) for ns in self.latest.values()),
            meta={"scenario": "live", "t0": self.origin.t0},
        )
        self._run_version = self.version
        return self._run


def _build(samples: Sequence[_Sample]) -> tuple[pd.DataFrame, pd.DataFrame]:
    rounds = rounds_frame([s.round_row for s in samples])
    containers = containers_frame([r for s in samples for r in s.container_rows])
    return rounds, containers


def _keep_from(df: pd.DataFrame, first_seq: dict[str, int]) -> pd.DataFrame:
    """Rows of samples still in their node's ring buffer."""
    keep = df["round"].to_numpy() >= df["node"].map(first_seq).fillna(0).to_numpy()
    return df[keep].reset_index(drop=True) if not keep.all() else df


class DecisionLog:
    """The last few decisions of every node, to label a node state with its round's decision.

    A worker publishes a round's decision, then its state; they arrive on two
    subscriptions, so either may come first. A state takes the decision of
    its own round if it is here, else the node's latest.
    """

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._recent: dict[str, deque[DecisionMsg]] = {}

    def add(self, msg: DecisionMsg) -> None:
        recent = self._recent.get(msg.node)
        if recent is None:
            recent = self._recent[msg.node] = deque(maxlen=self.keep)
        recent.append(msg)

    def for_round(self, node: str, worker_round: int) -> DecisionMsg | None:
        recent = self._recent.get(node)
        if not recent:
            return None
        for d in reversed(recent):
            if d.round == worker_round:
                return d
        return recent[-1]

    def latest(self) -> dict[str, DecisionMsg]:
        """The newest decision of every node."""
        return {node: recent[-1] for node, recent in sorted(self._recent.items()) if recent}


class TimeOrigin:
    """The zero of the live time axis, shared by the stacks of one dashboard (twin runs align)."""

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = t0

    def t_s(self, at: float) -> float:
        if self.t0 is None:
            self.t0 = at
        return at - self.t0


# --- snapshots ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceSnapshot:
    """What the page needs to know about one cluster at one moment."""

    label: str
    url: str
    status: str
    """connecting, connected or unreachable."""
    error: str
    run: RunData
    decisions: dict[str, DecisionMsg]
    cluster: ClusterState | None
    states: int
    """Node states received so far."""
    version: int
    latest: dict[str, NodeState] = field(default_factory=dict)
    """The newest node state of each node (parameters in force)."""
    training: tuple[dict[str, Any], ...] = ()
    """Training rounds seen (`History.training_rows`), oldest first."""

    @property
    def has_data(self) -> bool:
        return not self.run.rounds.empty


@dataclass(frozen=True)
class Snapshot:
    sources: tuple[SourceSnapshot, ...]
    taken_at: float

    @property
    def any_connected(self) -> bool:
        return any(s.status == CONNECTED for s in self.sources)

    @property
    def all_unreachable(self) -> bool:
        return bool(self.sources) and all(s.status == UNREACHABLE for s in self.sources)


@dataclass
class _Feed:
    label: str
    url: str
    history: History
    status: str = CONNECTING
    error: str = ""
    attempts: int = 0
    bus: Bus | None = None
    subscriptions: list[Any] = field(default_factory=list)


class Collector:
    """Follows every (label, NATS URL) in the background; `snapshot()` from any thread.

    Start with `start()`, stop with `stop()`. `request_target()` sends a
    target request through the right cluster and returns its reply.
    """

    def __init__(
        self,
        sources: Sequence[tuple[str, str]],
        *,
        history_rounds: int = HISTORY_ROUNDS,
        connect_timeout_s: float = 2.0,
        retry_s: float = 3.0,
        name: str = "dashboard",
        wall: Callable[[], float] = time.time,
    ) -> None:
        labels = [label for label, _ in sources]
        if len(set(labels)) != len(labels):
            raise ValueError(f"source labels must be unique, got {labels}")
        origin = TimeOrigin()
        self._feeds = [
            _Feed(label, url, History(label, history_rounds, origin)) for label, url in sources
        ]
        self.connect_timeout_s = connect_timeout_s
        self.retry_s = retry_s
        self.name = name
        self.wall = wall
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._first_attempt = threading.Event()

    @property
    def sources(self) -> list[tuple[str, str]]:
        return [(f.label, f.url) for f in self._feeds]

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Collector:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(
            target=self._thread_main, name="dqoes-dashboard-collector", daemon=True
        )
        self._thread.start()
        self._ready.wait(5.0)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def wait_first_attempt(self, timeout_s: float) -> bool:
        """Wait until every URL was tried once (connected or found unreachable)."""
        return self._first_attempt.wait(timeout_s)

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:  # the page shows the sources as unreachable; the log says why
            log.exception("dashboard collector stopped")
        finally:
            self._first_attempt.set()
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        tasks = [
            asyncio.create_task(self._follow(f), name=f"follow-{f.label}") for f in self._feeds
        ]
        first = [asyncio.create_task(self._attempted(f)) for f in self._feeds]
        await asyncio.gather(*first)
        self._first_attempt.set()
        await self._stop.wait()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for f in self._feeds:
            if f.bus is not None:
                await f.bus.close()

    async def _attempted(self, feed: _Feed) -> None:
        while feed.attempts == 0 and feed.status == CONNECTING:
            await asyncio.sleep(0.02)

    async def _follow(self, feed: _Feed) -> None:
        assert self._stop is not None
        while not self._stop.is_set():
            problem = await asyncio.to_thread(probe, feed.url, min(1.0, self.connect_timeout_s))
            if problem is None:
                try:
                    bus = await Bus.connect(
                        auth.resolve(feed.url, None),  # credentials from $DQOES_NATS_CREDS
                        f"{self.name}-{feed.label}",
                        connect_timeout_s=self.connect_timeout_s,
                    )
                except (BusError, auth.AuthError) as e:
                    problem = str(e)
                else:
                    await self._subscribe(feed, bus)
                    return  # the bus reconnects on its own from now on
            with self._lock:
                feed.status, feed.error = UNREACHABLE, problem
                feed.attempts += 1
            log.debug("no cluster at %s: %s", feed.url, problem)
            await wait_event(self._stop, self.retry_s)

    async def _subscribe(self, feed: _Feed, bus: Bus) -> None:
        h = feed.history

        def on_state(msg: NodeState, _: Incoming) -> None:
            with self._lock:
                h.add_state(msg)

        def on_decision(msg: DecisionMsg, _: Incoming) -> None:
            with self._lock:
                h.add_decision(msg)

        def on_training(msg: TrainingState, _: Incoming) -> None:
            with self._lock:
                h.add_training_state(msg)

        def on_cluster(inc: Incoming) -> None:
            if inc.reply or not inc.data:
                return
            try:
                cs = ClusterState.from_json(inc.data)
            except SchemaError as e:
                log.debug("unreadable cluster state from %s: %s", feed.url, e)
                return
            with self._lock:
                h.add_cluster_state(cs, self.wall())

        feed.subscriptions = [
            await bus.subscribe(subjects.DECISIONS_ALL, on_decision, expect=DecisionMsg),
            await bus.subscribe(subjects.STATE_ALL, on_state, expect=NodeState),
            await bus.subscribe(subjects.TRAINING_ALL, on_training, expect=TrainingState),
            await bus.subscribe_raw(subjects.CLUSTER_STATE, on_cluster),
        ]
        with self._lock:
            feed.bus = bus
            feed.status, feed.error = CONNECTED, ""
            feed.attempts += 1
        log.info("dashboard following %s (%s)", feed.url, feed.label)

    # -- reading -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        """Every cluster's state now: status, tables, latest decisions and cluster summary."""
        out = []
        with self._lock:
            for f in self._feeds:
                h = f.history
                status = f.status
                if status == CONNECTED and f.bus is not None and not f.bus.is_connected:
                    status, error = CONNECTING, f"lost the connection to {auth.redact(f.url)}; reconnecting"
                else:
                    error = f.error
                out.append(
                    SourceSnapshot(
                        label=f.label,
                        url=f.url,
                        status=status,
                        error=error,
                        run=h.run(f.label),
                        decisions=h.decisions.latest(),
                        cluster=h.cluster,
                        states=h.states,
                        version=h.version,
                        latest=dict(h.latest),
                        training=tuple(h.training_rows),
                    )
                )
        return Snapshot(tuple(out), self.wall())

    # -- target requests ---------------------------------------------------------------------

    def request_clear(self, label: str, body: dict[str, Any], timeout_s: float = 3.0) -> dict[str, Any]:
        """Send `body` ({"container": ...}) to `dqoes.targets.clear` of cluster `label`; the reply."""
        return self.request_target(label, body, timeout_s, subject=subjects.TARGETS_CLEAR)

    def request_target(
        self, label: str, body: dict[str, Any], timeout_s: float = 3.0, subject: str = subjects.TARGETS
    ) -> dict[str, Any]:
        """Send `body` to `dqoes.targets` (or `subject`) of cluster `label`; the manager's reply.

        Never raises for bus trouble: no cluster, no manager and timeouts
        come back as {"ok": false, "error": ..., "answered": false}, which
        the page shows as it is (a manager's refusal has no "answered").
        """
        feed = next((f for f in self._feeds if f.label == label), None)
        if feed is None:
            return not_sent(f"no cluster named {label!r}")
        loop = self._loop
        if feed.bus is None or loop is None or loop.is_closed():
            return not_sent(f"not connected to {auth.redact(feed.url)}: nothing was sent")
        fut = asyncio.run_coroutine_threadsafe(
            _request(feed.bus, orjson.dumps(body), timeout_s, subject), loop
        )
        try:
            return fut.result(timeout_s + 2.0)
        except TimeoutError:
            fut.cancel()
            return not_sent(f"no reply on {subject} within {timeout_s:g} s")


# --- collectors started with the server -------------------------------------------------

_registry: dict[tuple[tuple[str, str], ...], Collector] = {}
_registry_lock = threading.Lock()


def register(collector: Collector) -> Collector:
    """Make a started collector the one the page uses for its sources (`dashboard.serve`)."""
    with _registry_lock:
        _registry[tuple(collector.sources)] = collector
    return collector


def registered(sources: Sequence[tuple[str, str]]) -> Collector | None:
    """The collector registered for exactly these sources, if any."""
    with _registry_lock:
        return _registry.get(tuple(sources))


async def _request(bus: Bus, payload: bytes, timeout_s: float, subject: str = subjects.TARGETS) -> dict[str, Any]:
    try:
        data = await bus.request(subject, payload, timeout_s=timeout_s)
    except NoResponders:
        return not_sent(f"no manager answers on {subject} at {auth.redact(bus.url)}")
    except RequestTimeout:
        return not_sent(f"no reply on {subject} within {timeout_s:g} s")
    except BusError as e:
        return not_sent(str(e))
    try:
        return parse_target_reply(data)
    except SchemaError as e:
        return not_sent(f"unreadable reply from the manager: {e}")


def probe(url: str, timeout_s: float = 1.0) -> str | None:
    """None if something accepts TCP connections at a nats:// URL, else why not.

    A refused port answers at once, where a NATS connect attempt waits for its
    whole timeout; URLs the probe cannot read are left to the NATS client.
    A comma-separated list (a cluster) is reachable when any of its servers is.
    """
    if "," in url:
        problems = [probe(u, timeout_s) for u in auth.server_list(url)]
        return None if None in problems else "; ".join(p for p in problems if p)
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        host, port = parts.hostname, parts.port or 4222
    except ValueError as e:
        return f"not a NATS URL: {url!r} ({e})"
    if parts.scheme not in ("nats", "tcp", "") or not host:
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return f"cannot connect to {host}:{port} ({e.strerror or type(e).__name__})"


__all__ = [
    "CONNECTED",
    "DecisionLog",
    "CONNECTING",
    "CONTAINER_COLUMNS",
    "Collector",
    "History",
    "HISTORY_ROUNDS",
    "ROUND_COLUMNS",
    "Snapshot",
    "SourceSnapshot",
    "TimeOrigin",
    "UNREACHABLE",
    "probe",
    "register",
    "registered",
]
