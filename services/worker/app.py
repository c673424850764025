"""Wiring for the worker: the only place where bus, runtime, policy and loop meet."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, replace

from services.worker.logic import Worker
from shared import subjects
from shared.bus import Bus, BusError
from shared.core.baselines import DefaultPolicy
from shared.core.controller import NodeController, Policy
from shared.core.dqoes import DQoESParams, DQoESPolicy
from shared.runtime.base import Runtime, RuntimeFailure
from shared.schema import ControlMsg, LatencyEvent, ObjectiveAssign
from shared.sim.physics import BatchDone
from shared.sim.scenario import Scenario, ScenarioError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    node: str
    nats_url: str = "nats://127.0.0.1:4222"
    policy: str = "dqoes"
    runtime: str = "sim"
    scenario: str | None = None
    seed: int = 1
    time_scale: float = 1.0
    start_at: float | None = None
    """Sim runtime: unix time of scenario time 0 (shared by all workers of a stack)."""
    cores: float | None = None
    alpha: float | None = None
    beta: float | None = None
    initial_interval_s: float | None = None
    state_interval_s: float = 2.0
    cgroup_root: str = "/sys/fs/cgroup"
    docker_url: str | None = None
    require_node_label: bool = False
    """Docker runtime: ignore managed containers without a dqoes.node label (logical nodes)."""
    workload_batch: int = 100
    """cgroup runtime with a scenario: images a batch of each inference process."""
    workload_resolution: int | None = None
    """cgroup runtime with a scenario: image side in pixels (None: the model's)."""
    log_level: str = "info"
    log_format: str = "text"


def make_policy(cfg: WorkerConfig, scenario: Scenario | None) -> Policy:
    params = scenario.controller if scenario is not None else DQoESParams()
    overrides = {k: v for k, v in (("alpha", cfg.alpha), ("beta", cfg.beta),
                                   ("initial_interval_s", cfg.initial_interval_s)) if v is not None}
    if "initial_interval_s" in overrides and overrides["initial_interval_s"] > params.max_interval_s:
        overrides["max_interval_s"] = overrides["initial_interval_s"] * 16
    params = replace(params, **overrides)
    if cfg.policy == "dqoes":
        return DQoESPolicy(params)
    if cfg.policy == "default":
        return DefaultPolicy(alpha=params.alpha, interval_s=params.initial_interval_s)
    assert scenario is not None
    from shared.sim.engine import make_policy as sim_policy

    return sim_policy("oracle", replace(scenario, controller=params))


def load_scenario(cfg: WorkerConfig) -> Scenario | None:
    """The sim runtime's workload; for cgroup, the real processes to start (optional)."""
    if cfg.runtime == "docker" or (cfg.runtime == "cgroup" and not cfg.scenario):
        return None
    from shared.sim.builtin import load

    assert cfg.scenario is not None
    return load(cfg.scenario, cfg.seed)


def make_runtime(cfg: WorkerConfig, scenario: Scenario | None, bus: Bus) -> Runtime:
    if cfg.runtime == "sim":
        from shared.publisher import LatencyPublisher
        from shared.runtime.sim import SimRuntime

        assert scenario is not None
        pub = LatencyPublisher(bus, cfg.node)
        models = {c.name: c.model for c in scenario.containers}

        def on_batch(b: BatchDone) -> None:
            pub.publish_nowait(pub.event(b.container, b.latency_s, b.images, b.batch,
                                         cpu_s=b.cpu_s, model=models.get(b.container)))

        if cfg.start_at is not None:
            return SimRuntime(cfg.node, scenario, cfg.seed, time_scale=cfg.time_scale, on_batch=on_batch,
                              clock=time.time, start_at=cfg.start_at)
        return SimRuntime(cfg.node, scenario, cfg.seed, time_scale=cfg.time_scale, on_batch=on_batch)
    if cfg.runtime == "docker":
        from shared.runtime.docker import DockerRuntime

        return DockerRuntime(cfg.node, cores=cfg.cores, cgroup_root=cfg.cgroup_root, docker_url=cfg.docker_url,
                             require_node_label=cfg.require_node_label)
    from shared.runtime.cgroup import CgroupRuntime

    # One parent group per node: several workers on one machine never share one.
    cores = cfg.cores or (scenario.node(cfg.node).cores if scenario else None)
    return CgroupRuntime(cfg.node, cores=cores, root=cfg.cgroup_root, parent=f"dqoes-{cfg.node}")


class ConfigError(Exception):
    """A worker that cannot start: bad flags, scenario or runtime; one line."""


@dataclass
class WorkerApp:
    cfg: WorkerConfig
    bus: Bus
    runtime: Runtime
    worker: Worker
    scenario: Scenario | None = None


async def build(cfg: WorkerConfig) -> WorkerApp:
    """Connect, create the runtime and controller, subscribe. Raises ConfigError or BusError."""
    try:
        scenario = load_scenario(cfg)
        subjects.validate_id(cfg.node, "node")
        policy = make_policy(cfg, scenario)
    except (ScenarioError, ValueError) as e:
        raise ConfigError(str(e)) from None
    bus = await Bus.connect(cfg.nats_url, f"worker-{cfg.node}")
    try:
        runtime = make_runtime(cfg, scenario, bus)
        ctrl = NodeController(cfg.node, scenario.node(cfg.node).cores if scenario else (cfg.cores or 1.0), policy)
        worker = Worker(cfg.node, runtime, ctrl, bus.publish, state_interval_s=cfg.state_interval_s)
        await worker.start()
    except (RuntimeFailure, ValueError, KeyError) as e:
        await bus.close()
        raise ConfigError(f"runtime {cfg.runtime}: {e}") from None
    ctrl.cores = float(getattr(runtime, "cores", ctrl.cores))
    await bus.subscribe(subjects.latency_of_node(cfg.node), lambda m, _: worker.on_latency(m), expect=LatencyEvent)
    await bus.subscribe(subjects.objectives(cfg.node), lambda m, _: worker.on_objective(m), expect=ObjectiveAssign)
    await bus.subscribe(subjects.control(cfg.node), lambda m, _: worker.on_control(m), expect=ControlMsg)
    log.info("worker for node %s: policy %s, runtime %s, %g cores, NATS %s",
             cfg.node, policy.name, cfg.runtime, ctrl.cores, cfg.nats_url)
    return WorkerApp(cfg, bus, runtime, worker, scenario)


async def serve(app: WorkerApp, *, handle_signals: bool = True) -> None:
    """Run until stopped (signal, `app.worker.stop()` or cancellation), then clean up."""
    worker = app.worker
    if handle_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, worker.stop)
            except (NotImplementedError, RuntimeError):
                pass
    follower = asyncio.create_task(worker.follow_runtime(), name="runtime-events")
    tasks = [follower]
    if app.cfg.runtime == "cgroup" and app.scenario is not None:
        from services.worker.workloads import WorkloadSettings, launch
        from shared.runtime.cgroup import CgroupRuntime

        assert isinstance(app.runtime, CgroupRuntime)
        ws = WorkloadSettings(app.cfg.workload_batch, app.cfg.workload_resolution)
        tasks.append(asyncio.create_task(
            launch(app.runtime, app.scenario, app.cfg.node, app.cfg.nats_url, ws), name="workloads"))
    try:
        await worker.run()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await app.runtime.close()
        await app.bus.drain()
        log.info("worker for node %s stopped after %d rounds", app.cfg.node, worker.rounds)


async def run(cfg: WorkerConfig) -> int:
    """The process: build, serve until SIGTERM/SIGINT. Returns the exit status."""
    try:
        app = await build(cfg)
    except ConfigError as e:
        log.error("%s", e)
        return 2
    except BusError as e:
        log.error("%s", e)
        return 1
    await serve(app)
    return 0
