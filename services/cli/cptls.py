"""TLS for the control plane's client connections: the certificate, the CA its join tokens pin.

Why: between hosts every latency event, objective and limit crosses the
network, and a node must know it reached the real control plane (nkeys
prove who a client is, not who the server is). With TLS on, nats-server
takes client connections only over TLS, its certificate chained to a CA
whose SHA-256 every join token made meanwhile carries (shared/tlspin.py):
`dqoes join` checks it before it sends anything and keeps the CA, and the
node's worker connects with `tls://` URLs verified against it alone.

When it is on (`tls`, hostconfig.py): by default whenever NATS listens on
an address other hosts can reach (`listen` not a loopback address), so a
control plane that nodes join over a network is encrypted and
authenticated without a step to forget; on loopback (the default `listen`,
one host) it stays off, as nothing crosses a network, so a single-host
`serve control-plane` and `dqoes up` (which never runs this role) keep
plain `nats://` URLs. `tls = true` forces it on, `tls = false` off (a
network already encrypted below, such as WireGuard or an encrypted Swarm
overlay; the role then says the traffic is in clear).

Which certificate: `tls_cert`, `tls_key` and `tls_ca` when given (a CA of the
site's, the certificate naming every address nodes use); on a member of a
control plane spread over hosts, else the route certificate
(`cluster_tls_*`), whose CA every member shares, so a node's pinned CA holds
at every member; else, on a single control plane, a private CA made once in
the state directory's tls/ (EC P-256 by openssl, the key 0600, kept so
tokens stay good across restarts) and a server certificate signed by it at
every start, naming 127.0.0.1, localhost, the host's names and interface
addresses, the `listen` and `advertise` hosts and `tls_names`. The
generated CA signs nothing else. nats-server gets the certificate followed
by the CA, so a joining node is shown the CA it pins.

The control plane's own processes (manager, registrar, the CLI through the
pointer file) connect over TLS too, with `?ca=` in their URL
(shared/auth.py): nats-server has one client port, TLS for all.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from services.cli import cpcluster
from services.cli.common import CliError, state_field
from shared import authfiles, tlspin

TLS_DIR = "tls"
STATE_NAME = "tls.json"
"""In the control plane's directory while it serves TLS: its CA file and digest, for `dqoes join-token create`."""
CONFIG_NAME = "nats-tls.conf"
HANDSHAKE_TIMEOUT_S = 5.0
"""nats-server's TLS handshake limit (its default, 0.5 s, is short for a loaded host)."""
SERVER_DAYS = 825
CA_DAYS = 3650
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True, slots=True)
class ClientTls:
    chain: Path
    """The server certificate followed by the CA (what nats-server shows)."""
    key: Path
    ca: Path
    digest: str
    """SHA-256 (hex) of the CA certificate (DER): what join tokens pin."""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def enabled(cfg: dict[str, Any]) -> bool:
    """`tls` when set, else on whenever NATS listens where other hosts reach it."""
    if cfg.get("tls") is not None:
        return bool(cfg["tls"])
    return not _loopback(str(cfg.get("listen") or "0.0.0.0"))


def _given(cfg: dict[str, Any], keys: tuple[str, str, str]) -> tuple[Path, Path, Path] | None:
    given = [cfg.get(k) for k in keys]
    if not any(given):
        return None
    if not all(given):
        raise CliError(f"control plane: client TLS needs all of {', '.join(keys)}")
    paths = tuple(Path(str(g)).resolve() for g in given)
    for key, path in zip(keys, paths, strict=True):
        if not path.is_file():
            raise CliError(f"control plane: {key}: {path} is not a readable file")
    if paths[1].stat().st_mode & 0o077:
        raise CliError(f"control plane: {keys[1]}: {paths[1]} is readable by others (chmod 600 it)")
    return paths[0], paths[1], paths[2]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise CliError(f"control plane: {path}: {e.strerror or e}") from None


def setup(root: Path, cfg: dict[str, Any]) -> ClientTls | None:
    """The control plane's client TLS (files ready), None when off; CliError (one line) otherwise."""
    if not enabled(cfg):
        (root / STATE_NAME).unlink(missing_ok=True)
        return None
    try:
        d = authfiles.secure_dir(root / TLS_DIR)
    except authfiles.UnsafePathError as e:
        raise CliError(str(e)) from None
    files = _given(cfg, ("tls_cert", "tls_key", "tls_ca"))
    if files is None and cpcluster.clustered(cfg):
        files = _given(cfg, ("cluster_tls_cert", "cluster_tls_key", "cluster_tls_ca"))
        if files is None:
            raise CliError("control plane: TLS for clients on a member of several needs one CA on every member: "
                           "give tls_cert, tls_key, tls_ca (or cluster_tls_*, used for clients too), or tls = false")
    if files is None:
        files = _generate(d, names(cfg))
    cert, key, ca = files
    ca_pem = _read(ca)
    try:
        digest = tlspin.pem_digest(ca_pem)
    except tlspin.PinError as e:
        raise CliError(f"control plane: {ca}: {e}") from None
    cert_pem = _read(cert)
    chain = d / "server-chain.pem"
    shown = cert_pem if digest in {tlspin.digest(c) for c in tlspin.certificates(cert_pem)} else (
        cert_pem.rstrip("\n") + "\n" + ca_pem)
    authfiles.write_private(chain, shown)
    out = ClientTls(chain, key, ca, digest)
    authfiles.write_private(root / STATE_NAME, json.dumps({"ca": str(ca), "sha256": digest}) + "\n")
    return out


def pinned_digest(root: Path) -> str | None:
    """The CA digest of the control plane at `root` while it serves TLS (its last start), else None."""
    return state_field(root / STATE_NAME, "sha256")


def config_block(tls: ClientTls) -> str:
    return (f"tls {{ cert_file: {json.dumps(str(tls.chain))}, key_file: {json.dumps(str(tls.key))}, "
            f"timeout: {HANDSHAKE_TIMEOUT_S:g} }}\n")


def write_config(root: Path, base: Path, tls: ClientTls) -> Path:
    """A nats-server config: `base` (the authorization, or a member's whole config) and the TLS block."""
    path = root / CONFIG_NAME
    include = base.resolve().relative_to(root.resolve()) if base.resolve().is_relative_to(root.resolve()) \
        else base.resolve()
    authfiles.write_private(path, "# Generated by DQoES (services/cli/cptls.py): client connections over TLS.\n"
                            f"include {json.dumps(str(include))}\n" + config_block(tls))
    return path


# --- a private CA and a server certificate (openssl) ---------------------------------------------


def _interface_addresses() -> list[str]:
    """The IPv4 address of each network interface (SIOCGIFADDR), best effort."""
    out = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
                out.append(socket.inet_ntoa(packed[20:24]))
    return out


def names(cfg: dict[str, Any]) -> list[str]:
    """What the generated server certificate names: loopback, the host's names and addresses, the
    listen and advertise hosts, `tls_names` (comma-separated)."""
    host = socket.gethostname()
    found = ["127.0.0.1", "localhost", host, socket.getfqdn(host), *_interface_addresses()]
    if cfg.get("listen") and cfg["listen"] not in ("0.0.0.0", ""):
        found.append(cfg["listen"])
    for url in str(cfg.get("advertise") or "").split(","):
        if url.strip():
            found.append(urlsplit(url.strip()).hostname or "")
    found += [n.strip() for n in str(cfg.get("tls_names") or "").split(",")]
    out: list[str] = []
    for n in found:
        if n and n not in out:
            out.append(n)
    return out


def _san(entries: list[str]) -> str:
    parts = []
    for n in entries:
        try:
            ipaddress.ip_address(n)
            parts.append(f"IP:{n}")
        except ValueError:
            parts.append(f"DNS:{n}")
    return ",".join(parts)


def _generate(d: Path, entries: list[str]) -> tuple[Path, Path, Path]:
    """The private CA in `d` (made once) and a server certificate for `entries` signed by it (made at
    every start, so a changed name is taken in)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise CliError("control plane: TLS needs openssl to make its CA (or give tls_cert, tls_key, tls_ca)")

    def run(*argv: str) -> None:
        r = subprocess.run([openssl, *argv], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            raise CliError(f"control plane: openssl {argv[0]} failed: {tail}")

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca, ca_key = d / "ca.pem", d / "ca.key"
    if not (ca.is_file() and ca_key.is_file()):
        run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", str(CA_DAYS),
            "-subj", f"/CN=DQoES control plane CA ({entries[2] if len(entries) > 2 else 'local'})",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        ca_key.chmod(0o600)
    (d / "server.ext").write_text(f"subjectAltName={_san(entries)}\nbasicConstraints=critical,CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                                  "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    run("req", *ec, "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"), "-subj", "/CN=dqoes-control-plane")
    (d / "server.key").chmod(0o600)
    run("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(ca), "-CAkey", str(ca_key), "-set_serial",
        str(int.from_bytes(os.urandom(8), "big")), "-out", str(d / "server.pem"), "-days", str(SERVER_DAYS),
        "-extfile", str(d / "server.ext"))
    for name in ("server.csr", "server.ext"):
        (d / name).unlink(missing_ok=True)
    for path in (ca, ca_key, d / "server.pem", d / "server.key"):
        path.chmod(0o600)
    return d / "server.pem", d / "server.key", ca
