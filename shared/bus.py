"""The message bus: the one module that imports `nats`.

Why: every service (worker, manager, inference containers, dashboard, CLI)
needs the same few things from NATS, and each needs them to behave the same
way when things go wrong. Here, once:

- connect with one clear error if the server cannot be reached in time, then
  reconnect forever with a short wait; a disconnect and a reconnect are one
  log line each;
- authenticate with the identity's nkey (`shared.auth`: the server's nonce
  signed with the seed; no secret crosses the wire) and use the identity's
  own inbox prefix, so replies come where only it may read;
- enforce TLS when the URL says `tls://`: nats-py upgrades only when the
  server asks, so a server (or a squatter on its port) that offers no TLS
  is refused before anything is sent (`TLSRequired`);
- answer requests only on inboxes: a reply subject outside `_INBOX.` (a
  requester aiming the answer at the objectives bucket, a JetStream API or
  an internal subject) is not answered; counted (`refused_replies`) and
  logged at most every 5 s;
- publish schema messages (`shared.schema`, msgpack, sender = the bus's
  name), raw bytes, or JSON for the public subjects;
- subscribe with a handler that receives the decoded message. A payload that
  does not decode is dropped, counted (`bus.dropped`) and logged as one
  WARNING line at most every 5 s per subscription, with the count; a handler
  that raises is logged as one line and the subscription goes on. Nothing a
  peer sends can kill a subscriber;
- request/reply, JetStream key-value (`Bus.kv`), drain on shutdown.

Errors from NATS surface as `BusError` (or `RequestTimeout`, `NoResponders`)
with a one-line message, so services never import nats to catch them.
Handlers run one at a time per subscription, in arrival order: keep them
short or hand work to a task.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client as _NatsClient
from nats.js.api import KeyValueConfig, StorageType

from shared import auth, schema
from shared.ratelog import RateLimiter
from shared.schema import Message, SchemaError

log = logging.getLogger(__name__)

PENDING_MSGS_LIMIT = 2_000_000
"""Messages a batch subscription may hold before nats.py drops them as a slow consumer."""
PENDING_BYTES_LIMIT = 512 * 1024 * 1024
"""Bytes a batch subscription may hold (a latency event is about 120 bytes)."""

INBOX_PREFIX = auth.INBOX_ROOT + "."
"""Replies go only to subjects under it (each identity reads only its own `_INBOX.<identity>.>`)."""

LOG_EVERY_S = 5.0
"""At most one WARNING line per subscription and kind of trouble in this many seconds."""


class BusError(Exception):
    """A bus operation failed (not connected, server gone, JetStream missing); one line."""


class _NoJetStream(BusError):
    """The server has no JetStream: waiting will not help."""


class KVConflict(BusError):
    """A compare-and-set on a key-value entry lost: the key changed (or exists) since it was read."""


class RequestTimeout(BusError, TimeoutError):
    """A request got no reply in time."""


class NoResponders(BusError):
    """A request went to a subject nobody serves."""


class TLSRequired(BusError):
    """The URL says tls:// and the server offers no TLS: nothing was sent to it."""


class _TLSRequiredAgain(nats.errors.Error):
    """The same, on a reconnect: nats-py logs it and tries again."""


class _Client(_NatsClient):
    """nats-py's client, refusing to send CONNECT in the clear to a `tls://` URL.

    nats-py reads the server's INFO, upgrades to TLS only if INFO says
    `tls_required`, then builds CONNECT (`_connect_command`, nats-py 2.x):
    here, before any byte of it is written, the connection must be TLS.
    """

    def _connect_command(self) -> bytes:
        server = self._current_server
        if server is not None and server.uri.scheme == "tls" and not self._is_tls():
            where = f"{server.uri.hostname}:{server.uri.port}"
            text = f"the URL says tls:// but the server at {where} offers no TLS; nothing was sent to it"
            if self.is_reconnecting:
                raise _TLSRequiredAgain(text)
            raise TLSRequired(text)
        return super()._connect_command()

    def _is_tls(self) -> bool:
        writer = getattr(self._transport, "_io_writer", None)
        return writer is not None and writer.get_extra_info("ssl_object") is not None


@dataclass(frozen=True, slots=True)
class Incoming:
    """A received message as handlers see it: where it came from and how to answer.

    `sender` and `ts` (unix s) come from the schema envelope; None on raw subscriptions.
    """

    subject: str
    reply: str
    data: bytes
    sender: str | None = None
    ts: float | None = None


MessageHandler = Callable[[Any, Incoming], Awaitable[None] | None]
RawHandler = Callable[[Incoming], Awaitable[None] | None]


class Subscription:
    """One subscription of a `Bus`; counts what it delivered, dropped and what failed."""

    def __init__(self, subject: str, queue: str | None) -> None:
        self.subject = subject
        self.queue = queue
        self.delivered = 0
        self.dropped = 0
        self.failed = 0
        self._sub: Any = None

    async def unsubscribe(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            try:
                await sub.unsubscribe()
            except nats.errors.Error as e:
                log.debug("unsubscribe from %s: %r", self.subject, e)

    def __repr__(self) -> str:
        return (
            f"Subscription({self.subject!r}, delivered={self.delivered}, "
            f"dropped={self.dropped}, failed={self.failed})"
        )


@dataclass(frozen=True, slots=True)
class KVEntry:
    """One key-value update: `value` None when the key was deleted or purged."""

    key: str
    value: bytes | None
    revision: int

    @property
    def deleted(self) -> bool:
        return self.value is None


KVCallback = Callable[[KVEntry], Awaitable[None] | None]


class Bus:
    """A connection to NATS with schema-aware publish/subscribe. Build with `await Bus.connect(...)`."""

    def __init__(self, nc: _NatsClient, name: str, url: str, reconnect_wait_s: float) -> None:
        self._nc = nc
        self.name = name
        self.url = url
        self.reconnect_wait_s = reconnect_wait_s
        self.dropped = 0
        """Payloads that failed to decode, over all subscriptions."""
        self.dropped_by_subject: Counter[str] = Counter()
        """The same, per subscribed subject (pattern)."""
        self.handler_errors = 0
        self._limiter = RateLimiter(LOG_EVERY_S)
        self._closing = False
        self._kv_watches: set[KVWatch] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._last_error: BaseException | None = None
        self._refused: BaseException | None = None
        """The server's refusal (authorization) if one came while connecting: the cause of what follows."""
        self.permission_violations: deque[str] = deque(maxlen=100)
        """The server's refusals of this identity's publishes and subscriptions (newest last)."""
        self.refused_replies = 0
        """Requests not answered because their reply subject was not an inbox."""

    # --- connection -------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        name: str,
        *,
        creds: str | os.PathLike[str] | auth.Credentials | None = None,
        connect_timeout_s: float = 5.0,
        reconnect_wait_s: float = 0.5,
        drain_timeout_s: float = 5.0,
        ping_interval_s: float = 10.0,
        inbox_prefix: str | None = None,
    ) -> Bus:
        """Connect to `url` as `name` (also the `sender` of every message published).

        `url` may be a comma-separated list (a NATS cluster's servers): the
        bus connects to one and, when it goes, reconnects to another.

        Credentials: `creds` (a file or loaded `auth.Credentials`), else the
        file the URL names (`?creds=PATH`, `auth.with_credentials`), else none
        (anonymous; `inbox_prefix` then says where its replies come, as the
        anonymous `join` identity must: `auth.JOIN_INBOX`). Raises BusError (one line) if no connection is made
        within `connect_timeout_s`, TLSRequired at once for a `tls://` URL
        whose server offers no TLS. Once connected, the bus reconnects
        forever, every `reconnect_wait_s`.
        """
        try:
            server_url, named = auth.split_url(url)
            tls = auth.tls_context(server_url)  # `?ca=PATH`: verified against that CA only
        except auth.AuthError as e:
            raise BusError(f"cannot connect to NATS at {auth.redact(url)}: {e}") from None
        source = creds or named
        try:
            identity = source if isinstance(source, auth.Credentials) else (
                auth.load(source) if source else None)
        except auth.AuthError as e:
            raise BusError(f"cannot connect to NATS at {auth.redact(server_url)}: {e}") from None
        key_options: dict[str, Any] = {}
        if identity is not None:
            key_options = {"nkeys_seed_str": identity.seed, "inbox_prefix": identity.inbox_prefix}
        elif inbox_prefix is not None:
            key_options = {"inbox_prefix": inbox_prefix}
        if tls is not None:
            key_options["tls"] = tls
        nc = _Client()
        bus = cls(nc, name, auth.redact(server_url), reconnect_wait_s)
        try:
            await asyncio.wait_for(
                nc.connect(
                    servers=auth.server_list(server_url),  # a cluster: any may serve, each reconnect picks one
                    **key_options,
                    name=name,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    # nats-py annotates these int; it takes seconds as float throughout.
                    reconnect_time_wait=reconnect_wait_s,  # type: ignore[arg-type]
                    connect_timeout=min(connect_timeout_s, 2.0),  # type: ignore[arg-type]
                    drain_timeout=drain_timeout_s,  # type: ignore[arg-type]
                    ping_interval=ping_interval_s,  # type: ignore[arg-type]
                    max_outstanding_pings=3,
                    error_cb=bus._on_error,
                    disconnected_cb=bus._on_disconnected,
                    reconnected_cb=bus._on_reconnected,
                    closed_cb=bus._on_closed,
                ),
                connect_timeout_s,
            )
        except TLSRequired as e:
            bus._closing = True
            await _close_quietly(nc)
            raise TLSRequired(f"cannot connect to NATS at {bus.url}: {e}") from None
        except (TimeoutError, OSError, nats.errors.Error) as e:
            bus._closing = True
            await _close_quietly(nc)
            # nats-py retries until the timeout; a refusal is the cause, a reset on a retry only its echo.
            last = bus._refused or bus._last_error or e
            raise BusError(
                f"cannot connect to NATS at {bus.url} within {connect_timeout_s:g} s "
                f"(last error: {_one_line(last)})"
            ) from None
        log.info("connected to NATS at %s as %s%s", bus.url, name,
                 f" (identity {identity.identity})" if identity is not None else "")
        return bus

    async def _on_error(self, e: Exception) -> None:
        self._last_error = e
        if "authorization" in str(e).lower():
            self._refused = e
        if "permissions violation" in str(e).lower():
            self.permission_violations.append(_one_line(e))
        if self._closing or not self._nc.is_connected or isinstance(e, _CONNECTION_LOST):
            # A lost connection is reported once, by the disconnect line.
            log.debug("NATS error while (dis)connecting: %r", e)
            return
        count = self._limiter.hit(("nats-error", type(e).__name__))
        if count is not None:
            log.warning("NATS error (%d in the last %g s): %s", count, LOG_EVERY_S, _one_line(e))

    async def _on_disconnected(self) -> None:
        if not self._closing:
            why = f" ({_one_line(self._last_error)})" if self._last_error else ""
            log.warning(
                "disconnected from NATS at %s%s; reconnecting every %g s",
                self.url,
                why,
                self.reconnect_wait_s,
            )

    async def _on_reconnected(self) -> None:
        self._last_error = None
        log.info("reconnected to NATS at %s (server %s)", self.url, self.server)

    async def _on_closed(self) -> None:
        log.debug("NATS connection of %s closed", self.name)

    @property
    def server(self) -> str | None:
        """host:port of the server this connection uses now (one of a cluster's), None while down."""
        where = self._nc.connected_url if self._nc.is_connected else None
        return f"{where.hostname}:{where.port}" if where is not None else None

    @property
    def is_connected(self) -> bool:
        return self._nc.is_connected

    # --- publishing -------------------------------------------------------------------

    async def publish(self, subject: str, msg: Message, *, ts: float | None = None) -> None:
        """Publish a schema message (msgpack, sender = this bus's name, ts default now)."""
        data = schema.encode(msg, self.name, ts)
        log.debug("publish %s on %s (%d bytes)", msg.TYPE, subject, len(data))
        await self._publish(subject, data)

    async def publish_raw(self, subject: str, data: bytes, *, reply: str = "") -> None:
        """Publish bytes as they are (public subjects, replies)."""
        log.debug("publish %d raw bytes on %s", len(data), subject)
        await self._publish(subject, bytes(data), reply)

    async def publish_json(self, subject: str, obj: Any) -> None:
        """Publish JSON: `obj.to_json()` if it has one (ClusterState), else orjson of `obj`."""
        to_json = getattr(obj, "to_json", None)
        data = to_json() if callable(to_json) else orjson.dumps(obj)
        await self.publish_raw(subject, data)

    async def _publish(self, subject: str, data: bytes, reply: str = "") -> None:
        try:
            await self._nc.publish(subject, data, reply=reply)
        except nats.errors.Error as e:
            raise BusError(f"publish on {subject} failed: {_one_line(e)}") from None

    async def flush(self, timeout_s: float = 2.0) -> None:
        """Wait until the server has processed everything sent so far (subscriptions too)."""
        try:
            # nats.py's flush() writes its PING straight to the socket, ahead of
            # commands still queued for its flusher task (a SUB just made, say),
            # so its PONG can come back before the server has seen them. Have
            # the flusher write the queue first (nats.py 2.16, private method).
            flush_pending = getattr(self._nc, "_flush_pending", None)
            if flush_pending is not None and self._nc.is_connected:
                await asyncio.wait_for(flush_pending(force_flush=True), timeout_s)
            await self._nc.flush(timeout=timeout_s)  # type: ignore[arg-type]  # float works
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"flush failed: {_one_line(e)}") from None

    # --- subscribing ------------------------------------------------------------------

    async def subscribe(
        self,
        subject: str,
        handler: MessageHandler,
        *,
        queue: str | None = None,
        expect: type | tuple[type, ...] | None = None,
    ) -> Subscription:
        """Call `handler(message, incoming)` for every schema message on `subject`.

        `expect`: message class(es) this subscription takes; others are
        dropped like undecodable payloads. `queue`: a queue group (one member
        gets each message). Handlers may be plain or async functions.
        """
        sub = Subscription(subject, queue)

        async def on_msg(m: Any) -> None:
            try:
                env = schema.decode_envelope(m.data)
                if expect is not None and not isinstance(env.msg, expect):
                    raise SchemaError(f"message.type: {env.type!r} is not expected here")
            except SchemaError as e:
                self._drop(sub, m.subject, e)
                return
            sub.delivered += 1
            log.debug("received %s on %s from %s", env.type, m.subject, env.sender)
            incoming = Incoming(m.subject, self._reply_subject(m), m.data, env.sender, env.ts)
            await self._call(sub, handler, env.msg, incoming)

        return await self._subscribe(sub, on_msg)

    async def subscribe_batch(
        self,
        subject: str,
        handler: Callable[[list[Any]], Awaitable[None] | None],
        decode: Callable[[bytes], Any],
        *,
        max_batch: int = 2048,
        pending_msgs_limit: int = PENDING_MSGS_LIMIT,
        pending_bytes_limit: int = PENDING_BYTES_LIMIT,
        with_subjects: bool = False,
    ) -> Subscription:
        """Call `handler(messages)` with every decoded message that arrived since the last call.

        For subjects that carry tens of thousands of messages a second (latency
        events): no coroutine per message; what is queued is taken at once (up
        to `max_batch`), decoded with `decode` (raising SchemaError for a bad
        payload: dropped, counted, logged like `subscribe`), and handed over in
        arrival order. The pending limits are set deliberately high, so a
        burst waits in memory instead of being dropped as a slow consumer.
        `with_subjects`: the handler gets (subject, message) pairs, for a
        subscriber that checks what a wildcard subject says against the body.
        """
        sub = Subscription(subject, None)
        try:
            nsub = await self._nc.subscribe(subject, pending_msgs_limit=pending_msgs_limit,
                                            pending_bytes_limit=pending_bytes_limit)
        except nats.errors.Error as e:
            raise BusError(f"subscribe to {subject} failed: {_one_line(e)}") from None
        sub._sub = nsub
        queue: asyncio.Queue[Any] = nsub._pending_queue  # nats.py 2.x: the subscription's own queue

        async def pump() -> None:
            while True:
                first = await queue.get()
                raw = [first]
                while len(raw) < max_batch and not queue.empty():
                    raw.append(queue.get_nowait())
                out = []
                for m in raw:
                    queue.task_done()
                    nsub._pending_size -= len(m.data)
                    try:
                        out.append((m.subject, decode(m.data)) if with_subjects else decode(m.data))
                    except SchemaError as e:
                        self._drop(sub, m.subject, e)
                sub.delivered += len(out)
                if out:
                    await self._call(sub, handler, out)

        task = asyncio.get_running_loop().create_task(pump(), name=f"batch-{subject}")
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)
        if self._nc.is_connected:
            try:
                await self.flush()
            except BusError as e:
                log.debug("subscribe to %s not confirmed: %s", subject, e)
        return sub

    async def subscribe_raw(
        self, subject: str, handler: RawHandler, *, queue: str | None = None
    ) -> Subscription:
        """Call `handler(incoming)` with the bytes as they came (public JSON subjects)."""
        sub = Subscription(subject, queue)

        async def on_msg(m: Any) -> None:
            sub.delivered += 1
            log.debug("received %d raw bytes on %s", len(m.data), m.subject)
            await self._call(sub, handler, Incoming(m.subject, self._reply_subject(m), m.data))

        return await self._subscribe(sub, on_msg)

    async def _subscribe(
        self, sub: Subscription, on_msg: Callable[[Any], Awaitable[None]]
    ) -> Subscription:
        try:
            sub._sub = await self._nc.subscribe(sub.subject, queue=sub.queue or "", cb=on_msg)
        except nats.errors.Error as e:
            raise BusError(f"subscribe to {sub.subject} failed: {_one_line(e)}") from None
        if self._nc.is_connected:
            # Return only once the server has the subscription, so a message
            # published right after (by anyone) reaches it. While disconnected
            # nats.py replays subscriptions on reconnect.
            try:
                await self.flush()
            except BusError as e:
                log.debug("subscribe to %s not confirmed: %s", sub.subject, e)
        log.debug("subscribed to %s", sub.subject)
        return sub

    def _reply_subject(self, m: Any) -> str:
        """Where a request may be answered: its reply subject if an inbox, else nowhere."""
        reply: str = m.reply or ""
        if not reply or reply.startswith(INBOX_PREFIX):
            return reply
        self.refused_replies += 1
        count = self._limiter.hit(("reply", m.subject))
        if count is not None:
            log.warning("refused to answer %d request(s) on %s whose reply subject is not an inbox; "
                        "latest wanted %.120s", count, m.subject, reply)
        return ""

    def _drop(self, sub: Subscription, subject: str, error: SchemaError) -> None:
        sub.dropped += 1
        self.dropped += 1
        self.dropped_by_subject[sub.subject] += 1
        count = self._limiter.hit(("drop", sub.subject))
        if count is not None:
            log.warning(
                "dropped %d undecodable message(s) on %s; latest on %s: %s",
                count,
                sub.subject,
                subject,
                error,
            )

    async def _call(self, sub: Subscription, handler: Callable[..., Any], *args: Any) -> None:
        try:
            result = handler(*args)
            if inspect.isawaitable(result):
                await result
        except Exception as e:
            sub.failed += 1
            self.handler_errors += 1
            count = self._limiter.hit(("handler", sub.subject))
            if count is not None:
                log.error(
                    "handler %s for %s failed (%d time(s) since last report): %r",
                    getattr(handler, "__qualname__", handler),
                    sub.subject,
                    count,
                    e,
                )
            log.debug("handler failure on %s", sub.subject, exc_info=True)

    # --- request / reply --------------------------------------------------------------

    async def request(
        self, subject: str, payload: bytes | Message, timeout_s: float = 2.0
    ) -> bytes:
        """Send a request (bytes as they are, or a schema message) and return the reply's bytes."""
        if isinstance(payload, bytes | bytearray | memoryview):
            data = bytes(payload)
        else:
            data = schema.encode(payload, self.name)
        try:
            reply = await self._nc.request(subject, data, timeout=timeout_s)
        except nats.errors.NoRespondersError:
            raise NoResponders(f"no responders on {subject}") from None
        except nats.errors.TimeoutError:
            raise RequestTimeout(f"no reply on {subject} within {timeout_s:g} s") from None
        except nats.errors.Error as e:
            raise BusError(f"request on {subject} failed: {_one_line(e)}") from None
        return reply.data

    async def reply(self, incoming: Incoming, payload: bytes | Message) -> bool:
        """Answer a request; False (nothing sent) if the message asked for no reply."""
        if not incoming.reply.startswith(INBOX_PREFIX):
            return False
        if isinstance(payload, bytes | bytearray | memoryview):
            await self.publish_raw(incoming.reply, bytes(payload))
        else:
            await self.publish(incoming.reply, payload)
        return True

    # --- JetStream key-value ----------------------------------------------------------

    async def kv(self, bucket: str, history: int = 5, replicas: int = 1, wait_s: float = 30.0,
                 ttl_s: float | None = None) -> KV:
        """The key-value bucket `bucket` (file storage), created if missing.

        An existing bucket is used as it is (its history and replicas are kept).
        `replicas`: copies a JetStream cluster keeps of a new bucket (3: any one
        server can be lost without losing a value). A freshly formed cluster
        answers with timeouts while it elects its JetStream leaders: those are
        retried for `wait_s`; a disabled JetStream or a bad name fail at once.
        `ttl_s`: a new bucket forgets a value this long after it was written (a lease).
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                store = await self._open_kv(bucket, history, replicas, ttl_s)
                break
            except _NoJetStream:
                raise
            except BusError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)
        return KV(self, bucket, store)

    async def _open_kv(self, bucket: str, history: int, replicas: int, ttl_s: float | None = None) -> Any:
        js = self._nc.jetstream()
        try:
            try:
                return await js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                store = await js.create_key_value(
                    KeyValueConfig(bucket=bucket, history=history, storage=StorageType.FILE, replicas=replicas,
                                   ttl=ttl_s)
                )
                log.info("created key-value bucket %s (history %d, replicas %d)", bucket, history, replicas)
                return store
        except nats.js.errors.InvalidBucketNameError:
            raise ValueError(f"invalid key-value bucket name {bucket!r}") from None
        except (nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
            raise _NoJetStream(
                f"key-value bucket {bucket}: JetStream is not enabled on {self.url} "
                "(start nats-server with -js)"
            ) from None
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"key-value bucket {bucket}: {_one_line(e)}") from None

    # --- shutdown ---------------------------------------------------------------------

    async def drain(self) -> None:
        """Finish: handle what subscriptions already received, flush publishes, close."""
        self._closing = True
        await self._stop_watches()
        self._report_pending()
        if self._nc.is_closed:
            return
        try:
            await self._nc.drain()
        except nats.errors.Error as e:
            log.debug("drain of %s: %r; closing instead", self.name, e)
            await _close_quietly(self._nc)

    async def close(self) -> None:
        """Close at once (pending publishes are flushed if connected, subscriptions dropped)."""
        self._closing = True
        await self._stop_watches()
        self._report_pending()
        await _close_quietly(self._nc)

    async def _stop_watches(self) -> None:
        for watch in list(self._kv_watches):
            await watch.stop()
        for task in list(self._pumps):
            task.cancel()

    def _report_pending(self) -> None:
        for key, count in self._limiter.flush().items():
            if isinstance(key, tuple) and key[0] == "drop":
                log.warning("dropped %d more undecodable message(s) on %s", count, key[1])
            elif isinstance(key, tuple) and key[0] == "handler":
                log.error("handler for %s failed %d more time(s)", key[1], count)
            elif isinstance(key, tuple) and key[0] == "reply":
                log.warning("refused to answer %d more request(s) on %s (reply subject not an inbox)", count, key[1])

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain()


class KV:
    """A JetStream key-value bucket: bytes values, revisions, deletes, watches."""

    def __init__(self, bus: Bus, bucket: str, store: Any) -> None:
        self.bus = bus
        self.bucket = bucket
        self._store = store

    async def get(self, key: str) -> bytes | None:
        """The value of `key`, None if it was never set or is deleted."""
        entry = await self.get_entry(key)
        return entry.value if entry is not None else None

    async def get_entry(self, key: str, revision: int | None = None) -> KVEntry | None:
        """The latest entry of `key` (value and revision), or the one at `revision`; None if absent
        or deleted."""
        try:
            entry = await self._store.get(key, revision=revision)
        except nats.js.errors.KeyNotFoundError:
            return None
        except nats.js.errors.InvalidKeyError:
            raise ValueError(f"invalid key-value key {key!r}") from None
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: get {key!r} failed: {_one_line(e)}") from None
        return KVEntry(key=key, value=entry.value, revision=entry.revision)

    async def copies(self) -> dict[str, bool]:
        """Where a clustered bucket's copies are: server name -> whether that copy is current (the
        leader's is); {} for a bucket on a single server."""
        try:
            info = await self.bus._nc.jetstream().stream_info(f"KV_{self.bucket}")
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: info failed: {_one_line(e)}") from None
        cluster = info.cluster
        if cluster is None or cluster.leader is None:
            return {}
        out = {cluster.leader: True}
        for peer in cluster.replicas or []:
            if peer.name is not None:
                out[peer.name] = bool(peer.current) and not peer.offline
        return out

    async def put(self, key: str, value: bytes) -> int:
        """Store `value` under `key`; returns the new revision."""
        try:
            return await self._store.put(key, bytes(value))
        except nats.js.errors.InvalidKeyError:
            raise ValueError(f"invalid key-value key {key!r}") from None
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: put {key!r} failed: {_one_line(e)}") from None

    async def create(self, key: str, value: bytes) -> int:
        """Store `value` under `key` only if it has none; its revision. KVConflict if it has one."""
        try:
            return await self._store.create(key, bytes(value))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KVConflict(f"kv {self.bucket}: {key!r} exists") from None
        except nats.js.errors.InvalidKeyError:
            raise ValueError(f"invalid key-value key {key!r}") from None
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: create {key!r} failed: {_one_line(e)}") from None

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Store `value` under `key` only if its revision is still `last`; the new revision.
        KVConflict if another write came first."""
        try:
            return await self._store.update(key, bytes(value), last=last)
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KVConflict(f"kv {self.bucket}: {key!r} changed since revision {last}") from None
        except nats.js.errors.InvalidKeyError:
            raise ValueError(f"invalid key-value key {key!r}") from None
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: update {key!r} failed: {_one_line(e)}") from None

    async def delete(self, key: str) -> None:
        """Delete `key` (a delete marker; watchers see an entry with value None)."""
        try:
            await self._store.delete(key)
        except nats.js.errors.InvalidKeyError:
            raise ValueError(f"invalid key-value key {key!r}") from None
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: delete {key!r} failed: {_one_line(e)}") from None

    async def keys(self) -> list[str]:
        """Every key with a value (deleted keys left out); [] for an empty bucket."""
        try:
            return sorted(await self._store.keys())
        except nats.js.errors.NoKeysError:
            return []
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: keys failed: {_one_line(e)}") from None

    async def items(self) -> dict[str, bytes]:
        """Every key with its value (what a manager loads at start)."""
        out: dict[str, bytes] = {}
        for key in await self.keys():
            value = await self.get(key)
            if value is not None:
                out[key] = value
        return out

    async def watch(self, callback: KVCallback, *, keys: str = ">") -> KVWatch:
        """Call `callback(entry)` for the current value of every matching key, then for each change.

        `watch.ready` is set once the current values have been delivered.
        Callback errors are logged (one line) and the watch goes on.
        """
        try:
            watcher = await self._store.watch(keys)
        except (nats.errors.Error, TimeoutError) as e:
            raise BusError(f"kv {self.bucket}: watch failed: {_one_line(e)}") from None
        watch = KVWatch(self, watcher, callback)
        self.bus._kv_watches.add(watch)
        return watch


class KVWatch:
    """A running key-value watch; `await watch.stop()` ends it."""

    def __init__(self, kv: KV, watcher: Any, callback: KVCallback) -> None:
        self.kv = kv
        self.ready = asyncio.Event()
        self.delivered = 0
        self.failed = 0
        self._watcher = watcher
        self._callback = callback
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"kv-watch-{kv.bucket}"
        )

    async def _run(self) -> None:
        async for entry in self._watcher:
            if entry is None:  # nats.py's marker: the current values have all been delivered
                self.ready.set()
                continue
            deleted = entry.operation in ("DEL", "PURGE")
            update = KVEntry(
                key=entry.key, value=None if deleted else entry.value, revision=entry.revision
            )
            self.delivered += 1
            log.debug(
                "kv %s: %s %s rev %d",
                self.kv.bucket,
                "delete" if deleted else "put",
                update.key,
                update.revision,
            )
            try:
                result = self._callback(update)
                if inspect.isawaitable(result):
                    await result
            except Exception as e:
                self.failed += 1
                log.error("kv %s watch callback failed on %r: %r", self.kv.bucket, update.key, e)

    async def stop(self) -> None:
        self.kv.bus._kv_watches.discard(self)
        try:
            await self._watcher.stop()
        except Exception as e:  # already closed connection, server gone: nothing to undo
            log.debug("kv %s: watch stop: %r", self.kv.bucket, e)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


_CONNECTION_LOST = (OSError, nats.errors.UnexpectedEOF, nats.errors.StaleConnectionError)


async def _close_quietly(nc: _NatsClient) -> None:
    if nc.is_closed:
        return
    try:
        await nc.close()
    except Exception as e:
        log.debug("closing NATS connection: %r", e)


def _one_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    if type(e).__name__ not in text:
        text = f"{type(e).__name__}: {text}"
    return " ".join(text.split())[:300]


__all__ = [
    "Bus",
    "BusError",
    "Incoming",
    "KV",
    "KVEntry",
    "KVWatch",
    "NoResponders",
    "RequestTimeout",
    "Subscription",
    "TLSRequired",
]
