"""NATS fixtures shared by every test that needs a real server.

One private nats-server (JetStream on, free port, its own store directory)
is started the first time a test asks for it and serves the whole session;
tests that restart the server get their own, so a restart never disturbs
the others. Nothing here touches port 4222 or any server we did not start.

Every server here runs with the project's authentication on: the users and
permissions `shared.auth` generates for a deployment (roles for nodes
`TEST_NODES`), plus one test-only user allowed every subject, whose URL is
what `nats_url` and `restartable_nats.url` give (so tests that play several
parts at once, like a fake worker and a client, can). Role tests connect as
the real identities (`nats_auth` is their credentials directory);
tests/integration/test_auth.py also starts a server with exactly the default
configuration, without the test user.

Async tests use anyio's pytest plugin, as tests/contract does: mark them
`pytest.mark.anyio` (the backend is asyncio).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared import auth
from shared.natsd import NatsServer
from shared.runtime import cgroupfs

TEST_NODES = ("n1", "n2", "worker-1", "worker-2")
"""Nodes the session's server has worker and inference identities for."""

TEST_USER = "test"


def test_identity() -> auth.Identity:
    """The test suite's user: may publish and subscribe anything (never in a deployment)."""
    return auth.Identity(TEST_USER, "test", None, auth.Permissions(publish=(">",), subscribe=(">",)))


def make_auth_dir(directory: Path, nodes: tuple[str, ...] = TEST_NODES) -> Path:
    auth.ensure(directory, nodes, extra=[test_identity()])
    return directory


class AuthNatsServer(NatsServer):
    """A NatsServer with the project's auth config whose `url` carries the test user's password."""

    def __init__(self, auth_dir: Path, **kw: object) -> None:
        super().__init__(config_file=auth.config_path(auth_dir), **kw)  # type: ignore[arg-type]
        self.auth_dir = auth_dir

    @property
    def plain_url(self) -> str:
        return super().url

    @property
    def url(self) -> str:
        return self.url_as(TEST_USER)

    def url_as(self, identity: str) -> str:
        """The URL with the credentials of `identity` (`client`, `worker-n1`, ...)."""
        return auth.with_credentials(super().url, auth.load(auth.creds_path(self.auth_dir, identity)))


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Every async test runs on asyncio (nats-py needs it; trio is not installed)."""
    return "asyncio"


@pytest.fixture(scope="session")
def nats_auth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session server's credentials directory (every role's `<identity>.creds`)."""
    return make_auth_dir(tmp_path_factory.mktemp("nats-auth") / "auth")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory, nats_auth: Path) -> Iterator[AuthNatsServer]:
    """The session's nats-server with JetStream; shared, so never restart or stop it."""
    base: Path = tmp_path_factory.mktemp("nats")
    with AuthNatsServer(nats_auth, store_dir=base / "store", log_path=base / "nats-server.log") as srv:
        yield srv


@pytest.fixture(scope="session")
def nats_url(nats_server: AuthNatsServer) -> str:
    """URL of the session's server as the test user, e.g. nats://test:...@127.0.0.1:41234."""
    return nats_server.url


@pytest.fixture
def restartable_nats(tmp_path: Path) -> Iterator[AuthNatsServer]:
    """A started nats-server of this test's own, with JetStream in tmp_path/store.

    `restartable_nats.restart()` (or stop() then start()) brings it back on
    the same port and store directory; it is stopped when the test ends.
    """
    auth_dir = make_auth_dir(tmp_path / "auth")
    with AuthNatsServer(auth_dir, store_dir=tmp_path / "store", log_path=tmp_path / "nats-server.log") as srv:
        yield srv


@pytest.fixture
def cgroup_root() -> Path:
    """The cgroup filesystem, for tests that run real torch processes in cgroups.

    Skips where torch, root or a cgroup cpu controller is missing; fails
    instead when DQOES_REQUIRE_CGROUP=1 (CI), so a missing part is never hidden.
    """

    def need(reason: str) -> None:
        if os.environ.get("DQOES_REQUIRE_CGROUP") == "1":
            pytest.fail(f"{reason} (and DQOES_REQUIRE_CGROUP=1)")
        pytest.skip(f"{reason}; set DQOES_REQUIRE_CGROUP=1 to make this a failure")

    if importlib.util.find_spec("torch") is None:
        need("torch is not installed")
    if os.geteuid() != 0:
        need("not root: cannot create cgroups")
    try:
        cgroupfs.detect_layout(cgroupfs.DEFAULT_ROOT)
    except OSError as e:
        need(f"no cgroup cpu controller: {e}")
    return cgroupfs.DEFAULT_ROOT


@pytest.fixture
def policies_made(monkeypatch) -> list:
    """Every policy instance the simulator builds during the test, in order (one per node a run)."""
    from shared.sim import engine

    made: list = []
    orig = engine.make_policy

    def spy(name, scenario, context=None):
        p = orig(name, scenario, context)
        made.append(p)
        return p

    monkeypatch.setattr(engine, "make_policy", spy)
    return made
