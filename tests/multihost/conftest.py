"""Fixtures for the multi-host tests: three Docker engines in network namespaces, one Swarm.

Skipped with the reason when not root, without Docker or `ip`, or without
the control-plane image on this machine's engine (`make images`), unless
DQOES_REQUIRE_DOCKER=1 (then they fail), as in tests/docker. Everything the
engines fixture makes is removed by its finalizer, also when a test fails;
`python3 tests/multihost/engines.py cleanup` removes leftovers of a run that
was killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import engines  # noqa: E402 (the directory is no package: tests/ has no __init__)

IMAGE = os.environ.get("DQOES_IMAGE", "dqoes:latest")
N_ENGINES = int(os.environ.get("DQOES_MULTIHOST_ENGINES", "3"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.docker)


def need(reason: str) -> None:
    if os.environ.get("DQOES_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (and DQOES_REQUIRE_DOCKER=1)")
    pytest.skip(f"{reason}; set DQOES_REQUIRE_DOCKER=1 to make this a failure")


@pytest.fixture(scope="module")
def cluster() -> Iterator[engines.Cluster]:
    """N engines (default 3) joined into one Swarm, the control-plane image loaded into each."""
    why = engines.preflight()
    if why:
        need(why)
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        need("no Docker engine on this machine (run .ci/install-docker.sh)")
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        need(f"image {IMAGE} missing on this machine's engine; build it with `make images`")
    try:
        c = engines.Cluster.up(N_ENGINES)
        c.swarm()
        c.load_images([IMAGE])
        yield c
    finally:
        engines.cleanup()
    left = engines.leftovers()
    assert not left, f"the multi-engine fixture left these behind: {left}"
