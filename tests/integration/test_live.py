"""The live system over a real nats-server: events to decisions, objectives, durability, the cluster view."""

from __future__ import annotations

import asyncio
import json
import time

import orjson
import pytest

from services.cli.stack import Stack, StackSpec
from services.worker.app import WorkerConfig, build, serve
from shared import subjects
from shared.bus import Bus
from shared.natsd import NatsServer
from shared.public import ClusterState, parse_target_reply
from shared.scenarios.builtin import load
from shared.scenarios.spec import parse_scenario
from shared.schema import DecisionMsg, LatencyEvent, NodeState

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TWO = {
    "name": "two",
    "duration_s": 10000,
    "noise_sigma": 0.0,
    "nodes": [{"name": "n1", "cores": 2}],
    "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
    "containers": [
        {"name": "lax", "model": "m", "objective_s": 100.0},
        {"name": "strict", "model": "m", "objective_s": 2.0},
    ],
}


async def wait_for(pred, timeout_s: float = 20.0, every_s: float = 0.05):
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        v = pred()
        if v:
            return v
        await asyncio.sleep(every_s)
    raise AssertionError("condition not met in time")


async def test_latency_event_leads_to_a_decision_and_a_limit(nats_url, tmp_path):
    f = tmp_path / "two.json"
    f.write_text(json.dumps(TWO))
    app = await build(WorkerConfig(node="n1", nats_url=nats_url, scenario=str(f), time_scale=5.0, policy="dqoes",
                                   state_interval_s=0.2, initial_interval_s=10.0))
    task = asyncio.create_task(serve(app, handle_signals=False))
    watcher = await Bus.connect(nats_url, "test")
    decisions: list[DecisionMsg] = []
    await watcher.subscribe(subjects.decisions("n1"), lambda m, _: decisions.append(m), expect=DecisionMsg)
    try:
        # Both run alone at 2 s a batch: "lax" (100 s) is far in G. A container
        # reports a very fast batch as an inference container would.
        await wait_for(lambda: app.worker.ctrl.containers.get("lax"))
        ev = LatencyEvent(container="lax", node="n1", latency_s=1.0, images=100, batch=99)
        await watcher.publish(subjects.latency("n1", "lax"), ev)

        def limited():
            for d in decisions:
                for c in d.containers:
                    if c.container == "lax" and c.cls is not None and c.cls.value == "G" and c.new_limit is not None:
                        return d, c
            return None

        d, c = await wait_for(limited)
        assert c.old_limit is None and c.new_limit < 0.5
        sim = app.runtime._sim  # the simulated runtime applied it
        assert sim.containers["lax"].limit == pytest.approx(c.new_limit)
        assert app.worker.ctrl.containers["lax"].limit == pytest.approx(c.new_limit)
    finally:
        app.worker.stop()
        await task
        await watcher.close()


def stack_for(tmp_path, scenario, **kw) -> Stack:
    return Stack(StackSpec(scenario, time_scale=kw.pop("time_scale", 10.0), start_delay_s=1.0,
                           state_interval_s=0.3, **kw), run_dir=tmp_path / "run")


def no_tracebacks(stack: Stack) -> None:
    text = stack.logs()
    assert "Traceback" not in text, text[-3000:]


async def node_states(bus: Bus) -> dict[str, NodeState]:
    latest: dict[str, NodeState] = {}
    await bus.subscribe(subjects.STATE_ALL, lambda m, _: latest.__setitem__(m.node, m), expect=NodeState)
    return latest


class _Absent:
    cls = objective_s = alpha = None


def container(ns: NodeState, name: str):
    """The container's state in a node state (an empty stand-in before it starts)."""
    return next((c for c in ns.containers if c.container == name), _Absent)


async def test_json_objective_reaches_the_worker_and_changes_its_class(tmp_path):
    sc = parse_scenario(TWO)
    with stack_for(tmp_path, sc) as stack:
        bus = await Bus.connect(stack.url, "test")
        latest = await node_states(bus)
        await wait_for(lambda: "n1" in latest and container(latest["n1"], "lax").cls is not None)
        assert container(latest["n1"], "lax").cls.value == "G"
        # Plain publish, JSON, as any NATS client would.
        await bus.publish_raw(subjects.TARGETS, b'{"container": "lax", "objective": 0.5}')
        await wait_for(lambda: container(latest["n1"], "lax").objective_s == 0.5)
        await wait_for(lambda: container(latest["n1"], "lax").cls is not None
                       and container(latest["n1"], "lax").cls.value == "B")
        # Request/reply, with an alpha.
        reply = parse_target_reply(await bus.request(subjects.TARGETS, b'{"container":"lax","objective":2.0,"alpha":0.3}'))
        assert reply["ok"] and reply["node"] == "n1" and reply["running"] and reply["alpha"] == 0.3
        await wait_for(lambda: container(latest["n1"], "lax").alpha == 0.3)
        await wait_for(lambda: container(latest["n1"], "lax").cls is not None
                       and container(latest["n1"], "lax").cls.value == "S")
        await bus.close()
        no_tracebacks(stack)


async def kv_objectives(url: str) -> dict[str, dict]:
    bus = await Bus.connect(url, "test-kv")
    try:
        kv = await bus.kv(subjects.KV_OBJECTIVES)
        return {k: orjson.loads(v) for k, v in (await kv.items()).items()}
    finally:
        await bus.close()


async def test_objectives_survive_manager_worker_and_nats_restarts(tmp_path):
    sc = load("paper-varied")
    with stack_for(tmp_path, sc, time_scale=5.0) as stack:
        bus = await Bus.connect(stack.url, "test")
        latest = await node_states(bus)
        await wait_for(lambda: "worker-1" in latest and len(latest["worker-1"].containers) == 10)
        wanted = {"c01": 30.0, "c02": 45.5, "c03": 12.0}
        for c, o in wanted.items():
            r = parse_target_reply(await bus.request(subjects.TARGETS, orjson.dumps({"container": c, "objective": o})))
            assert r["ok"], r
        # and one for a service (every ResNet-50 without its own): it survives the restarts too
        r = parse_target_reply(await bus.request(subjects.TARGETS, orjson.dumps(
            {"service": "dqoes.model=resnet50", "objective": 60.0, "percentile": 90, "window_s": 100})))
        assert r["ok"], r
        await bus.close()

        # Manager and worker both restart: the worker forgets, the manager re-reads the bucket.
        stack.stop_process("manager")
        stack.stop_process("worker-worker-1")
        stack.start_manager()
        stack.start_worker("worker-1")
        bus = await Bus.connect(stack.url, "test2")
        latest = await node_states(bus)
        await wait_for(lambda: "worker-1" in latest and all(
            any(x.container == c and x.objective_s == o for x in latest["worker-1"].containers)
            for c, o in wanted.items()), timeout_s=30)
        await wait_for(lambda: sum(x.objective_s == 60.0 and x.percentile == 90.0 and x.container not in wanted
                                   for x in latest["worker-1"].containers) == 7, timeout_s=30)
        await bus.close()

        # The NATS server itself restarts on the same store: the bucket is on disk.
        stack.nats.restart()
        stored = await wait_for_async(lambda: kv_objectives(stack.url_for("store")))
        assert {k: v["objective_s"] for k, v in stored.items()} == {**wanted, "_service/dqoes.model=resnet50": 60.0}
        no_tracebacks(stack)


async def wait_for_async(fn, timeout_s: float = 20.0):
    t_end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < t_end:
        try:
            return await fn()
        except Exception as e:  # the manager/bucket may still be coming back
            last = e
            await asyncio.sleep(0.3)
    raise AssertionError(f"not ready in time: {last!r}")


async def test_cluster_state_adds_up_the_node_states(tmp_path):
    with NatsServer(store_dir=tmp_path / "store") as srv:
        stack = Stack(StackSpec(parse_scenario(TWO)), run_dir=tmp_path / "run", nats_url=srv.url)
        stack.start_manager()
        bus = await Bus.connect(srv.url, "fake-workers")
        try:
            states = []
            for i, (sat, g, b, qg, qb) in enumerate([(3, 2, 1, 30.0, -5.0), (1, 0, 4, 0.0, -40.5), (0, 0, 0, 0.0, 0.0)]):
                names = [f"n{i}c{k}" for k in range(sat + g + b + 1)]
                members = {"S": tuple(names[:sat]), "G": tuple(names[sat:sat + g]),
                           "B": tuple(names[sat + g:sat + g + b]), "pending": (names[-1],)}
                states.append(NodeState(
                    node=f"node-{i}", policy="dqoes", cores=4.0, round=7, at=time.time(), interval_s=10.0 * (i + 1),
                    slack_sum_g_s=qg, slack_sum_b_s=qb, satisfied=sat, members=members, containers=(),
                ))
            cs = None

            async def query():
                nonlocal cs
                for ns in states:
                    await bus.publish(subjects.state(ns.node), ns)
                cs = ClusterState.from_json(await bus.request(subjects.CLUSTER_QUERY, b"", timeout_s=2.0))
                return len(cs.nodes) == 3

            await wait_for_async(lambda: _true_or_raise(query()))
            assert cs.satisfied_total == 4
            assert (cs.G, cs.S, cs.B, cs.pending) == (2, 4, 5, 3)
            assert cs.slack_sum_g_s == pytest.approx(30.0) and cs.slack_sum_b_s == pytest.approx(-45.5)
            assert {n: v.interval_s for n, v in cs.nodes.items()} == {"node-0": 10.0, "node-1": 20.0, "node-2": 30.0}
            # Requests on the published subject are answered the same way.
            same = ClusterState.from_json(await bus.request(subjects.CLUSTER_STATE, b"", timeout_s=2.0))
            assert same.satisfied_total == 4
        finally:
            await bus.close()
            stack.stop()


async def _true_or_raise(coro):
    if not await coro:
        raise AssertionError("not yet")
    return True


FOLLOWERS = {
    "name": "followers",
    "duration_s": 10000,
    "noise_sigma": 0.02,
    "nodes": [{"name": "n1", "cores": 4}],
    # Threads follow the limit: "two" (2 CPU-s in 1.3 s) would need 1.54 cores of one thread's work, which
    # one thread cannot use: two whole cores (1 s a batch, met) or nothing.
    "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 4, "follows_limit": True}],
    "containers": [
        {"name": "two", "model": "m", "objective_s": 1.3},
        *({"name": n, "model": "m", "objective_s": 8.0} for n in ("b", "c", "d")),
    ],
}


async def test_a_simulated_node_says_its_threads_follow_and_the_learned_worker_gives_whole_cores(nats_url, tmp_path):
    """The sim runtime's batches go out on NATS with follows_limit, the worker hands it to the learned
    policy, and the limit it sets is two whole cores (1.9 would run one thread)."""
    f = tmp_path / "followers.json"
    f.write_text(json.dumps(FOLLOWERS))
    app = await build(WorkerConfig(node="n1", nats_url=nats_url, scenario=str(f), time_scale=10.0, policy="learned",
                                   state_interval_s=0.2, initial_interval_s=2.0))
    task = asyncio.create_task(serve(app, handle_signals=False))
    try:
        ctrl = app.worker.ctrl
        await wait_for(lambda: ctrl.containers.get("two") is not None and ctrl.containers["two"].follows_limit)
        await wait_for(lambda: ctrl.containers["two"].limit is not None
                       and abs(ctrl.containers["two"].limit * 4.0 - 2.0) < 1e-9, timeout_s=40.0)
        assert app.runtime._sim.containers["two"].limit * 4.0 == pytest.approx(2.0)
    finally:
        app.worker.stop()
        await task
