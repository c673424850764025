"""Following clusters: the History's tables, and the Collector over a real nats-server."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from dash_helpers import wait_until

from dashboard import live
from dashboard.live import Collector, History, TimeOrigin
from dashboard.synthetic import node_states
from services.manager.logic import aggregate
from shared import auth, subjects
from shared.bus import Bus

# --- History (no bus) -------------------------------------------------------------------------


def _feed(h: History, pairs) -> None:
    for ns, d in pairs:
        h.add_decision(d)
        h.add_state(ns)


@pytest.mark.parametrize("keep", [1000, 7])
def test_tables_built_a_little_at_a_time_equal_tables_built_at_once(keep):
    pairs = list(node_states(3, 4, 20, seed=2))
    once = History("x", keep, TimeOrigin(pairs[0][0].at))
    _feed(once, pairs)
    step = History("x", keep, TimeOrigin(pairs[0][0].at))
    for i in range(0, len(pairs), 5):  # a refresh after every five states
        _feed(step, pairs[i : i + 5])
        step.frames()
    a, b = once.frames(), step.frames()
    assert a[0].equals(b[0]) and a[1].equals(b[1])
    per_node = a[0].groupby("node").size()
    assert (per_node == min(keep, 20)).all()
    if keep < 20:  # only each node's newest samples are kept
        assert a[0].groupby("node")["node_round"].min().eq(20 - keep + 1).all()
        assert len(a[1]) == 3 * 4 * keep


def test_a_state_is_labelled_with_its_own_rounds_decision():
    pairs = list(node_states(1, 2, 3, seed=1))
    h = History("x")
    for _, d in pairs:
        h.add_decision(msgspec.structs.replace(d, listener=f"round {d.round}"))
    for ns, _ in pairs:  # states arrive after all three decisions
        h.add_state(ns)
    assert list(h.run().rounds["listener"]) == ["round 1", "round 2", "round 3"]


def test_twin_clusters_share_one_time_axis():
    origin = TimeOrigin()
    a, b = History("dqoes", origin=origin), History("default", origin=origin)
    pairs = list(node_states(1, 2, 2, seed=1))
    a.add_state(pairs[0][0])
    b.add_state(pairs[1][0])  # one round later
    assert a.run().rounds["t_s"].tolist() == [0.0]
    assert b.run().rounds["t_s"].tolist() == [pairs[1][0].at - pairs[0][0].at]


# --- Collector (real nats-server) -----------------------------------------------------------


async def _publish(url: str, pairs, cluster=None) -> None:
    async with await Bus.connect(url, "test-worker") as bus:
        for ns, d in pairs:
            await bus.publish(subjects.decisions(ns.node), d)
            await bus.publish(subjects.state(ns.node), ns)
        if cluster is not None:
            await bus.publish_raw(subjects.CLUSTER_STATE, cluster.to_json())
        await bus.flush()


@pytest.mark.integration
def test_collector_follows_node_states_and_the_cluster_summary(restartable_nats):
    url = restartable_nats.url
    coll = Collector([("dqoes", url)], retry_s=0.5).start()
    try:
        assert coll.wait_first_attempt(5)
        first = coll.snapshot().sources[0]
        assert first.status == live.CONNECTED and not first.has_data
        pairs = list(node_states(2, 5, 6, seed=3))
        states = [ns for ns, _ in pairs]
        cs = aggregate(states, at=states[-1].at)
        asyncio.run(_publish(url, pairs, cs))
        s = wait_until(lambda: (x := coll.snapshot().sources[0]).states == 12 and x.cluster and x)
        assert s.cluster == cs
        assert len(s.run.rounds) == 12 and len(s.run.containers) == 60
        assert s.run.live and s.run.policy == "dqoes" and s.run.containers_total == 10
        assert set(s.decisions) == {"worker-1", "worker-2"}
        assert s.decisions["worker-2"].round == 6
        # A target request with no manager on this server: a clear error, no exception.
        reply = coll.request_target("dqoes", {"container": "c01", "objective": 5.0}, 1.0)
        assert reply == {
            "ok": False,
            "error": f"no manager answers on dqoes.targets at {auth.redact(url)}",  # no password shown
            "answered": False,
        }
        assert coll.request_target("nope", {})["error"] == "no cluster named 'nope'"

        restartable_nats.stop()
        wait_until(lambda: coll.snapshot().sources[0].status == live.CONNECTING, 10)
        assert "lost the connection" in coll.snapshot().sources[0].error
        restartable_nats.start()
        wait_until(lambda: coll.snapshot().sources[0].status == live.CONNECTED, 15)
        more = list(node_states(2, 5, 7, seed=3))[12:]
        wait_until(lambda: asyncio.run(_publish(url, more)) or coll.snapshot().sources[0].states >= 14, 15)
    finally:
        coll.stop()


def test_no_cluster_is_reported_and_retried_not_raised():
    coll = Collector([("a", "nats://127.0.0.1:9")], retry_s=0.2, connect_timeout_s=0.5).start()
    try:
        assert coll.wait_first_attempt(5)
        snap = coll.snapshot()
        assert snap.all_unreachable and not snap.any_connected
        s = snap.sources[0]
        assert s.status == live.UNREACHABLE and "cannot connect to 127.0.0.1:9" in s.error
        assert not s.has_data and s.run.rounds.empty
        reply = coll.request_target("a", {"container": "c", "objective": 1.0})
        assert reply == {
            "ok": False,
            "error": "not connected to nats://127.0.0.1:9: nothing was sent",
            "answered": False,
        }
    finally:
        coll.stop()


def test_registered_collectors_are_found_by_their_sources():
    coll = Collector([("a", "nats://127.0.0.1:9")])
    assert live.registered([("a", "nats://127.0.0.1:9")]) is None
    live.register(coll)
    assert live.registered([("a", "nats://127.0.0.1:9")]) is coll
    assert live.registered([("b", "nats://127.0.0.1:9")]) is None
    with pytest.raises(ValueError, match="unique"):
        Collector([("a", "nats://x:1"), ("a", "nats://y:1")])
