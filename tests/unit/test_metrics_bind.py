"""Where /metrics listens: loopback unless told, for the manager and the worker alike.

The pages name every container and its objective, so a service started by
hand must not serve them to the network. Each check binds a real socket
and connects to it: 127.0.0.2 is the same machine's loopback device but
not the address 127.0.0.1, so a server bound to 127.0.0.1 refuses it while
one bound to every interface (0.0.0.0) answers.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from services.manager.__main__ import parse as parse_manager
from services.manager.app import ManagerConfig
from services.worker.__main__ import parse as parse_worker
from services.worker.app import WorkerConfig
from shared.metrics import MetricsServer

WORKER_ARGS = ["--scenario", "paper-varied", "--metrics-port", "0"]


def answers(host: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=3) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def served() -> Iterator[list[MetricsServer]]:
    servers: list[MetricsServer] = []
    yield servers
    for s in servers:
        s.stop()


def serve(servers: list[MetricsServer], port: int, addr: str | None) -> tuple[str, int]:
    """Start a real /metrics server as the services do; (the URL it reports, its port)."""
    s = MetricsServer()
    servers.append(s)
    url = s.start(port) if addr is None else s.start(port, addr)
    assert s.port is not None
    return url, s.port


@pytest.fixture(autouse=True)
def _no_metrics_env(monkeypatch) -> None:
    monkeypatch.delenv("DQOES_METRICS_ADDR", raising=False)
    monkeypatch.delenv("DQOES_METRICS_PORT", raising=False)


def test_both_services_listen_on_loopback_unless_told(served):
    manager, worker = parse_manager(["--metrics-port", "0"]), parse_worker(WORKER_ARGS)
    assert manager.metrics_addr == worker.metrics_addr == "127.0.0.1"
    assert ManagerConfig().metrics_addr == WorkerConfig(node="n").metrics_addr == "127.0.0.1"
    for cfg in (manager, worker):
        assert cfg.metrics_port == 0
        url, port = serve(served, cfg.metrics_port, cfg.metrics_addr)
        assert url == f"http://127.0.0.1:{port}/metrics"
        assert answers("127.0.0.1", port)
        assert not answers("127.0.0.2", port)  # not on any other address, even of this machine
    _, port = serve(served, 0, None)  # the server's own default is the same
    assert answers("127.0.0.1", port) and not answers("127.0.0.2", port)


def test_the_flag_and_the_environment_open_it_up(served, monkeypatch):
    assert parse_manager(["--metrics-port", "0", "--metrics-addr", "0.0.0.0"]).metrics_addr == "0.0.0.0"
    monkeypatch.setenv("DQOES_METRICS_ADDR", "0.0.0.0")
    manager, worker = parse_manager(["--metrics-port", "0"]), parse_worker(WORKER_ARGS)
    assert manager.metrics_addr == worker.metrics_addr == "0.0.0.0"
    assert parse_worker([*WORKER_ARGS, "--metrics-addr", "127.0.0.1"]).metrics_addr == "127.0.0.1"  # flag wins
    _, port = serve(served, 0, worker.metrics_addr)
    assert answers("127.0.0.1", port) and answers("127.0.0.2", port)
