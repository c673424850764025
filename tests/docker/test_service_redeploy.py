"""A stored service objective follows a redeploy: replaced containers are governed at once.

Why: replacing a service's containers (`docker service update --force`, a new
image, a rescheduled task) gives Swarm tasks new names and ids, and compose
containers new ids under the same name; an objective set for the service
(`dqoes target set --service NAME`) must govern the replacements from the
worker's first round with them, without anyone setting it again.

Real parts: a single-node Swarm on this machine's engine (initialised when none
is active, left again after), a service of the control-plane image
(dqoes:latest) running tests/multihost/load.py (pure-Python "batches" published
on NATS), a real nats-server with the project's auth, the manager as a
subprocess, the `dqoes` CLI as a subprocess, and the worker in this process on
the Docker runtime. The compose case makes its containers with compose's labels
and names (no compose binary needed). Marked `slow` (the Swarm test also
`swarm`); skipped without an engine or the image (a failure with
DQOES_REQUIRE_DOCKER=1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from live_node import LiveNode

from services.worker.app import WorkerConfig
from shared import auth, subjects
from shared.bus import Bus
from shared.messages import DecisionMsg, NodeState
from shared.natsd import NatsServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
LOAD_PY = REPO / "tests" / "multihost" / "load.py"
IMAGE = "dqoes:latest"
ROUND_S = 2.0
"""The worker's control interval here."""
OBJECTIVE_S = 1.0
"""Far above a load batch (tens of ms): class G, so the worker shrinks the task's CPU."""


def need(reason: str) -> None:
    """Skip with the reason, or fail when DQOES_REQUIRE_DOCKER=1 (as tests/docker/conftest.py does)."""
    if os.environ.get("DQOES_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (and DQOES_REQUIRE_DOCKER=1)")
    pytest.skip(f"{reason}; set DQOES_REQUIRE_DOCKER=1 to make this a failure")


def sh(*cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    return r


@pytest.fixture
def swarm(docker_client: Any) -> Iterator[None]:
    """A single-node Swarm: this engine's own if it manages one, else one made here and left after."""
    if sh("docker", "image", "inspect", IMAGE, check=False).returncode != 0:
        need(f"image {IMAGE} missing; build it with `make images`")
    state = sh("docker", "info", "-f", "{{.Swarm.LocalNodeState}}").stdout.strip()
    created = False
    gwbridge_before = sh("docker", "network", "inspect", "docker_gwbridge", check=False).returncode == 0
    if state == "inactive":
        r = sh("docker", "swarm", "init", "--advertise-addr", "127.0.0.1", check=False)
        if r.returncode != 0:
            need(f"docker swarm init failed here: {r.stderr.strip()[-300:]}")
        created = True
    elif state != "active":
        need(f"swarm state is {state!r}")
    elif sh("docker", "info", "-f", "{{.Swarm.ControlAvailable}}").stdout.strip() != "true":
        need("this engine is a swarm worker, not a manager")
    try:
        yield
    finally:
        if created:
            sh("docker", "swarm", "leave", "--force", check=False)
            if not gwbridge_before:
                sh("docker", "network", "rm", "docker_gwbridge", check=False)


def started_at(info: dict[str, Any]) -> float:
    """A container's State.StartedAt as unix seconds (Docker gives nanoseconds; keep microseconds)."""
    text = info["State"]["StartedAt"]
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


class Deployment(LiveNode):
    """nats-server, manager, worker and one Swarm service of load tasks on this engine."""

    def __init__(self, client: Any, tmp: Path) -> None:
        super().__init__()
        tag = uuid.uuid4().hex[:6]
        self.client = client
        self.node = f"dqr-{tag}"
        self.service = f"dqr-{tag}-api"
        self.auth_dir = tmp / "auth"
        everything = auth.Identity("test", "test", None, auth.Permissions(publish=(">",), subscribe=(">",)))
        auth.ensure(self.auth_dir, (self.node,), extra=[everything])
        self.nats = NatsServer(config_file=auth.config_path(self.auth_dir), store_dir=tmp / "store",
                               log_path=tmp / "nats-server.log")
        self.tmp = tmp
        self.states: list[NodeState] = []
        self.decisions: list[DecisionMsg] = []
        self.compose_names: set[str] = set()

    async def start(self) -> None:
        self.nats.start()
        url = self.url_as("test")
        self.start_manager(url, self.tmp / "manager.log")
        self.bus = await Bus.connect(url, "test-redeploy")
        await self.bus.subscribe(subjects.state(self.node), lambda m, _: self.states.append(m), expect=NodeState)
        await self.bus.subscribe(subjects.decisions(self.node), lambda m, _: self.decisions.append(m),
                                 expect=DecisionMsg)
        cfg = WorkerConfig(node=self.node, nats_url=url, runtime="docker", cores=2.0, policy="dqoes",
                           initial_interval_s=ROUND_S, state_interval_s=0.5, require_node_label=True)
        await self.serve_worker(cfg)

    def load_env(self) -> dict[str, str]:
        """What a load container needs to publish its batches to this deployment's NATS."""
        return {"DQOES_NATS_URL": self.nats.url, "DQOES_NATS_CREDS": "/run/dqoes/nats.creds",
                "DQOES_NODE": self.node, "DQOES_LOAD_WORK": "100000"}

    def creds(self) -> Path:
        return auth.creds_path(self.auth_dir, f"inference-{self.node}")

    def create_service(self) -> None:
        """A Swarm service of one load task on the host's network, with the worker's labels."""
        creds = self.creds()
        sh("docker", "service", "create", "--detach", "--name", self.service, "--replicas", "1",
           "--network", "host", "--init", "--stop-grace-period", "2s",
           "--container-label", "dqoes.managed=true", "--container-label", f"dqoes.node={self.node}",
           "--container-label", "dqoes.model=busy",
           *(a for k, v in self.load_env().items() for a in ("--env", f"{k}={v}")),
           "--env", "DQOES_CONTAINER_NAME={{.Task.Name}}",
           "--mount", f"type=bind,src={creds},dst=/run/dqoes/nats.creds,readonly",
           "--mount", f"type=bind,src={LOAD_PY},dst=/opt/dqoes-load.py,readonly",
           "--entrypoint", "python /opt/dqoes-load.py", IMAGE)

    def url_as(self, identity: str) -> str:
        return auth.with_credentials(self.nats.url, auth.load(auth.creds_path(self.auth_dir, identity)))

    def compose_up(self, service: str) -> str:
        """A container as `docker compose up` makes it (its labels, the fixed name `<project>-<service>-1`);
        called again, it replaces the container under the same name, as `up --force-recreate` does."""
        project = f"{self.node}-proj"
        name = f"{project}-{service}-1"
        with contextlib.suppress(Exception):
            self.client.containers.get(name).remove(force=True)
        self.client.containers.run(
            IMAGE, ["python", "/opt/dqoes-load.py"], name=name, detach=True, init=True, network_mode="host",
            labels={"dqoes.managed": "true", "dqoes.node": self.node, "dqoes.model": "busy",
                    "com.docker.compose.project": project, "com.docker.compose.service": service,
                    "com.docker.compose.container-number": "1"},
            environment={**self.load_env(), "DQOES_CONTAINER_NAME": name},
            volumes={str(self.creds()): {"bind": "/run/dqoes/nats.creds", "mode": "ro"},
                     str(LOAD_PY): {"bind": "/opt/dqoes-load.py", "mode": "ro"}})
        self.compose_names.add(name)
        return name

    def tasks(self) -> list[str]:
        """Names of the service's running task containers."""
        out = sh("docker", "ps", "--filter", f"label=com.docker.swarm.service.name={self.service}",
                 "--format", "{{.Names}}").stdout
        return [n for n in out.split() if n]

    def dqoes(self, *args: str) -> subprocess.CompletedProcess[str]:
        return sh(sys.executable, "-m", "services.cli", *args, "--nats", self.url_as("client"), "--json", check=False)

    def governed(self, name: str) -> tuple[NodeState, Any] | None:
        """The first state in which `name` is governed by the Swarm service's objective with a limit."""
        return self.governed_as(name, self.service)

    def governed_as(self, name: str, selector: str, after: float = 0.0) -> tuple[NodeState, Any] | None:
        """The first state (made after `after`, unix s) in which `name` is governed by `selector`'s
        objective with a limit."""
        for s in self.states:
            for c in s.containers if s.at > after else ():
                if (c.container == name and c.objective_selector == selector
                        and c.objective_s == OBJECTIVE_S and c.limit is not None):
                    return s, c
        return None

    def first_decision(self, name: str, after: float = 0.0) -> tuple[float, float] | None:
        """(at, new limit) of the first decision (made after `after`, unix s) that changed `name`'s limit."""
        for m in self.decisions:
            for c in m.containers if m.at > after else ():
                if c.container == name and c.new_limit is not None:
                    return m.at, c.new_limit
        return None

    def first_state_with(self, name: str) -> tuple[NodeState, Any] | None:
        for s in self.states:
            for c in s.containers:
                if c.container == name:
                    return s, c
        return None

    async def stop(self) -> None:
        sh("docker", "service", "rm", self.service, check=False)
        for name in self.compose_names:
            with contextlib.suppress(Exception):
                self.client.containers.get(name).remove(force=True)
        await self.stop_live()
        self.nats.stop()
        with contextlib.suppress(Exception):
            for c in self.client.containers.list(
                    all=True, filters={"label": f"com.docker.swarm.service.name={self.service}"}):
                c.remove(force=True)


@pytest.fixture
async def control(docker_client: Any, tmp_path: Path) -> Any:
    if sh("docker", "image", "inspect", IMAGE, check=False).returncode != 0:
        need(f"image {IMAGE} missing; build it with `make images`")
    d = Deployment(docker_client, tmp_path)
    try:
        await d.start()
        yield d
    finally:
        await d.stop()


@pytest.fixture
async def deployment(swarm: None, control: Deployment) -> Any:
    await asyncio.to_thread(control.create_service)
    return control


async def until(what: str, fn: Any, timeout_s: float, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(every_s)


def cpu_quota(d: Deployment, name: str) -> int:
    return d.client.api.inspect_container(name)["HostConfig"]["CpuQuota"]


@pytest.mark.swarm
async def test_a_service_objective_governs_the_tasks_a_forced_update_brings(deployment: Deployment) -> None:
    d = deployment
    (old,) = await until("the service's first task running", lambda: d.tasks(), 60)
    labels = d.client.api.inspect_container(old)["Config"]["Labels"]
    assert labels["com.docker.swarm.service.name"] == d.service and labels["dqoes.node"] == d.node
    seen = await until("the worker's state listing the task", lambda: d.first_state_with(old), 30)
    assert seen[1].managed is False and seen[1].objective_s is None  # no label, no objective yet

    r = await asyncio.to_thread(d.dqoes, "target", "set", "--service", d.service, str(OBJECTIVE_S))
    assert r.returncode == 0, r.stderr
    reply = json.loads(r.stdout.strip().splitlines()[-1])
    assert reply["ok"] is True and reply["service"] == d.service, reply

    _, c = await until("the old task governed by the service objective", lambda: d.governed(old), 30)
    assert c.objective_source == "target" and c.managed
    await until("a CPU quota on the old task", lambda: cpu_quota(d, old) > 0, 30)

    # Replace the task: a new container (new name and id) of the same service.
    old_id = d.client.api.inspect_container(old)["Id"]
    await asyncio.to_thread(sh, "docker", "service", "update", "--detach", "--force", d.service)
    (new,) = await until("a new task replacing the old one", lambda: [n for n in d.tasks() if n != old], 60)
    new_info = d.client.api.inspect_container(new)
    assert new != old and new_info["Id"] != old_id
    spec = json.loads(sh("docker", "service", "inspect", d.service).stdout)[0]["Spec"]
    assert not (spec["TaskTemplate"].get("Resources") or {}).get("Limits")  # any limit is the worker's
    appeared_s = started_at(new_info)

    # The first state that lists the new container already has the stored objective in force.
    first, fc = await until("the worker's state listing the new task", lambda: d.first_state_with(new), 30)
    assert fc.objective_selector == d.service and fc.objective_s == OBJECTIVE_S, fc
    assert fc.objective_source == "target" and fc.managed, fc
    state, gc = await until("the new task governed with a limit", lambda: d.governed(new), 30)
    await until("a CPU quota on the new task", lambda: cpu_quota(d, new) > 0, 30)
    governed_after_s = state.at - appeared_s
    decided = await until("a decision changing the new task's limit", lambda: d.first_decision(new), 30)
    print(f"new task {new}: objective in force in the first state {first.at - appeared_s:.2f} s after it "
          f"started; limit {gc.limit:.3f} in the state at {governed_after_s:.2f} s; first decision moving it "
          f"(to {decided[1]:.3f}) at {decided[0] - appeared_s:.2f} s (round {ROUND_S:g} s)")
    # Its first round moves its limit: within one control round of appearing (plus slack for a busy host).
    assert decided[0] - appeared_s <= ROUND_S + 1.5, decided
    # The stored objective was never set again: the manager still holds it for the service.
    r = await asyncio.to_thread(d.dqoes, "target", "get", "--service", d.service)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["target"]["objective_s"] == OBJECTIVE_S, got


async def test_a_compose_service_objective_governs_a_recreated_container_of_the_same_name(
        control: Deployment) -> None:
    """Compose replaces a container under the same name (`up --force-recreate`, a changed image): the
    worker must see a new container (unlimited, as created) and limit it again under the stored objective."""
    d = control
    name = await asyncio.to_thread(d.compose_up, "web")
    await until("the worker's state listing the container", lambda: d.first_state_with(name), 30)
    r = await asyncio.to_thread(d.dqoes, "target", "set", "--service", "web", str(OBJECTIVE_S))
    assert r.returncode == 0, r.stderr
    await until("the container governed by the service objective", lambda: d.governed_as(name, "web"), 30)
    await until("a CPU quota on the container", lambda: cpu_quota(d, name) > 0, 30)
    old_id = d.client.api.inspect_container(name)["Id"]

    again = await asyncio.to_thread(d.compose_up, "web")
    info = d.client.api.inspect_container(again)
    assert again == name and info["Id"] != old_id
    appeared_s = started_at(info)
    # The new container has the old one's name: only its limit on the engine tells them apart.
    await until("a CPU quota on the recreated container", lambda: cpu_quota(d, name) > 0, 30)
    decided = await until("a decision on the recreated container", lambda: d.first_decision(name, appeared_s), 30)
    state, c = await until("the recreated container governed by the service objective",
                           lambda: d.governed_as(name, "web", appeared_s), 30)
    print(f"recreated {name}: first decision {decided[0] - appeared_s:.2f} s after it started "
          f"(limit {decided[1]:.3f}; round {ROUND_S:g} s)")
    assert decided[0] - appeared_s <= ROUND_S + 1.5, decided
    assert c.objective_source == "target" and c.limit is not None
