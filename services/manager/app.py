"""Wiring for the manager: bus, key-value store, subscriptions and the publishing loop.

Two connections: the one that serves requests (targets, queries, submits)
and a second, `store`, that alone reads and writes the objectives bucket and
serves nothing, so no request can make a reply land in the bucket whatever
reply subject it names (docs/guide/security.md).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from services.manager.logic import Manager
from services.manager.placement import Placer
from shared import subjects
from shared.bus import KV, Bus, BusError, Incoming
from shared.metrics import ManagerCollector, ManagerCounters, MetricsServer
from shared.schema import Launch, LaunchReply, NodeState, SchemaError, TrainingState, decode_as
from shared.settings import DEFAULT_METRICS_ADDR

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    store_url: str | None = None
    """The objectives bucket's connection (the `store` identity's credentials); None: `nats_url`'s."""
    bucket: str = subjects.KV_OBJECTIVES
    bucket_replicas: int = 1
    """Copies of the bucket when this manager creates it (3 on a 3-server cluster)."""
    cluster_interval_s: float = 1.0
    stale_after_s: float = 15.0
    metrics_port: int | None = None
    """Serve Prometheus metrics on this port (0: a free one); None: off."""
    metrics_addr: str = DEFAULT_METRICS_ADDR
    placement: str = "flowcon"
    """Training policy whose placement `dqoes.submit` uses (flowcon: Algorithm 4; default: spread)."""
    launch_timeout_s: float = 30.0
    log_level: str = "info"
    log_format: str = "text"


class KVStore:
    """The objectives bucket as the manager's Store: values with their revisions."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv

    async def items(self) -> dict[str, tuple[int, bytes]]:
        out = {}
        for key in await self.kv.keys():
            e = await self.kv.get_entry(key)
            if e is not None and e.value is not None:
                out[key] = (e.revision, e.value)
        return out

    async def put(self, key: str, value: bytes) -> int:
        return await self.kv.put(key, value)

    async def delete(self, key: str) -> None:
        await self.kv.delete(key)


async def run(cfg: ManagerConfig, *, started: asyncio.Event | None = None) -> int:
    try:
        bus = await Bus.connect(cfg.nats_url, "manager")
    except BusError as e:
        log.error("%s", e)
        return 1
    try:
        store_bus = await Bus.connect(cfg.store_url or cfg.nats_url, "manager-store")
    except BusError as e:
        log.error("objectives store: %s", e)
        await bus.close()
        return 1
    try:
        kv = await store_bus.kv(cfg.bucket, replicas=cfg.bucket_replicas)
    except BusError as e:
        log.error("objectives cannot be stored (is JetStream enabled on the NATS server? with the default "
                  "permissions only the store identity may use the bucket: --store-creds): %s", e)
        await store_bus.close()
        await bus.close()
        return 1
    mgr = Manager(KVStore(kv), bus.publish, stale_after_s=cfg.stale_after_s)
    await mgr.load()
    metrics = None
    if cfg.metrics_port is not None:
        metrics = MetricsServer()
        latest = [mgr.cluster_state()]
        metrics.register(ManagerCollector(lambda: latest[0], lambda: ManagerCounters(
            accepted=mgr.accepted, rejected=mgr.rejected, cleared=mgr.cleared,
            objectives_stored=len(mgr.objectives) + len(mgr.services), bus_dropped=bus.dropped,
            service_objectives_stored=len(mgr.services),
            bus_refused_replies=bus.refused_replies)))
        try:
            log.info("metrics on %s", metrics.start(cfg.metrics_port, cfg.metrics_addr))
        except OSError as e:
            log.error("metrics: cannot listen on %s:%s: %s", cfg.metrics_addr, cfg.metrics_port, e)
            await store_bus.close()
            await bus.close()
            return 2
    changed = asyncio.Event()

    async def on_state(ns: NodeState, _: Incoming) -> None:
        await mgr.on_node_state(ns)
        changed.set()

    async def on_target(inc: Incoming) -> None:
        reply = await mgr.on_target(inc.data)
        await bus.reply(inc, reply)

    async def on_query(inc: Incoming) -> None:
        # Requests on the published subject are answered too; plain publishes
        # there (our own, or anyone's) carry no reply subject and are ignored.
        if inc.reply:
            await bus.reply(inc, mgr.cluster_state().to_json())

    async def on_get(inc: Incoming) -> None:
        if inc.reply:
            await bus.reply(inc, mgr.on_get(inc.data))

    async def on_list(inc: Incoming) -> None:
        if inc.reply:
            await bus.reply(inc, mgr.on_list(inc.data))

    async def on_clear(inc: Incoming) -> None:
        reply = await mgr.on_clear(inc.data)
        await bus.reply(inc, reply)

    async def on_containers(inc: Incoming) -> None:
        if inc.reply:
            await bus.reply(inc, mgr.on_containers(inc.data))


    placer = Placer(cfg.placement, stale_after_s=cfg.stale_after_s)

    async def on_training(ts: TrainingState, _: Incoming) -> None:
        placer.on_training_state(ts)

    async def launch(node: str, msg: Launch) -> LaunchReply:
        try:
            data = await bus.request(subjects.launch(node), msg, timeout_s=cfg.launch_timeout_s)
        except BusError as e:
            raise ConnectionError(str(e)) from None
        try:
            return decode_as(data, LaunchReply)
        except SchemaError as e:
            raise ConnectionError(f"bad reply: {e}") from None

    async def on_submit(inc: Incoming) -> None:
        await bus.reply(inc, await placer.submit(inc.data, launch))

    async def on_state_any(ns: NodeState, inc: Incoming) -> None:
        placer.on_node_alive(ns.node, ns.cores)
        await on_state(ns, inc)

    await bus.subscribe(subjects.STATE_ALL, on_state_any, expect=NodeState)
    await bus.subscribe(subjects.TRAINING_ALL, on_training, expect=TrainingState)
    await bus.subscribe_raw(subjects.SUBMIT, on_submit)
    await bus.subscribe_raw(subjects.TARGETS, on_target)
    await bus.subscribe_raw(subjects.TARGETS_GET, on_get)
    await bus.subscribe_raw(subjects.TARGETS_LIST, on_list)
    await bus.subscribe_raw(subjects.TARGETS_CLEAR, on_clear)
    await bus.subscribe_raw(subjects.CLUSTER_CONTAINERS, on_containers)
    await bus.subscribe_raw(subjects.CLUSTER_QUERY, on_query)
    await bus.subscribe_raw(subjects.CLUSTER_STATE, on_query)
    log.info("manager on %s: %d objective(s) stored in bucket %s", bus.url, len(mgr.objectives), cfg.bucket)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    if started is not None:
        started.set()
    try:
        while not stop.is_set():
            summary = mgr.cluster_state()
            if metrics is not None:
                latest[0] = summary
            await bus.publish_raw(subjects.CLUSTER_STATE, summary.to_json())
            changed.clear()
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(asyncio.sleep(cfg.cluster_interval_s))]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
    finally:
        await bus.drain()
        await store_bus.drain()
        if metrics is not None:
            metrics.stop()
        log.info("manager stopped (%d accepted, %d rejected targets)", mgr.accepted, mgr.rejected)
    return 0
