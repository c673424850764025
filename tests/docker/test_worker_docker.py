"""The whole path on a real engine: torch inference containers -> NATS -> worker -> docker update.

Three labelled inference containers (MobileNetV2, small batches) publish their
batches on a real nats-server; the manager takes objectives on dqoes.targets;
the worker (in this process, so its logs can be read) limits them through the
Docker runtime. An unlabelled busy container shares the engine and must never
be touched. The worker reaches the engine through tests/docker/engine_proxy.py
so the engine can "go away and come back" without killing this machine's
dockerd.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from engine_proxy import EngineProxy
from live_node import LiveNode

from services.worker.app import WorkerConfig
from shared import auth, subjects
from shared.bus import Bus
from shared.public import parse_target_reply
from shared.runtime import cgroupfs
from shared.schema import DecisionMsg, NodeState

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

INFERENCE = ["python", "-m", "services.inference"]
BUSY = ["python3", "-c", "while True: pass"]
ROUND_S = 3.0
"""The worker's initial listener interval in these tests."""


async def wait_until(pred, timeout_s: float, what: str, every_s: float = 0.1):
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        v = pred()
        if v:
            return v
        await asyncio.sleep(every_s)
    raise AssertionError(f"not within {timeout_s:g} s: {what}")


class Cluster(LiveNode):
    """A node's worth of the live system around one engine."""

    def __init__(self, containers: Any, nats_url: str, tmp_path: Path) -> None:
        super().__init__()
        self.containers = containers
        self.client = containers.client
        self.nats_url = nats_url
        self.node = f"dqw-{containers.run_id[:8]}"
        self.proxy = EngineProxy(tmp_path / "engine.sock")
        self.decisions: list[DecisionMsg] = []
        self.state: NodeState | None = None
        self.manager_log = tmp_path / "manager.log"

    def name(self, what: str) -> str:
        return self.containers.name(what)

    def inference(self, what: str, objective_label: str | None = None) -> Any:
        name = self.name(what)
        labels = {"dqoes.node": self.node, "dqoes.model": "mobilenetv2"}
        if objective_label is not None:
            labels["dqoes.objective_s"] = objective_label
        env = {"DQOES_NATS_URL": self.nats_url, "DQOES_NODE": self.node, "DQOES_CONTAINER_NAME": name,
               "DQOES_MODEL": "mobilenetv2", "DQOES_BATCH": "8", "DQOES_RESOLUTION": "128",
               "DQOES_LOG_LEVEL": "warning"}
        creds = auth.creds_of(self.nats_url)  # the URL names a host file: the container gets it read-only
        volumes = {creds: {"bind": creds, "mode": "ro"}} if creds else None
        return self.containers.run(what, labels, command=INFERENCE, environment=env, network_mode="host",
                                   volumes=volumes)

    def unlabelled(self, what: str) -> Any:
        return self.containers.run(what, managed=False, command=BUSY)

    def dies_at_start(self, what: str) -> Any:
        return self.containers.run(what, {"dqoes.node": self.node},
                                   command=["python3", "-c", "raise SystemExit(3)"])

    async def start(self) -> None:
        await self.proxy.up()
        self.start_manager(self.nats_url, self.manager_log, "--cluster-interval", "0.5")
        self.bus = await Bus.connect(self.nats_url, "test")
        await self.bus.subscribe(subjects.decisions(self.node), lambda m, _: self.decisions.append(m),
                                 expect=DecisionMsg)
        await self.bus.subscribe(subjects.state(self.node), lambda m, _: setattr(self, "state", m),
                                 expect=NodeState)
        cfg = WorkerConfig(node=self.node, nats_url=self.nats_url, runtime="docker", cores=2.0, policy="dqoes",
                           docker_url=self.proxy.url, initial_interval_s=ROUND_S, state_interval_s=0.5)
        await self.serve_worker(cfg)

    async def target(self, container: str, objective_s: float) -> dict[str, Any]:
        assert self.bus is not None
        body = orjson.dumps({"container": container, "objective": objective_s})
        for _ in range(50):  # the manager subprocess may still be starting
            try:
                return parse_target_reply(await self.bus.request(subjects.TARGETS, body, timeout_s=2.0))
            except Exception:  # noqa: BLE001 - no responder yet
                await asyncio.sleep(0.2)
        raise AssertionError("the manager never answered on dqoes.targets")

    def last_limit(self, container: str) -> float | None:
        for d in reversed(self.decisions):
            for c in d.containers:
                if c.container == container and c.new_limit is not None:
                    return c.new_limit
        return None

    def inspect(self, name: str) -> dict[str, Any]:
        return self.client.api.inspect_container(name)

    async def stop(self) -> None:
        await self.stop_live()
        await self.proxy.down()


@pytest.fixture
async def cluster(workload_containers, nats_url, tmp_path):
    cl = Cluster(workload_containers, nats_url, tmp_path)
    try:
        await cl.start()
        yield cl
    finally:
        await cl.stop()


def kernel_quota_cores(info: dict[str, Any]) -> float | None:
    group = cgroupfs.docker_group(cgroupfs.DEFAULT_ROOT, info["Id"], info["State"]["Pid"])
    return cgroupfs.read_quota_cores(group)


def engine_limit_cores(info: dict[str, Any]) -> float | None:
    hc = info["HostConfig"]
    if hc.get("NanoCpus"):
        return hc["NanoCpus"] / 1e9
    if hc.get("CpuQuota", 0) > 0:
        return hc["CpuQuota"] / (hc.get("CpuPeriod") or 100_000)
    return None


async def test_worker_limits_real_inference_containers_and_releases_a_stopped_ones_share(cluster):
    cl = cluster
    lax, mid, tight = cl.name("lax"), cl.name("mid"), cl.name("tight")
    for what in ("lax", "mid", "tight"):
        cl.inference(what)
    other = cl.unlabelled("other")
    other_before = cl.inspect(other.name)["HostConfig"]

    await wait_until(lambda: cl.state and {c.container for c in cl.state.containers} >= {lax, mid, tight},
                     30, "the worker sees all three")
    # Objectives through the public subject, as a user sets them.
    for name, objective_s in ((lax, 60.0), (mid, 2.0), (tight, 0.3)):
        reply = await cl.target(name, objective_s)
        assert reply["ok"], reply
    await wait_until(lambda: all(c.objective_s for c in cl.state.containers), 30, "objectives reach the worker")

    # "lax" is far ahead of its objective: it is limited, and the limit is real.
    await wait_until(lambda: cl.last_limit(lax), 90, "a limit for the lax container")
    limit = cl.last_limit(lax)
    info = cl.inspect(lax)
    assert engine_limit_cores(info) == pytest.approx(limit * 2.0, rel=0.02)
    assert kernel_quota_cores(info) == pytest.approx(limit * 2.0, rel=0.02)
    # Throttling is measured from cpu.stat and reported per container in the node state.
    await wait_until(lambda: all(c.throttled_ratio is not None for c in cl.state.containers
                                 if c.container in (lax, mid, tight)), 30, "throttling in the node state")
    assert all(0.0 <= c.throttled_ratio <= 1.0 for c in cl.state.containers if c.throttled_ratio is not None)

    # The unlabelled container: never in a decision or a state, never updated.
    seen = {c.container for d in cl.decisions for c in d.containers}
    assert other.name not in seen
    assert other.name not in {c.container for c in cl.state.containers}
    after = cl.inspect(other.name)
    for key in ("NanoCpus", "CpuQuota", "CpuPeriod", "CpuShares", "CpusetCpus"):
        assert after["HostConfig"].get(key) == other_before.get(key), key
    assert kernel_quota_cores(after) is None

    # Stop one mid-run: the worker runs a round at once (not at the next
    # interval) without it, and the floor for the two left rises to 1/(2*2).
    n_before = len(cl.decisions)
    cl.client.containers.get(tight).stop(timeout=2)
    t_stopped = time.monotonic()

    def round_without_tight():
        for d in cl.decisions[n_before:]:
            names = {c.container for c in d.containers}
            if tight not in names and {lax, mid} <= names:
                return d
        return None

    d = await wait_until(round_without_tight, ROUND_S + 5, "a round without the stopped container")
    assert time.monotonic() - t_stopped < ROUND_S + 2, "released only at a later round"
    assert d.event and "remov" in d.event, d.event
    for c in d.containers:
        if c.new_limit is not None:
            assert c.new_limit >= 0.25 - 1e-9, c  # the floor for |C| = 2
    await wait_until(lambda: tight not in {c.container for c in cl.state.containers}, 5,
                     "the node state drops the stopped container")


async def test_bad_containers_and_a_vanishing_engine_leave_the_worker_managing(cluster, caplog):
    cl = cluster
    caplog.set_level(logging.INFO)
    good = cl.name("good")
    cl.inference("good", objective_label="60")
    bad_label = cl.inference("badlabel", objective_label="fast")
    dies = cl.dies_at_start("dies")
    await wait_until(lambda: cl.last_limit(good), 90, "the good container is limited")

    label_lines = [r.getMessage() for r in caplog.records
                   if bad_label.name in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(label_lines) == 1 and "'fast'" in label_lines[0], label_lines
    dies.reload()
    assert dies.status == "exited"

    # The engine goes away: one line, the worker keeps running.
    n_rounds = cl.app.worker.rounds
    await cl.proxy.down()
    await wait_until(lambda: any("docker engine" in r.getMessage() and r.levelno == logging.WARNING
                                 for r in caplog.records), 15, "a line saying the engine is gone")
    late = cl.inference("late", objective_label="60")  # started while the worker cannot see
    await asyncio.sleep(ROUND_S + 1)
    assert not cl._serving.done(), "the worker stopped when the engine went away"
    lost = [r for r in caplog.records if "lost the docker engine" in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in lost]

    # ... and comes back: the worker picks up what started meanwhile and limits it.
    await cl.proxy.up()
    await wait_until(lambda: cl.state and late.name in {c.container for c in cl.state.containers},
                     60, "the container started while the engine was away joins")
    await wait_until(lambda: cl.last_limit(late.name), 90, "the late container is limited")
    assert cl.app.worker.rounds > n_rounds
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.ERROR)
