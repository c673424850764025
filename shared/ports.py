"""Free TCP ports for the processes a command starts, never the same one twice.

Why: the OS picks a port nothing listens on (a bind to port 0), but the port is free again as soon
as the probe closes, and the next probe may be given it again before the process it was meant for
listens on it. `dqoes up` once handed two workers the same metrics port (29 Nov 2026, the demo): the
second could not listen, exited, and was restarted on the same port every time. Ports are kept in a
set, so that this process never hands out a port twice.
"""

from __future__ import annotations

import socket
import threading

_HANDED: set[int] = set()
_LOCK = threading.Lock()
ATTEMPTS = 200


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, never handed out before by this process (OSError if the OS
    offers none after ATTEMPTS probes)."""
    with _LOCK:
        for _ in range(ATTEMPTS):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED:
                _HANDED.add(port)
                return port
    raise OSError(f"no free port on {host} that was not handed out already ({ATTEMPTS} tries)")


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could not listen on `port` now (something else is bound to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False
