"""Opening and keeping a NATS connection: credentials, TLS that is really TLS, one line per event.

Why: what a connection sends before anything else decides who may read it.
The identity comes from `creds` or the URL (`shared.auth`), replies come to
the identity's own inbox prefix, and a `tls://` URL never sends CONNECT in
the clear, even when the server (or a squatter on its port) offers no TLS:
nats-py upgrades only when the server asks, so the check is made here.
Once connected, `Events` turns what nats-py reports into one line per
disconnect and reconnect and keeps the cause of a failed connect.
`shared.bus.core` uses these to build a `Bus`.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient

from shared import auth
from shared.bus.errors import BusError, TLSRequired, one_line
from shared.ratelog import RateLimiter

log = logging.getLogger("shared.bus")  # one logger for the whole bus: operators and tests filter on it

CONNECTION_LOST = (OSError, nats.errors.UnexpectedEOF, nats.errors.StaleConnectionError)
"""Errors that mean the connection went: reported once, by the disconnect line."""


class TLSRequiredAgain(nats.errors.Error):
    """TLSRequired on a reconnect: nats-py logs it and tries again."""


class Client(NatsClient):
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
                raise TLSRequiredAgain(text)
            raise TLSRequired(text)
        return super()._connect_command()

    def _is_tls(self) -> bool:
        writer = getattr(self._transport, "_io_writer", None)
        return writer is not None and writer.get_extra_info("ssl_object") is not None


def credentials(
    url: str,
    creds: str | os.PathLike[str] | auth.Credentials | None,
    inbox_prefix: str | None,
) -> tuple[str, auth.Credentials | None, dict[str, Any]]:
    """The server URL(s) without credentials, the identity, and nats-py's key options.

    The identity is `creds` (a file or loaded `auth.Credentials`), else the
    file the URL names (`?creds=PATH`), else none (anonymous: `inbox_prefix`
    then says where its replies come). BusError (one line) for a bad URL or
    credentials file.
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
    return server_url, identity, key_options


async def close_quietly(nc: NatsClient) -> None:
    """Close `nc` if it is open; a failure to close is only a debug line."""
    if nc.is_closed:
        return
    try:
        await nc.close()
    except Exception as e:
        log.debug("closing NATS connection: %r", e)


def server_of(nc: NatsClient) -> str | None:
    """host:port of the server `nc` uses now (one of a cluster's), None while down."""
    where = nc.connected_url if nc.is_connected else None
    return f"{where.hostname}:{where.port}" if where is not None else None


@dataclass(eq=False)
class Events:
    """nats-py's callbacks for one connection: its log lines, its last error, the server's refusals."""

    nc: NatsClient
    name: str
    url: str
    reconnect_wait_s: float
    limiter: RateLimiter
    log_every_s: float
    closing: bool = False
    """Set once the bus closes: what nats-py reports then is expected."""
    last_error: BaseException | None = None
    refused: BaseException | None = None
    """The server's refusal (authorization) if one came while connecting: the cause of what follows."""
    permission_violations: deque[str] = field(default_factory=lambda: deque(maxlen=100))
    """The server's refusals of this identity's publishes and subscriptions (newest last)."""

    async def on_error(self, e: Exception) -> None:
        self.last_error = e
        if "authorization" in str(e).lower():
            self.refused = e
        if "permissions violation" in str(e).lower():
            self.permission_violations.append(one_line(e))
        if self.closing or not self.nc.is_connected or isinstance(e, CONNECTION_LOST):
            # A lost connection is reported once, by the disconnect line.
            log.debug("NATS error while (dis)connecting: %r", e)
            return
        count = self.limiter.hit(("nats-error", type(e).__name__))
        if count is not None:
            log.warning("NATS error (%d in the last %g s): %s", count, self.log_every_s, one_line(e))

    async def on_disconnected(self) -> None:
        if not self.closing:
            why = f" ({one_line(self.last_error)})" if self.last_error else ""
            log.warning(
                "disconnected from NATS at %s%s; reconnecting every %g s",
                self.url,
                why,
                self.reconnect_wait_s,
            )

    async def on_reconnected(self) -> None:
        self.last_error = None
        log.info("reconnected to NATS at %s (server %s)", self.url, server_of(self.nc))

    async def on_closed(self) -> None:
        log.debug("NATS connection of %s closed", self.name)
