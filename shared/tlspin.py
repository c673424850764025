"""A control plane's CA, pinned by its digest: what `dqoes join` checks before it sends anything.

Why: a node joining over the network must know it reached the real control
plane before it sends its join request, and from then on every latency
event, objective and limit must travel encrypted. `docker swarm join` gets
both from its token, which carries the digest of the manager's CA; so does
DQoES: a join token made while the control plane serves TLS carries the
SHA-256 of its CA certificate (DER), shared/joining.py. The node opens a
TCP connection, reads the server's INFO (sent in clear by every NATS server
before TLS), makes a TLS handshake that verifies nothing and only collects
the chain the server shows, closes it, and keeps the certificate of that
chain whose digest is the token's (`pinned_ca`). Nothing of the node's
crosses that connection but the TLS hello. Every later connection (the join
request, the worker's) is TLS verified against that CA alone, host name
included (`shared.auth.with_tls_ca`).

The server must show its CA in its chain: the control plane gives
nats-server its certificate followed by the CA (services/cli/cptls.py).
Python 3.11 and 3.12 reach the unverified chain through the SSL object's
`get_unverified_chain` (public on SSLSocket from 3.13).

Standard library only; sockets but no NATS client.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import ssl
from typing import Any

DIGEST_LEN = 64
"""Hex characters of a SHA-256 digest."""

_PEM_RE = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


class PinError(ValueError):
    """The server's CA cannot be read or is not the pinned one; one line."""


class Mismatch(PinError):
    """The server shows no certificate with the pinned digest: not the control plane the token is for."""


def digest(der: bytes) -> str:
    """SHA-256 (hex) of a certificate in DER form."""
    return hashlib.sha256(der).hexdigest()


def certificates(pem: str) -> list[bytes]:
    """The certificates of a PEM text, DER each, in order."""
    return [ssl.PEM_cert_to_DER_cert(m.group(0)) for m in _PEM_RE.finditer(pem)]


def pem_digest(pem: str) -> str:
    """The digest of the first certificate of a PEM text (a CA file); PinError if it has none."""
    certs = certificates(pem)
    if not certs:
        raise PinError("no PEM certificate in the CA file")
    return digest(certs[0])


def _chain_of(conn: ssl.SSLSocket) -> list[bytes]:
    public = getattr(conn, "get_unverified_chain", None)
    if public is not None:  # Python 3.13+
        return [bytes(c) for c in public()]
    chain: Any = conn._sslobj.get_unverified_chain()  # type: ignore[attr-defined]
    return [c.public_bytes(ssl._ssl.ENCODING_DER) for c in (chain or [])]  # type: ignore[attr-defined]


def server_chain(host: str, port: int, timeout_s: float = 5.0) -> list[bytes]:
    """The certificates (DER) a NATS server at host:port shows in its TLS handshake, unverified.
    PinError (one line) when it cannot be reached, speaks no NATS or offers no TLS."""
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            line = b""
            while not line.endswith(b"\r\n") and len(line) < 65536:
                chunk = raw.recv(1)
                if not chunk:
                    break
                line += chunk
            if not line.startswith(b"INFO "):
                raise PinError(f"{where} is not a NATS server (it sent no INFO)")
            try:
                info = json.loads(line[5:])
            except ValueError:
                raise PinError(f"{where} sent an unreadable INFO") from None
            if not (isinstance(info, dict) and (info.get("tls_required") or info.get("tls_available"))):
                raise PinError(f"the server at {where} offers no TLS, so it cannot show the CA the token pins")
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE  # only to read the chain; nothing is sent over this connection
            with ctx.wrap_socket(raw, server_hostname=host) as conn:
                return _chain_of(conn)
    except (OSError, ssl.SSLError) as e:
        raise PinError(f"cannot read the TLS certificates of {where}: {getattr(e, 'strerror', None) or e}") from None


def pinned_ca(host: str, port: int, want: str, timeout_s: float = 5.0) -> str:
    """The CA certificate (PEM) the server at host:port shows whose digest is `want`; PinError (one
    line) if none of its chain has that digest (another server, or the control plane's CA changed)."""
    for der in server_chain(host, port, timeout_s):
        if digest(der) == want.lower():
            return ssl.DER_cert_to_PEM_cert(der)
    raise Mismatch(f"the server at {host}:{port} is not the control plane the token was made for: no "
                   f"certificate it shows has the token's CA digest {want[:16]}...; nothing was sent to it")
