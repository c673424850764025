"""A listening front for a supervised nats-server: the port clients know never falls free.

Why: when the supervised nats-server dies, its port is free until the
supervisor starts it again. Another local process can take it within
milliseconds and receive every service's CONNECT on reconnect (with
passwords, the secrets themselves). Restarting "on the same port" cannot be
made safe, and nats-server cannot inherit a listening socket. So the
supervisor owns the port: `NatsFront` listens on the URL the services and
clients are given, for as long as the supervisor lives, and forwards each
connection to the server it supervises, which listens on a private port.

Before forwarding it verifies that the process listening on that private
port is its own child: the listening socket's inode, from /proc/net/tcp,
must be one of the child's open files (/proc/<pid>/fd), checked before and
after connecting (so a server that died in between and a stranger that took
its port are both caught). While no verified server is there (dead, being
restarted, or a stranger holds the private port) a new connection waits, up
to `wait_s`, and is closed unforwarded: the client has sent nothing (NATS
clients speak after the server's INFO) and retries. A stranger that takes
the private port gets no connection; the supervisor restarts the server on
a fresh port (`NatsServer.release_port`).

Bytes are moved with splice(2) by two threads per connection (no copy
through Python; the GIL is released while they wait). Linux only, IPv4: the
supervised server listens on 127.0.0.1; the front on loopback too, or, for a
control plane that nodes on other hosts reach (services/cli/serve.py), on
the address it is given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Upstream = Callable[[], "tuple[int, int] | None"]
"""Where the supervised server is now: (private port, its pid), or None while it is down."""

_LISTEN = "0A"
_CHUNK = 1 << 16


def _listening_inodes(port: int, host: str = "127.0.0.1") -> set[str]:
    """Inodes of IPv4 sockets listening on host:port (or on 0.0.0.0:port)."""
    want = {f"{_hex_addr(host)}:{port:04X}", f"00000000:{port:04X}"}
    out = set()
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if len(fields) > 9 and fields[1] in want and fields[3] == _LISTEN:
                    out.add(fields[9])
    except OSError:
        pass
    return out


def _hex_addr(host: str) -> str:
    return socket.inet_aton(host)[::-1].hex().upper()


def owned_listener(port: int, pid: int, host: str = "127.0.0.1") -> str | None:
    """The inode of the socket listening on host:port if process `pid` holds it, else None."""
    inodes = _listening_inodes(port, host)
    if not inodes:
        return None
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return target[8:-1]
    return None


class NatsFront:
    """Listens on host:port (0: a free one) and forwards to the verified upstream. `start()`, `close()`."""

    def __init__(self, upstream: Upstream, host: str = "127.0.0.1", port: int = 0, wait_s: float = 10.0,
                 upstream_host: str | None = None) -> None:
        """`host`: where clients connect (a control plane's may be 0.0.0.0 or a public address);
        `upstream_host`: where the supervised server listens (default: `host`)."""
        self.upstream = upstream
        self.host = host
        self.upstream_host = upstream_host or host
        self.wait_s = wait_s
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.refused = 0
        """Connections closed unforwarded: no verified server within `wait_s`."""

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> NatsFront:
        self._sock.listen(128)
        threading.Thread(target=self._accept, name="nats-front", daemon=True).start()
        return self

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            for c in list(self._conns):
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="nats-front-conn", daemon=True).start()

    def _connect_verified(self) -> socket.socket | None:
        """A connection to the supervised server, verified as its (module doc); None after wait_s."""
        deadline = time.monotonic() + self.wait_s
        while not self._closed.is_set() and time.monotonic() < deadline:
            where = self.upstream()
            if where is not None:
                port, pid = where
                before = owned_listener(port, pid, self.upstream_host)
                if before is not None:
                    up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    try:
                        up.connect((self.upstream_host, port))
                        if owned_listener(port, pid, self.upstream_host) == before:
                            return up
                    except OSError:
                        pass
                    up.close()
            time.sleep(0.05)
        return None

    def _serve(self, client: socket.socket) -> None:
        up = self._connect_verified()
        if up is None:
            self.refused += 1
            client.close()
            return
        for s in (client, up):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._conns |= {client, up}
        t = threading.Thread(target=_pump, args=(up, client), name="nats-front-down", daemon=True)
        t.start()
        _pump(client, up)
        t.join()
        with self._lock:
            self._conns -= {client, up}
        client.close()
        up.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes src -> dst until either end closes; then close both directions."""
    r, w = os.pipe()
    try:
        while True:
            n = os.splice(src.fileno(), w, _CHUNK)
            if n == 0:
                break
            while n > 0:
                n -= os.splice(r, dst.fileno(), n)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
        for s in (src, dst):  # one side gone: the whole connection goes (as a direct one would)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
