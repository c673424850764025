"""The bus's errors and their one-line wording.

Why: services catch bus failures without importing nats, and an operator
reads each failure as one line. Every NATS exception the bus meets is turned
into one of these classes here, with the text `one_line` makes of it.
"""

from __future__ import annotations


class BusError(Exception):
    """A bus operation failed (not connected, server gone, JetStream missing); one line."""


class NoJetStream(BusError):
    """The server has no JetStream: waiting will not help."""


class RequestTimeout(BusError, TimeoutError):
    """A request got no reply in time."""


class NoResponders(BusError):
    """A request went to a subject nobody serves."""


class TLSRequired(BusError):
    """The URL says tls:// and the server offers no TLS: nothing was sent to it."""


def one_line(e: BaseException) -> str:
    """`e` as one line of at most 300 characters that names its type."""
    text = str(e).strip() or type(e).__name__
    if type(e).__name__ not in text:
        text = f"{type(e).__name__}: {text}"
    return " ".join(text.split())[:300]
