"""Fixtures for the Runtime contract suite: one harness per implementation.

Each harness wraps a started runtime plus what a test needs to act on the
world around it (start and stop a managed workload, start an unmanaged one,
read the limit straight from the kernel), so the tests in
test_runtime_contract.py say only what every runtime must do.

Real engines only: the docker harness talks to the Docker engine on this
machine, the cgroup harness writes the real cgroup tree. When one is not
available its tests are skipped with the reason, unless the environment
demands it (DQOES_REQUIRE_DOCKER=1, DQOES_REQUIRE_CGROUP=1), then they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from shared.runtime import cgroupfs
from shared.runtime.base import (
    ALPHA_LABEL,
    MANAGED_LABEL,
    MODEL_LABEL,
    OBJECTIVE_LABEL,
    Runtime,
    RuntimeFailure,
)

REPO = Path(__file__).resolve().parents[2]
TEST_LABEL = "dqoes.test"
"""Every container a test starts carries this, so cleanup finds them all."""
BUSY = "while True: pass"
IDLE = "import time\nwhile True: time.sleep(3600)"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def need(env_var: str, reason: str) -> None:
    """Skip with `reason`, or fail when env_var=1 says this environment must have it."""
    if os.environ.get(env_var) == "1":
        pytest.fail(f"{reason} (and {env_var}=1)")
    pytest.skip(f"{reason}; set {env_var}=1 to make this a failure")


class Harness:
    """What a contract test drives; one subclass per runtime.

    Workloads are named by the test (use `unique()`); "managed" ones are
    what the runtime must see, "unmanaged" ones what it must leave alone.
    """

    kind: str
    runtime: Runtime
    owns_workloads: bool = False
    """True when close() ends the workloads (cgroup); False when they outlive it (docker)."""

    def __init__(self) -> None:
        self.prefix = f"dqt-{uuid.uuid4().hex[:6]}-"

    def unique(self, what: str) -> str:
        return self.prefix + what

    async def start_managed(
        self,
        name: str,
        busy: bool = False,
        objective_s: float | None = None,
        alpha: float | None = None,
        model: str | None = None,
    ) -> None:
        raise NotImplementedError

    async def start_unmanaged(self, name: str, busy: bool = False) -> None:
        raise NotImplementedError

    async def stop(self, name: str) -> None:
        raise NotImplementedError

    async def is_running(self, name: str) -> bool:
        raise NotImplementedError

    async def kernel_limit_cores(self, name: str) -> float | None:
        """The quota the kernel enforces on a workload, in cores (None: unlimited)."""
        raise NotImplementedError

    async def limit_state(self, name: str) -> Any:
        """Everything about a workload's CPU settings, for before/after comparisons."""
        raise NotImplementedError


# ---- docker ------------------------------------------------------------------


def docker_client_or_skip() -> Any:
    import docker

    try:
        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - any failure means "no engine"
        need(
            "DQOES_REQUIRE_DOCKER",
            f"no Docker engine ({str(e)[:160]}); run .ci/install-docker.sh",
        )


def docker_test_image(client: Any) -> str:
    """The image test containers run: DQOES_TEST_IMAGE, default dqoes-base:bookworm (built if missing)."""
    import docker

    image = os.environ.get("DQOES_TEST_IMAGE", "dqoes-base:bookworm")
    try:
        client.images.get(image)
        return image
    except docker.errors.ImageNotFound:
        pass
    if image == "dqoes-base:bookworm":
        # No registry: make it (about 1 min the first time, cached afterwards).
        done = subprocess.run(
            ["bash", str(REPO / "compose/images/build.sh"), "--base-only"],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            return image
        need("DQOES_REQUIRE_DOCKER", f"cannot build {image}: {done.stderr.strip()[-300:]}")
    need("DQOES_REQUIRE_DOCKER", f"test image {image} missing")
    raise AssertionError("unreachable")


class DockerHarness(Harness):
    kind = "docker"

    def __init__(self, client: Any, image: str) -> None:
        super().__init__()
        self.client = client
        self.image = image
        self.run_id = uuid.uuid4().hex[:12]

    async def _run(self, name: str, managed: bool, busy: bool, labels: dict[str, str]) -> None:
        all_labels = {TEST_LABEL: self.run_id, **labels}
        if managed:
            all_labels[MANAGED_LABEL] = "true"
        await asyncio.to_thread(
            self.client.containers.run,
            self.image,
            ["python3", "-c", BUSY if busy else IDLE],
            name=name,
            labels=all_labels,
            detach=True,
            init=True,  # stops in < 1 s
        )

    async def start_managed(
        self,
        name: str,
        busy: bool = False,
        objective_s: float | None = None,
        alpha: float | None = None,
        model: str | None = None,
    ) -> None:
        labels = {OBJECTIVE_LABEL: objective_s, ALPHA_LABEL: alpha, MODEL_LABEL: model}
        await self._run(name, True, busy, {k: str(v) for k, v in labels.items() if v is not None})

    async def start_unmanaged(self, name: str, busy: bool = False) -> None:
        await self._run(name, False, busy, {})

    async def stop(self, name: str) -> None:
        container = await asyncio.to_thread(self.client.containers.get, name)
        await asyncio.to_thread(container.stop, timeout=2)

    async def is_running(self, name: str) -> bool:
        info = await asyncio.to_thread(self.client.api.inspect_container, name)
        return bool(info["State"]["Running"])

    async def kernel_limit_cores(self, name: str) -> float | None:
        info = await asyncio.to_thread(self.client.api.inspect_container, name)
        group = cgroupfs.docker_group(cgroupfs.DEFAULT_ROOT, info["Id"], info["State"]["Pid"])
        return cgroupfs.read_quota_cores(group)

    async def limit_state(self, name: str) -> Any:
        info = await asyncio.to_thread(self.client.api.inspect_container, name)
        hc = info["HostConfig"]
        return (
            hc["NanoCpus"],
            hc["CpuPeriod"],
            hc["CpuQuota"],
            await self.kernel_limit_cores(name),
        )

    def cleanup(self) -> None:
        for c in self.client.containers.list(
            all=True, filters={"label": f"{TEST_LABEL}={self.run_id}"}
        ):
            with contextlib.suppress(Exception):
                c.remove(force=True)


@asynccontextmanager
async def docker_harness() -> AsyncIterator[Harness]:
    from shared.runtime.docker import DockerRuntime

    client = docker_client_or_skip()
    image = docker_test_image(client)
    h = DockerHarness(client, image)
    h.runtime = DockerRuntime(node="test-node")
    try:
        await h.runtime.start()
        yield h
    finally:
        await h.runtime.close()
        await asyncio.to_thread(h.cleanup)
        client.close()


# ---- cgroup ------------------------------------------------------------------


class CgroupHarness(Harness):
    kind = "cgroup"
    owns_workloads = True

    def __init__(self) -> None:
        super().__init__()
        self.unmanaged: dict[str, subprocess.Popen[bytes]] = {}

    async def start_managed(
        self,
        name: str,
        busy: bool = False,
        objective_s: float | None = None,
        alpha: float | None = None,
        model: str | None = None,
    ) -> None:
        await self.runtime.spawn(  # type: ignore[attr-defined]
            name,
            [sys.executable, "-c", BUSY if busy else IDLE],
            objective_s=objective_s,
            alpha=alpha,
            model=model,
        )

    async def start_unmanaged(self, name: str, busy: bool = False) -> None:
        self.unmanaged[name] = subprocess.Popen([sys.executable, "-c", BUSY if busy else IDLE])

    async def stop(self, name: str) -> None:
        if name in self.unmanaged:
            self.unmanaged[name].kill()
            self.unmanaged[name].wait()
            return
        entry = self.runtime._spawned[name]  # type: ignore[attr-defined]
        entry.process.terminate()
        await entry.process.wait()

    async def is_running(self, name: str) -> bool:
        if name in self.unmanaged:
            return self.unmanaged[name].poll() is None
        entry = self.runtime._spawned.get(name)  # type: ignore[attr-defined]
        return entry is not None and entry.process.returncode is None

    def group(self, name: str) -> cgroupfs.Group:
        return cgroupfs.group_at(cgroupfs.DEFAULT_ROOT, f"{self.runtime.parent}/{name}")  # type: ignore[attr-defined]

    async def kernel_limit_cores(self, name: str) -> float | None:
        return cgroupfs.read_quota_cores(self.group(name))

    async def limit_state(self, name: str) -> Any:
        group = self.group(name)
        pid = self.unmanaged[name].pid if name in self.unmanaged else None
        own_cgroup = Path(f"/proc/{pid}/cgroup").read_text() if pid else None
        quota = cgroupfs.read_quota_cores(group) if cgroupfs.exists(group) else "absent"
        return (quota, own_cgroup)

    def cleanup(self) -> None:
        for p in self.unmanaged.values():
            p.kill()
            p.wait()


@asynccontextmanager
async def cgroup_harness() -> AsyncIterator[Harness]:
    from shared.runtime.cgroup import CgroupRuntime

    if os.geteuid() != 0:
        need("DQOES_REQUIRE_CGROUP", "the cgroup runtime needs root")
    h = CgroupHarness()
    h.runtime = CgroupRuntime(node="test-node", parent=f"dqoes-test-{uuid.uuid4().hex[:8]}")
    try:
        await h.runtime.start()
    except RuntimeFailure as e:
        need("DQOES_REQUIRE_CGROUP", str(e))
    try:
        yield h
    finally:
        await h.runtime.close()
        h.cleanup()


# ---- sim ---------------------------------------------------------------------


class SimHarness(Harness):
    """The simulated runtime at time scale 1: its "kernel" is the simulator's physics."""

    kind = "sim"
    owns_workloads = True

    def _spec(self, name: str, busy: bool, objective_s=None, alpha=None, model=None):
        from shared.scenarios.spec import ContainerSpec

        return ContainerSpec(name, model or ("busy" if busy else "idle"), objective_s, alpha=alpha)

    def _profile(self, busy: bool):
        from shared.core.profiles import ModelProfile

        # busy: one core flat out; idle: a sliver of work, then a long sleep
        return (
            ModelProfile("busy", 1e9, threads=1)
            if busy
            else ModelProfile("idle", 1e-3, overhead_s=3600.0)
        )

    async def start_managed(
        self, name, busy=False, objective_s=None, alpha=None, model=None
    ) -> None:
        await self.runtime.add(
            self._spec(name, busy, objective_s, alpha, model), profile=self._profile(busy)
        )

    async def start_unmanaged(self, name: str, busy: bool = False) -> None:
        await self.runtime.add(self._spec(name, busy), profile=self._profile(busy), managed=False)

    async def stop(self, name: str) -> None:
        await self.runtime.stop(name)

    async def is_running(self, name: str) -> bool:
        return self.runtime.running(name)

    async def kernel_limit_cores(self, name: str) -> float | None:
        return self.runtime.limit_cores(name)

    async def limit_state(self, name: str) -> Any:
        return self.runtime.limit_cores(name)


@asynccontextmanager
async def sim_harness() -> AsyncIterator[Harness]:
    from shared.runtime.sim import SimRuntime
    from shared.scenarios.spec import NodeSpec, Scenario

    empty = Scenario("contract", (NodeSpec("test-node", 2.0),), (), {}, 1e9, noise_sigma=0.0)
    h = SimHarness()
    h.runtime = SimRuntime("test-node", empty, time_scale=1.0)
    await h.runtime.start()
    try:
        yield h
    finally:
        await h.runtime.close()


HARNESSES: dict[str, Callable[[], Any]] = {
    "docker": docker_harness,
    "cgroup": cgroup_harness,
    "sim": sim_harness,
}


PARAM_MARKS = {"docker": [pytest.mark.docker]}
"""Markers per harness, so `-m "not docker"` deselects the docker runs."""


@pytest.fixture(params=[pytest.param(k, marks=PARAM_MARKS.get(k, [])) for k in sorted(HARNESSES)])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """A started runtime of each kind, with helpers to drive workloads around it.

    To add an implementation (e.g. "sim"): subclass Harness, implementing
    start_managed / start_unmanaged / stop / is_running / kernel_limit_cores
    (for a simulator: the limit its model enforces) / limit_state, set
    `owns_workloads`, write an async context manager that starts the runtime,
    yields the harness and cleans up (skip with need(...) when the runtime
    cannot exist here), and add it to HARNESSES under its name (and to
    PARAM_MARKS if it needs a marker). Every test in test_runtime_contract.py
    then runs against it too.
    """
    async with HARNESSES[request.param]() as h:
        yield h
