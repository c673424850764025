"""Fixtures for the Docker-specific tests: a real engine, a local image, labelled containers.

No stubs: these talk to the engine on this machine. Without one they are
skipped with the reason, unless DQOES_REQUIRE_DOCKER=1 (then they fail).
The image is DQOES_TEST_IMAGE, default dqoes-base:bookworm, built with
compose/images/build.sh --base-only when missing (nothing can be pulled).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.runtime.docker import DockerRuntime

REPO = Path(__file__).resolve().parents[2]
TEST_LABEL = "dqoes.test"
IDLE = ["python3", "-c", "import time\nwhile True: time.sleep(3600)"]
BUSY = ["python3", "-c", "while True: pass"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes ten seconds or more (e.g. restarts dockerd)")
    config.addinivalue_line(
        "markers", "swarm: initialises a single-node Docker Swarm if none is active (left again after)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def need(reason: str) -> None:
    if os.environ.get("DQOES_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (and DQOES_REQUIRE_DOCKER=1)")
    pytest.skip(f"{reason}; set DQOES_REQUIRE_DOCKER=1 to make this a failure")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure means "no engine"
        need(f"no Docker engine ({str(e)[:160]}); run .ci/install-docker.sh")
    yield client
    client.close()


@pytest.fixture(scope="session")
def test_image(docker_client: Any) -> str:
    import docker

    image = os.environ.get("DQOES_TEST_IMAGE", "dqoes-base:bookworm")
    try:
        docker_client.images.get(image)
        return image
    except docker.errors.ImageNotFound:
        pass
    if image == "dqoes-base:bookworm":
        done = subprocess.run(
            ["bash", str(REPO / "compose/images/build.sh"), "--base-only"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            return image
        need(f"cannot build {image}: {done.stderr.strip()[-300:]}")
    need(f"test image {image} missing")
    raise AssertionError("unreachable")


class Containers:
    """Starts labelled test containers and removes them all afterwards."""

    def __init__(self, client: Any, image: str) -> None:
        self.client = client
        self.image = image
        self.run_id = uuid.uuid4().hex[:12]
        self.prefix = f"dqd-{self.run_id[:6]}-"

    def name(self, what: str) -> str:
        return self.prefix + what

    def run(
        self,
        what: str,
        labels: dict[str, str] | None = None,
        managed: bool = True,
        command: list[str] | None = None,
        **kwargs: Any,
    ) -> Any:
        all_labels = {TEST_LABEL: self.run_id, **(labels or {})}
        if managed:
            all_labels["dqoes.managed"] = "true"
        return self.client.containers.run(
            self.image,
            command or IDLE,
            name=self.name(what),
            labels=all_labels,
            detach=True,
            init=True,
            **kwargs,
        )

    def inspect(self, name: str) -> dict[str, Any]:
        return self.client.api.inspect_container(name)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            for c in self.client.containers.list(
                all=True, filters={"label": f"{TEST_LABEL}={self.run_id}"}
            ):
                with contextlib.suppress(Exception):
                    c.remove(force=True)


@pytest.fixture
def containers(docker_client: Any, test_image: str) -> Iterator[Containers]:
    c = Containers(docker_client, test_image)
    yield c
    c.cleanup()


@pytest.fixture(scope="session")
def workload_image(docker_client: Any) -> str:
    """The torch inference image (DQOES_WORKLOAD_IMAGE, default dqoes-workload:latest)."""
    import docker

    image = os.environ.get("DQOES_WORKLOAD_IMAGE", "dqoes-workload:latest")
    try:
        docker_client.images.get(image)
    except docker.errors.ImageNotFound:
        need(f"image {image} missing; build it with `make images`")
    return image


@pytest.fixture
def workload_containers(docker_client: Any, workload_image: str) -> Iterator[Containers]:
    """Like `containers`, on the inference image."""
    c = Containers(docker_client, workload_image)
    yield c
    c.cleanup()


@pytest.fixture
async def runtime(docker_client: Any) -> AsyncIterator[DockerRuntime]:
    rt = DockerRuntime(node="test-node")
    await rt.start()
    yield rt
    await rt.close()
