"""Free ports: never the same one twice from one process, and a held port is seen as taken."""

from __future__ import annotations

import socket

from shared.ports import free_port, port_taken


def test_a_port_is_never_handed_out_twice():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_handed_port_can_be_listened_on_and_is_then_taken():
    port = free_port()
    assert not port_taken(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert port_taken(port)
    assert not port_taken(port)
