"""`Bus`: one connection to NATS, with publish, subscribe, request/reply and shutdown.

Why: every service (worker, manager, inference containers, dashboard, CLI)
needs the same few things from NATS, and each needs them to behave the same
way when things go wrong. The `Bus` holds the connection and the behaviour
that spans it: one clear error if no connection is made in time, then
reconnecting forever with one log line per disconnect and reconnect;
schema, raw and JSON publishing; subscriptions whose messages go through
`shared.bus.delivery`; key-value buckets from `shared.bus.kv`; drain on
shutdown. The pieces it builds on live beside it so that each stays small.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import orjson
from nats.aio.client import Client as NatsClient

from shared import auth, schema
from shared.bus.connection import Client, Events, close_quietly, credentials, server_of
from shared.bus.delivery import (
    INBOX_PREFIX,
    LOG_EVERY_S,
    Delivery,
    Incoming,
    MessageHandler,
    RawHandler,
    Subscription,
)
from shared.bus.errors import BusError, NoResponders, RequestTimeout, TLSRequired, one_line
from shared.bus.kv import KV, KVWatch, open_store
from shared.ratelog import RateLimiter
from shared.schema import Message, SchemaError

log = logging.getLogger("shared.bus")  # one logger for the whole bus: operators and tests filter on it

PENDING_MSGS_LIMIT = 2_000_000
"""Messages a batch subscription may hold before nats.py drops them as a slow consumer."""
PENDING_BYTES_LIMIT = 512 * 1024 * 1024
"""Bytes a batch subscription may hold (a latency event is about 120 bytes)."""


class Bus:
    """A connection to NATS with schema-aware publish/subscribe. Build with `await Bus.connect(...)`."""

    def __init__(self, nc: NatsClient, name: str, url: str, reconnect_wait_s: float) -> None:
        self._nc = nc
        self.name = name
        self.url = url
        self.reconnect_wait_s = reconnect_wait_s
        self._limiter = RateLimiter(LOG_EVERY_S)
        self._delivery = Delivery(self._limiter)
        self._events = Events(nc, name, url, reconnect_wait_s, self._limiter, LOG_EVERY_S)
        self._kv_watches: set[KVWatch] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self.permission_violations: deque[str] = self._events.permission_violations
        """The server's refusals of this identity's publishes and subscriptions (newest last)."""

    @property
    def dropped(self) -> int:
        """Payloads that failed to decode, over all subscriptions."""
        return self._delivery.dropped

    @property
    def dropped_by_subject(self) -> Counter[str]:
        """The same, per subscribed subject (pattern)."""
        return self._delivery.dropped_by_subject

    @property
    def handler_errors(self) -> int:
        """Handler calls that raised, over all subscriptions."""
        return self._delivery.handler_errors

    @property
    def refused_replies(self) -> int:
        """Requests not answered because their reply subject was not an inbox."""
        return self._delivery.refused_replies

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
        server_url, identity, key_options = credentials(url, creds, inbox_prefix)
        nc = Client()
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
                    error_cb=bus._events.on_error,
                    disconnected_cb=bus._events.on_disconnected,
                    reconnected_cb=bus._events.on_reconnected,
                    closed_cb=bus._events.on_closed,
                ),
                connect_timeout_s,
            )
        except TLSRequired as e:
            bus._events.closing = True
            await close_quietly(nc)
            raise TLSRequired(f"cannot connect to NATS at {bus.url}: {e}") from None
        except (TimeoutError, OSError, nats.errors.Error) as e:
            bus._events.closing = True
            await close_quietly(nc)
            # nats-py retries until the timeout; a refusal is the cause, a reset on a retry only its echo.
            last = bus._events.refused or bus._events.last_error or e
            raise BusError(
                f"cannot connect to NATS at {bus.url} within {connect_timeout_s:g} s "
                f"(last error: {one_line(last)})"
            ) from None
        log.info("connected to NATS at %s as %s%s", bus.url, name,
                 f" (identity {identity.identity})" if identity is not None else "")
        return bus

    @property
    def server(self) -> str | None:
        """host:port of the server this connection uses now (one of a cluster's), None while down."""
        return server_of(self._nc)

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
            raise BusError(f"publish on {subject} failed: {one_line(e)}") from None

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
            raise BusError(f"flush failed: {one_line(e)}") from None

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
                self._delivery.drop(sub, m.subject, e)
                return
            sub.delivered += 1
            log.debug("received %s on %s from %s", env.type, m.subject, env.sender)
            incoming = Incoming(m.subject, self._delivery.reply_subject(m), m.data, env.sender, env.ts)
            await self._delivery.call(sub, handler, env.msg, incoming)

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
            raise BusError(f"subscribe to {subject} failed: {one_line(e)}") from None
        sub._sub = nsub
        queue: asyncio.Queue[Any] = nsub._pending_queue  # nats.py 2.x: the subscription's own queue
        pump = self._delivery.pump(sub, nsub, queue, handler, decode, max_batch, with_subjects)
        task = asyncio.get_running_loop().create_task(pump, name=f"batch-{subject}")
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
            await self._delivery.call(sub, handler, Incoming(m.subject, self._delivery.reply_subject(m), m.data))

        return await self._subscribe(sub, on_msg)

    async def _subscribe(
        self, sub: Subscription, on_msg: Callable[[Any], Awaitable[None]]
    ) -> Subscription:
        try:
            sub._sub = await self._nc.subscribe(sub.subject, queue=sub.queue or "", cb=on_msg)
        except nats.errors.Error as e:
            raise BusError(f"subscribe to {sub.subject} failed: {one_line(e)}") from None
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
            raise BusError(f"request on {subject} failed: {one_line(e)}") from None
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
        store = await open_store(self._nc, self.url, bucket, history, replicas, wait_s, ttl_s)
        return KV(self, bucket, store)

    # --- shutdown ---------------------------------------------------------------------

    async def drain(self) -> None:
        """Finish: handle what subscriptions already received, flush publishes, close."""
        self._events.closing = True
        await self._stop_watches()
        self._delivery.report_pending()
        if self._nc.is_closed:
            return
        try:
            await self._nc.drain()
        except nats.errors.Error as e:
            log.debug("drain of %s: %r; closing instead", self.name, e)
            await close_quietly(self._nc)

    async def close(self) -> None:
        """Close at once (pending publishes are flushed if connected, subscriptions dropped)."""
        self._events.closing = True
        await self._stop_watches()
        self._delivery.report_pending()
        await close_quietly(self._nc)

    async def _stop_watches(self) -> None:
        for watch in list(self._kv_watches):
            await watch.stop()
        for task in list(self._pumps):
            task.cancel()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain()
