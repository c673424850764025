"""Wiring for the worker: the only place where bus, runtime, policy and loop meet.

Order matters: the runtime is built (by name, `shared.runtime.factory`) and
started first, so its capabilities (cores, clock, time scale, what it knows
of latency curves) are known before the policy and the controller are built.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.worker.logic import Worker
from services.worker.polling import LatencyPoller
from services.worker.training import SPLITS, TrainingSide
from shared import auth, subjects
from shared.bus import Bus, BusError, Incoming
from shared.core import registry
from shared.core.controller import NodeController
from shared.core.dqoes import DQoESParams
from shared.core.policy import Policy, PolicyContext
from shared.latency.events import decode_latency_any
from shared.metrics import MetricsServer, WorkerCollector, WorkerCounters
from shared.publisher import LatencyPublisher
from shared.runtime.base import Runtime, RuntimeFailure
from shared.runtime.factory import RuntimeSettings, make_runtime, strip_credentials
from shared.scenarios.builtin import load
from shared.scenarios.spec import Scenario, ScenarioError
from shared.schema import (
    ControlMsg,
    JobDone,
    Launch,
    LaunchReply,
    ObjectiveAssign,
    Progress,
    ServiceObjective,
)
from shared.settings import DEFAULT_METRICS_ADDR

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    node: str
    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds: str | None = None
    """The credentials file the worker connects with (the worker's identity)."""
    inference_creds: str | None = None
    """The credentials file the processes this worker starts connect with (the node's inference identity);
    None: `inference-<node>.creds` beside `nats_creds`. They never get the worker's."""
    on_stop: str = "restore"
    """On a clean stop: "keep" the limits in force, or "restore" what the containers had before."""
    state_dir: str | None = None
    """Where the containers' original limits and what `dqoes control` set are kept across restarts
    (None: in memory only)."""
    policy: str = "learned"
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
    params: tuple[tuple[str, float], ...] = ()
    """The policy's parameters by name (`--param`), over the scenario's and the flags above: what
    `dqoes control` sets at runtime, here from the start and again after every restart."""
    state_interval_s: float = 2.0
    cgroup_root: str = "/sys/fs/cgroup"
    docker_url: str | None = None
    require_node_label: bool = False
    """Docker runtime: ignore managed containers without a dqoes.node label (logical nodes)."""
    cpu_weights: bool = True
    """Docker and cgroup runtimes: each limit also sets the container's CPU weight from it."""
    workload_batch: int = 100
    """cgroup runtime with a scenario: images a batch of each inference process."""
    workload_resolution: int | None = None
    """cgroup runtime with a scenario: image side in pixels (None: the model's)."""
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (0: a free one); None: off."""
    metrics_addr: str = DEFAULT_METRICS_ADDR
    training_policy: str = "flowcon"
    """Policy of the node's training containers (registry kind "training"); "none": leave them alone."""
    training_split: str = "inference-first"
    """How the node's CPU is split between inference and training (services/worker/training.py)."""
    training_stale_s: float = 60.0
    """A training job with no value for this long is stale (keeps its list and limit; one log line)."""
    prometheus_url: str | None = None
    """The Prometheus server that containers labelled dqoes.latency.source=promql are queried on."""
    log_level: str = "info"
    log_format: str = "text"


def policy_settings(cfg: WorkerConfig, scenario: Scenario | None) -> dict[str, Any]:
    """The policy's settings: the scenario's controller table, then the worker's flags."""
    settings: dict[str, Any] = scenario.policy_settings() if scenario is not None else {}
    overrides = {k: v for k, v in (("alpha", cfg.alpha), ("beta", cfg.beta),
                                   ("initial_interval_s", cfg.initial_interval_s)) if v is not None}
    if overrides.get("initial_interval_s", 0.0) > settings.get("max_interval_s", DQoESParams().max_interval_s):
        overrides["max_interval_s"] = overrides["initial_interval_s"] * 16
    params = dict(cfg.params)
    try:
        registry.check_names(cfg.policy, params)
    except ValueError as e:
        raise ValueError(f"--param: {e}") from None
    return settings | overrides | params


def load_scenario(cfg: WorkerConfig) -> Scenario | None:
    """The sim runtime's workload; for cgroup, the real processes to start (optional)."""
    if cfg.runtime == "docker" or not cfg.scenario:
        return None
    return load(cfg.scenario, cfg.seed)


def inference_identity(cfg: WorkerConfig) -> tuple[str, str | None]:
    """(URL, credentials file) the inference processes and training jobs this worker starts connect with.

    The node's inference identity: it may publish only its node's batches and progress, where the
    worker's may move limits. ConfigError where the worker has credentials but that identity has none
    (its processes would otherwise have to carry the worker's)."""
    url = strip_credentials(cfg.nats_url)
    creds = cfg.inference_creds or auth.peer_creds(cfg.nats_creds, auth.identity_name("inference", cfg.node))
    if creds is not None:
        return url, str(creds)
    if cfg.nats_creds or auth.user_of(cfg.nats_url) is not None:
        raise ConfigError(f"no credentials for inference-{cfg.node}, which the processes this worker starts "
                          "connect as: give --inference-creds (they never get the worker's)")
    return cfg.nats_url, None


def runtime_settings(cfg: WorkerConfig, scenario: Scenario | None) -> RuntimeSettings:
    starts = cfg.runtime == "cgroup" and scenario is not None
    url, creds = inference_identity(cfg) if starts else (cfg.nats_url, None)
    return RuntimeSettings(
        kind=cfg.runtime, node=cfg.node, cores=cfg.cores, scenario=scenario, seed=cfg.seed,
        time_scale=cfg.time_scale, start_at=cfg.start_at, cgroup_root=cfg.cgroup_root,
        docker_url=cfg.docker_url, require_node_label=cfg.require_node_label, cpu_weights=cfg.cpu_weights,
        workload_batch=cfg.workload_batch, workload_resolution=cfg.workload_resolution, nats_url=url,
        nats_creds=creds,
    )


class ConfigError(Exception):
    """A worker that cannot start: bad flags, scenario or runtime; one line."""


@dataclass
class WorkerApp:
    cfg: WorkerConfig
    bus: Bus
    runtime: Runtime
    worker: Worker
    scenario: Scenario | None = None
    metrics: MetricsServer | None = None
    control_bus: Bus | None = None
    """A second connection for objectives and control: a flood of latency events on the first
    (even one the server cuts off as a slow consumer) never delays or drops them."""
    poller: LatencyPoller | None = None
    """Reads the latency of containers whose labels name a prometheus or promql source."""


async def build(cfg: WorkerConfig) -> WorkerApp:
    """Connect, start the runtime, then build the controller on its capabilities and subscribe.

    Raises ConfigError or BusError.
    """
    try:
        subjects.validate_id(cfg.node, "node")
        scenario = load_scenario(cfg)
        settings = policy_settings(cfg, scenario)
        registry.params_for(cfg.policy, settings)  # a bad policy or value fails before anything starts
        if cfg.training_policy != "none":
            registry.build_training(cfg.training_policy)
        if cfg.training_split not in SPLITS:
            raise ValueError(f"training split must be one of {', '.join(SPLITS)}")
        rsettings = runtime_settings(cfg, scenario)  # ConfigError before anything connects
    except (ScenarioError, ValueError) as e:
        raise ConfigError(str(e)) from None
    bus = await Bus.connect(cfg.nats_url, f"worker-{cfg.node}")
    try:
        control_bus = await Bus.connect(cfg.nats_url, f"worker-{cfg.node}-control")
    except BusError:
        await bus.close()
        raise
    pub = LatencyPublisher(bus, cfg.node)

    def on_batch(container: str, latency_s: float, images: int, batch: int, cpu_s: float,
                 model: str | None, follows_limit: bool, finished_at: float) -> None:
        pub.publish_nowait(pub.event(container, latency_s, images, batch, cpu_s=cpu_s, model=model,
                                     finished_at=finished_at, follows_limit=follows_limit))

    runtime = None
    try:
        runtime = make_runtime(rsettings, on_batch)
        await runtime.start()
        policy = registry.build(cfg.policy, settings, PolicyContext(runtime.latency_curve))
        ctrl = NodeController(cfg.node, runtime.cores, policy)
        training = None
        if cfg.training_policy != "none":
            training = TrainingSide(cfg.node, runtime, registry.build_training(cfg.training_policy, settings),
                                    bus.publish, split=cfg.training_split, stale_after_s=cfg.training_stale_s)
        state = Path(cfg.state_dir) if cfg.state_dir else None
        originals = str(state / f"limits-{subjects.token(cfg.node)}.json") if state else None
        # What `dqoes control` changes outlives a restart, unless the worker's policy or flags changed.
        params_file = str(state / f"params-{subjects.token(cfg.node)}.json") if state else None
        curves = PolicyContext(runtime.latency_curve)

        def policy_named(name: str) -> Policy:  # `dqoes control policy=NAME`; ValueError: refused
            if name not in registry.names():
                raise ValueError(f"unknown policy {name!r} (choose from {', '.join(registry.names())})")
            if registry.spec(name).needs_curves and cfg.runtime != "sim":
                raise ValueError(f"policy {name} needs every container's latency curve: only with the sim runtime")
            return registry.build(name, settings, curves)

        worker = Worker(cfg.node, runtime, ctrl, bus.publish, state_interval_s=cfg.state_interval_s,
                        training=training, originals_file=originals, params_file=params_file,
                        params_key={"policy": cfg.policy, "settings": settings}, policy_factory=policy_named)
        poller = LatencyPoller(worker, cfg.prometheus_url)  # before start: it sees the first containers join
        await worker.start()
    except (RuntimeFailure, ValueError, KeyError) as e:
        if runtime is not None:
            await runtime.close()
        await bus.close()
        await control_bus.close()
        raise ConfigError(f"runtime {cfg.runtime}: {e}") from None
    # The hot path: tens of thousands of events a second, decoded and handled in batches.
    # With subjects: the container an event speaks for is the one its subject names.
    # Msgpack LatencyEvents, or the same fields as JSON (shared/latency/events.py).
    await bus.subscribe_batch(subjects.latency_of_node(cfg.node), worker.on_latencies, decode_latency_any,
                              with_subjects=True)
    await control_bus.subscribe(
        subjects.objectives(cfg.node),
        lambda m, _: worker.on_objective(m) if isinstance(m, ObjectiveAssign) else worker.on_service_objective(m),
        expect=(ObjectiveAssign, ServiceObjective))

    async def on_control(msg: ControlMsg, inc: Incoming) -> None:
        await control_bus.reply(inc, worker.on_control(msg))

    await control_bus.subscribe(subjects.control(cfg.node), on_control, expect=ControlMsg)
    metrics = None
    if cfg.metrics_port is not None:
        metrics = MetricsServer()
        metrics.register(WorkerCollector(cfg.node, lambda: worker.last_state, lambda: WorkerCounters(
            rounds=worker.rounds, limit_changes=worker.limit_changes, latencies=worker.latencies,
            ignored_latencies=worker.ignored_latencies, bus_dropped=bus.dropped,
            bus_refused_replies=bus.refused_replies + control_bus.refused_replies,
            forged_latencies=worker.forged_latencies), poller.rates))
        node_rounds = metrics.round_seconds.labels(cfg.node)
        worker.round_observers.append(node_rounds.observe)
        try:
            url = metrics.start(cfg.metrics_port, cfg.metrics_addr)
        except OSError as e:
            await runtime.close()
            await bus.close()
            await control_bus.close()
            raise ConfigError(f"metrics: cannot listen on {cfg.metrics_addr}:{cfg.metrics_port}: {e}") from None
        log.info("metrics on %s", url)
    if training is not None:
        side = training

        def on_progress(m: Progress | JobDone, _: Any) -> None:
            if isinstance(m, Progress):
                side.on_progress(m)
            else:
                side.on_done(m)
            if side.is_due(side.clock()):
                worker.wake.set()

        try:
            job_url, job_creds = inference_identity(cfg)
            if job_creds is not None:  # a job in a container cannot read the file: its URL carries the identity
                job_url = auth.with_credentials(job_url, auth.load(job_creds))
            refused = ""
        except (ConfigError, auth.AuthError) as e:
            job_url, job_creds, refused = "", None, str(e)

        async def on_launch(m: Launch, incoming: Any) -> None:
            if refused:
                await bus.reply(incoming, LaunchReply(ok=False, node=cfg.node, job=m.job, error=refused))
                return
            await bus.reply(incoming, await side.launch(m, job_url, job_creds))

        await bus.subscribe(subjects.progress_of_node(cfg.node), on_progress, expect=(Progress, JobDone))
        await bus.subscribe(subjects.launch(cfg.node), on_launch, expect=Launch)
    log.info("worker for node %s: policy %s, training %s (%s), runtime %s, %g cores, NATS %s",
             cfg.node, policy.name, cfg.training_policy, cfg.training_split, cfg.runtime, ctrl.cores, bus.url)
    return WorkerApp(cfg, bus, runtime, worker, scenario, metrics, control_bus, poller)


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
    tasks = [asyncio.create_task(worker.follow_runtime(), name="runtime-events")]
    try:
        await worker.run()
        await worker.on_stop(app.cfg.on_stop)  # a clean stop only; a crash leaves the limits (docs/guide/operations.md)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if app.poller is not None:
            await app.poller.close()
        await app.runtime.close()
        await app.bus.drain()
        if app.control_bus is not None:
            await app.control_bus.drain()
        if app.metrics is not None:
            app.metrics.stop()
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
