"""Build a runtime by name: `sim`, `docker` or `cgroup`. The only importer of the simulated runtime.

Why: the worker must run unchanged on a simulated node, a Docker host or a
machine of plain processes, and production code must not depend on the
simulator. The worker hands its settings here and gets a `Runtime` back;
what is simulated stays behind this module (import-linter keeps it so).

- `sim`: the scenario's containers of this node, simulated on a scaled clock;
  each finished batch is handed to `on_batch`, which the worker wires to the
  bus exactly as a real inference container publishes.
- `docker`: the labelled containers of a real engine.
- `cgroup`: plain processes in cgroups; with a scenario, the runtime starts
  this node's containers itself as real inference processes
  (`python -m services.inference`) at their submit times, in wall seconds.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared import auth
from shared.runtime.base import Runtime, RuntimeFailure
from shared.scenarios.placement import place
from shared.scenarios.spec import ContainerSpec, Scenario

KINDS = ("sim", "docker", "cgroup")

BatchCallback = Callable[[str, float, int, int, float, str | None, bool, float], None]
"""(container, latency_s, images, batch number, cpu_s, model, follows_limit, finished_at: unix s) of
one simulated batch."""


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """What any runtime may need; each kind reads its own fields."""

    kind: str
    node: str
    cores: float | None = None
    """docker/cgroup: the node's cores (default: all of the machine's)."""
    scenario: Scenario | None = None
    """sim: the workload (required); cgroup: real processes to start (optional)."""
    seed: int = 1
    time_scale: float = 1.0
    """sim: scenario seconds per wall second."""
    start_at: float | None = None
    """sim: unix time of scenario time 0 (shared by every worker of a stack)."""
    cgroup_root: str = "/sys/fs/cgroup"
    docker_url: str | None = None
    require_node_label: bool = False
    """docker: manage only containers labelled dqoes.node=<node> (several logical nodes on one engine)."""
    cpu_weights: bool = False
    """docker/cgroup: each limit also sets the container's CPU weight from it (equal weights otherwise)."""
    workload_batch: int = 100
    """cgroup with a scenario: images a batch of each inference process."""
    workload_resolution: int | None = None
    """cgroup with a scenario: image side in pixels (None: the model's)."""
    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds: str | None = None
    """cgroup runtime: the credentials file its inference processes connect with (else the URL's)."""
    """cgroup with a scenario: where the inference processes publish."""


def default_node(kind: str, docker_url: str | None = None) -> str:
    """A worker's node when none is given: the engine's name (`docker info` Name) for `docker`, else
    this machine's hostname. RuntimeFailure if the engine cannot be asked."""
    if kind == "docker":
        from shared.runtime.docker import engine_name

        return engine_name(docker_url)
    return socket.gethostname()


def make_runtime(s: RuntimeSettings, on_batch: BatchCallback | None = None) -> Runtime:
    """A runtime of kind `s.kind`, not started. ValueError for settings that cannot work."""
    if s.kind == "sim":
        if s.scenario is None:
            raise ValueError("the sim runtime needs a scenario")
        from shared.runtime.sim import SimRuntime
        from shared.sim.physics import BatchDone

        scenario = s.scenario
        models = {c.name: c.model for c in scenario.containers}
        follows = {c.name: scenario.profile_of(c).follows_limit for c in scenario.containers}

        rt: SimRuntime | None = None

        def batch_done(b: BatchDone) -> None:
            if on_batch is not None:
                # When it finished on the wall clock, as a workload stamps it: the physics may hand a
                # batch over later (a round reads the counters after its end), and the worker places
                # each batch by this stamp.
                behind_s = 0.0 if rt is None else max(0.0, rt.now_s() - b.finished_at_s) / rt.time_scale
                on_batch(b.container, b.latency_s, b.images, b.batch, b.cpu_s, models.get(b.container),
                         follows.get(b.container, False), time.time() - behind_s)

        # A shared start is on the wall clock (several workers, one scenario clock).
        if s.start_at is None:
            rt = SimRuntime(s.node, scenario, s.seed, time_scale=s.time_scale, on_batch=batch_done)
        else:
            rt = SimRuntime(s.node, scenario, s.seed, time_scale=s.time_scale, on_batch=batch_done,
                            clock=time.time, start_at=s.start_at)
        return rt
    if s.kind == "docker":
        from shared.runtime.docker import DockerRuntime

        return DockerRuntime(s.node, cores=s.cores, cgroup_root=s.cgroup_root, docker_url=s.docker_url,
                             require_node_label=s.require_node_label, cpu_weights=s.cpu_weights)
    if s.kind == "cgroup":
        from shared.runtime.cgroup import CgroupRuntime, PlannedProcess

        plan: list[PlannedProcess] = []
        cores = s.cores
        if s.scenario is not None:
            try:
                cores = cores or s.scenario.node(s.node).cores
            except KeyError:
                raise RuntimeFailure(f"node {s.node!r} is not in scenario {s.scenario.name}") from None
            plan = [
                PlannedProcess(c.name, tuple(inference_argv(c, s)), c.submit_at_s, c.objective_s, c.alpha, c.model)
                for c in node_containers(s.scenario, s.node)
            ]
        # One parent group per node: several workers on one machine never share one.
        return CgroupRuntime(s.node, cores=cores, root=s.cgroup_root, parent=f"dqoes-{s.node}", plan=plan,
                             cpu_weights=s.cpu_weights)
    raise ValueError(f"unknown runtime {s.kind!r} (choose from {', '.join(KINDS)})")


def node_containers(scenario: Scenario, node: str) -> list[ContainerSpec]:
    """This node's containers in submit order (the simulator's placement for unpinned ones)."""
    placement = place(scenario)
    return sorted((c for c in scenario.containers if placement[c.name] == node),
                  key=lambda c: (c.submit_at_s, c.name))


def strip_credentials(url: str) -> str:
    """The URL without a user, password or credentials file in it."""
    return auth.without_credentials(url)


def inference_argv(c: ContainerSpec, s: RuntimeSettings) -> list[str]:
    """The real inference process standing in for scenario container `c`."""
    argv = [sys.executable, "-m", "services.inference", "--name", c.name, "--node", s.node,
            "--model", c.model, "--batch", str(s.workload_batch)]
    if s.nats_creds:
        # The file, not the password, goes on the command line (ps shows it).
        argv += ["--nats", strip_credentials(s.nats_url), "--creds", s.nats_creds]
    else:
        argv += ["--nats", s.nats_url]
    if s.workload_resolution is not None:
        argv += ["--resolution", str(s.workload_resolution)]
    return argv
