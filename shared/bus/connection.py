"""Opening a NATS connection safely: credentials, inbox prefix, TLS that is really TLS.

Why: what a connection sends before anything else decides who may read it.
The identity comes from `creds` or the URL (`shared.auth`), replies come to
the identity's own inbox prefix, and a `tls://` URL never sends CONNECT in
the clear, even when the server (or a squatter on its port) offers no TLS:
nats-py upgrades only when the server asks, so the check is made here.
`shared.bus.core` uses these to build a `Bus`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient

from shared import auth
from shared.bus.errors import BusError, TLSRequired

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
    return server_url, identity, key_options


async def close_quietly(nc: NatsClient) -> None:
    """Close `nc` if it is open; a failure to close is only a debug line."""
    if nc.is_closed:
        return
    try:
        await nc.close()
    except Exception as e:
        log.debug("closing NATS connection: %r", e)
