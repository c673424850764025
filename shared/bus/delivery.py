"""Handing received messages to handlers so that nothing a peer sends can kill a subscriber.

Why: every subscription of every service meets the same troubles, and each
must be met the same way. Here, once, for all subscriptions of one bus:

- a payload that does not decode is dropped, counted and logged as one
  WARNING line at most every `LOG_EVERY_S` per subscription, with the count;
- a handler that raises is logged as one line and the subscription goes on;
- a request whose reply subject is not an inbox (`_INBOX.`) is not answered:
  a requester could otherwise aim the answer at the objectives bucket, a
  JetStream API or an internal subject. Counted and logged the same way;
- a batch subscription takes what is queued at once instead of running a
  coroutine per message.

`shared.bus.core` subscribes; this module decides what each message becomes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats.errors

from shared import auth
from shared.ratelog import RateLimiter
from shared.schema import SchemaError

log = logging.getLogger("shared.bus")  # one logger for the whole bus: operators and tests filter on it

INBOX_PREFIX = auth.INBOX_ROOT + "."
"""Replies go only to subjects under it (each identity reads only its own `_INBOX.<identity>.>`)."""

LOG_EVERY_S = 5.0
"""At most one WARNING line per subscription and kind of trouble in this many seconds."""


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


class Delivery:
    """What one bus's subscriptions dropped, refused and failed, and the lines that report it."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter
        self.dropped = 0
        self.dropped_by_subject: Counter[str] = Counter()
        self.handler_errors = 0
        self.refused_replies = 0

    def reply_subject(self, m: Any) -> str:
        """Where a request may be answered: its reply subject if an inbox, else nowhere."""
        reply: str = m.reply or ""
        if not reply or reply.startswith(INBOX_PREFIX):
            return reply
        self.refused_replies += 1
        count = self.limiter.hit(("reply", m.subject))
        if count is not None:
            log.warning("refused to answer %d request(s) on %s whose reply subject is not an inbox; "
                        "latest wanted %.120s", count, m.subject, reply)
        return ""

    def drop(self, sub: Subscription, subject: str, error: SchemaError) -> None:
        """Count and (rate-limited) log a payload of `sub` that did not decode."""
        sub.dropped += 1
        self.dropped += 1
        self.dropped_by_subject[sub.subject] += 1
        count = self.limiter.hit(("drop", sub.subject))
        if count is not None:
            log.warning(
                "dropped %d undecodable message(s) on %s; latest on %s: %s",
                count,
                sub.subject,
                subject,
                error,
            )

    async def call(self, sub: Subscription, handler: Callable[..., Any], *args: Any) -> None:
        """Run `handler(*args)` (plain or async); a failure is counted and logged, never raised."""
        try:
            result = handler(*args)
            if inspect.isawaitable(result):
                await result
        except Exception as e:
            sub.failed += 1
            self.handler_errors += 1
            count = self.limiter.hit(("handler", sub.subject))
            if count is not None:
                log.error(
                    "handler %s for %s failed (%d time(s) since last report): %r",
                    getattr(handler, "__qualname__", handler),
                    sub.subject,
                    count,
                    e,
                )
            log.debug("handler failure on %s", sub.subject, exc_info=True)

    async def pump(
        self,
        sub: Subscription,
        nsub: Any,
        queue: asyncio.Queue[Any],
        handler: Callable[[list[Any]], Awaitable[None] | None],
        decode: Callable[[bytes], Any],
        max_batch: int,
        with_subjects: bool,
    ) -> None:
        """Forever: take what `queue` (nats.py's queue of `nsub`) holds, decode it, hand it over."""
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
                    self.drop(sub, m.subject, e)
            sub.delivered += len(out)
            if out:
                await self.call(sub, handler, out)

    def report_pending(self) -> None:
        """Log the troubles counted since their last line (at shutdown)."""
        for key, count in self.limiter.flush().items():
            if isinstance(key, tuple) and key[0] == "drop":
                log.warning("dropped %d more undecodable message(s) on %s", count, key[1])
            elif isinstance(key, tuple) and key[0] == "handler":
                log.error("handler for %s failed %d more time(s)", key[1], count)
            elif isinstance(key, tuple) and key[0] == "reply":
                log.warning("refused to answer %d more request(s) on %s (reply subject not an inbox)", count, key[1])
