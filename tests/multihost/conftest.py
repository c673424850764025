"""Fixtures for the multi-host tests: three Docker engines in network namespaces, one Swarm.

Skipped with the reason when not root, without Docker or `ip`, or without
the control-plane image on this machine's engine (`make images`), unless
DQOES_REQUIRE_DOCKER=1 (then they fail), as in tests/docker. Everything the
engines fixture makes is removed by its finalizer, also when a test fails;
`python3 tests/multihost/engines.py cleanup` removes leftovers of a run that
was killed. Runs take turns: the fixture holds a flock on
/run/lock/dqoes-multihost.lock (the lock file stays, as lock files do).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
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
    with engines.exclusive():
        yield from _cluster()
    left = engines.leftovers()
    assert not left, f"the multi-engine fixture left these behind: {left}"


def _cluster() -> Iterator[engines.Cluster]:
    t0 = time.monotonic()
    try:
        c = engines.Cluster.up(N_ENGINES)
        t1 = time.monotonic()
        c.swarm()
        t2 = time.monotonic()
        c.load_images([IMAGE])
        print(f"multihost: {N_ENGINES} engines in {t1 - t0:.1f} s, swarm in {t2 - t1:.1f} s, "
              f"{IMAGE} loaded into each in {time.monotonic() - t2:.1f} s")
        yield c
    finally:
        t3 = time.monotonic()
        removed = engines.cleanup()
        print(f"multihost: cleanup in {time.monotonic() - t3:.1f} s: {', '.join(removed)}")
