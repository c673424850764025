"""NATS fixtures shared by every test that needs a real server.

One private nats-server (JetStream on, free port, its own store directory)
is started the first time a test asks for it and serves the whole session;
tests that restart the server get their own, so a restart never disturbs
the others. Nothing here touches port 4222 or any server we did not start.

Async tests use anyio's pytest plugin, as tests/contract does: mark them
`pytest.mark.anyio` (the backend is asyncio).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.natsd import NatsServer


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Every async test runs on asyncio (nats-py needs it; trio is not installed)."""
    return "asyncio"


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """The session's nats-server with JetStream; shared, so never restart or stop it."""
    base: Path = tmp_path_factory.mktemp("nats")
    with NatsServer(store_dir=base / "store", log_path=base / "nats-server.log") as srv:
        yield srv


@pytest.fixture(scope="session")
def nats_url(nats_server: NatsServer) -> str:
    """URL of the session's server, e.g. nats://127.0.0.1:41234."""
    return nats_server.url


@pytest.fixture
def restartable_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A started nats-server of this test's own, with JetStream in tmp_path/store.

    `restartable_nats.restart()` (or stop() then start()) brings it back on
    the same port and store directory; it is stopped when the test ends.
    """
    with NatsServer(store_dir=tmp_path / "store", log_path=tmp_path / "nats-server.log") as srv:
        yield srv
