"""The bus against a real nats-server: what every service relies on.

Each test uses its own node name, so tests sharing the session's server
never see each other's messages. Tests that restart the server get their
own (`restartable_nats`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from services.manager.logic import aggregate
from shared import public, schema, subjects
from shared.bus import Bus, BusError, Incoming, KVConflict, KVEntry, NoResponders, RequestTimeout
from shared.natsd import NatsServer
from shared.schema import ControlMsg, LatencyEvent, ObjectiveAssign

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(60)]

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def unique(prefix: str = "n") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def wait_until(pred: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or pred}")
        await asyncio.sleep(0.01)


def latency(node: str, batch: int, container: str = "c.1") -> LatencyEvent:
    return LatencyEvent(container=container, node=node, latency_s=1.5, images=10, batch=batch)


async def two_buses(url: str) -> tuple[Bus, Bus]:
    return await Bus.connect(url, "pub"), await Bus.connect(url, "sub")


@pytest.mark.parametrize("kind", ["latency", "decision", "node_state", "objective", "control"])
async def test_each_message_type_round_trips(nats_url, kind):
    sample = schema.decode((GOLDEN / f"{kind}.msgpack").read_bytes())
    pub, sub = await two_buses(nats_url)
    got: list[tuple[schema.Message, Incoming]] = []
    node = unique()
    await sub.subscribe(subjects.state(node), lambda m, inc: got.append((m, inc)))
    await sub.flush()
    await pub.publish(subjects.state(node), sample, ts=1234.5)
    await wait_until(lambda: got, what=kind)
    msg, inc = got[0]
    assert msg == sample
    assert (inc.subject, inc.sender, inc.ts) == (subjects.state(node), "pub", 1234.5)
    assert schema.decode(inc.data) == sample
    await pub.drain()
    await sub.drain()


async def test_a_malformed_payload_is_dropped_counted_and_logged_once(nats_url, caplog):
    caplog.set_level(logging.WARNING, logger="shared.bus")
    pub, sub = await two_buses(nats_url)
    node = unique()
    got: list[LatencyEvent] = []
    s = await sub.subscribe(subjects.latency_of_node(node), lambda m, inc: got.append(m))
    await sub.flush()
    await pub.publish(subjects.latency(node, "c.1"), latency(node, 1))
    for bad in (b"garbage", b"\x81\xa4type\xa6gossip", orjson.dumps({"type": "latency"})):
        await pub.publish_raw(subjects.latency(node, "c.1"), bad)
    await pub.publish(subjects.latency(node, "c.1"), latency(node, 2))
    await wait_until(lambda: len(got) == 2, what="the good messages")
    assert [m.batch for m in got] == [1, 2]
    assert sub.dropped == 3 and s.dropped == 3 and s.delivered == 2
    assert sub.dropped_by_subject[subjects.latency_of_node(node)] == 3
    drops = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(drops) == 1, "rate limited: one line for the burst"
    assert drops[0].levelno == logging.WARNING and drops[0].exc_info is None
    assert "\n" not in drops[0].getMessage()
    await pub.drain()
    await sub.drain()
    # the rest of the burst is reported at shutdown, again without a traceback
    assert any("2 more undecodable" in r.getMessage() for r in caplog.records)


async def test_a_handler_that_raises_does_not_stop_the_subscription(nats_url, caplog):
    caplog.set_level(logging.ERROR, logger="shared.bus")
    pub, sub = await two_buses(nats_url)
    node = unique()
    seen: list[int] = []

    async def handler(m: LatencyEvent, inc: Incoming) -> None:
        seen.append(m.batch)
        if m.batch % 2:
            raise RuntimeError(f"bad batch {m.batch}")

    s = await sub.subscribe(subjects.latency_of_node(node), handler)
    await sub.flush()
    for batch in range(6):
        await pub.publish(subjects.latency(node, "c1"), latency(node, batch, "c1"))
    await wait_until(lambda: len(seen) == 6)
    assert seen == [0, 1, 2, 3, 4, 5]
    assert s.failed == 3 and sub.handler_errors == 3
    errors = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(errors) == 1 and "RuntimeError('bad batch 1')" in errors[0].getMessage()
    assert errors[0].exc_info is None and "\n" not in errors[0].getMessage()
    await pub.drain()
    await sub.drain()


async def test_expect_drops_other_message_types(nats_url):
    pub, sub = await two_buses(nats_url)
    node = unique()
    got: list[schema.Message] = []
    await sub.subscribe(
        subjects.objectives(node), lambda m, inc: got.append(m), expect=ObjectiveAssign
    )
    await sub.flush()
    await pub.publish(subjects.objectives(node), ControlMsg(alpha=0.2))
    await pub.publish(
        subjects.objectives(node), ObjectiveAssign(container="c1", objective_s=4, revision=1)
    )
    await wait_until(lambda: got)
    assert got == [ObjectiveAssign(container="c1", objective_s=4.0, revision=1)]
    assert sub.dropped == 1
    await pub.drain()
    await sub.drain()


async def test_request_reply_with_the_public_target_format(nats_url):
    server, client = await two_buses(nats_url)
    subject = f"{subjects.TARGETS}.{unique('t')}"  # private copy of the public subject

    async def serve(inc: Incoming) -> None:
        try:
            t = public.parse_target(inc.data)
        except schema.SchemaError as e:
            await server.reply(inc, public.target_reply_error(str(e)))
            return
        await server.reply(
            inc, public.target_reply_ok(container=t.container, objective_s=t.objective_s)
        )

    await server.subscribe_raw(subject, serve)
    await server.flush()
    ok = orjson.loads(await client.request(subject, b'{"container":"c01","objective":40}'))
    assert ok == {"ok": True, "container": "c01", "objective_s": 40.0}
    bad = orjson.loads(await client.request(subject, b'{"container":"c01","objetive":40}'))
    assert bad["ok"] is False and "unknown field 'objetive'" in bad["error"]
    await server.drain()
    await client.drain()


async def test_reply_to_a_message_without_reply_subject_is_a_no_op(nats_url):
    bus = await Bus.connect(nats_url, "x")
    assert await bus.reply(Incoming("s", "", b""), b"x") is False
    await bus.drain()


async def test_requests_fail_with_one_line_errors(nats_url):
    bus = await Bus.connect(nats_url, "client")
    with pytest.raises(NoResponders, match="no responders on dqoes.nobody"):
        await bus.request("dqoes.nobody", b"{}", timeout_s=1.0)
    subject = unique("dqoes.silent")
    await bus.subscribe_raw(subject, lambda inc: None)  # listens, never answers
    with pytest.raises(RequestTimeout, match=f"no reply on {subject} within 0.2 s"):
        await bus.request(subject, b"{}", timeout_s=0.2)
    await bus.drain()


async def test_publish_json_reaches_raw_subscribers(nats_url):
    pub, sub = await two_buses(nats_url)
    subject = f"{subjects.CLUSTER_STATE}.{unique('c')}"
    got: list[bytes] = []
    await sub.subscribe_raw(subject, lambda inc: got.append(inc.data))
    await sub.flush()
    state = aggregate([], at=5.0)
    await pub.publish_json(subject, state)
    await pub.publish_json(subject, {"hello": [1, 2]})
    await wait_until(lambda: len(got) == 2)
    assert public.ClusterState.from_json(got[0]) == state
    assert orjson.loads(got[1]) == {"hello": [1, 2]}
    await pub.drain()
    await sub.drain()


async def test_a_queue_group_delivers_each_message_once(nats_url):
    pub = await Bus.connect(nats_url, "pub")
    members = [await Bus.connect(nats_url, f"m{i}") for i in range(2)]
    node = unique()
    got: list[int] = []
    for m in members:
        await m.subscribe(
            subjects.latency_of_node(node), lambda msg, inc: got.append(msg.batch), queue="workers"
        )
        await m.flush()
    for batch in range(20):
        await pub.publish(subjects.latency(node, "c1"), latency(node, batch, "c1"))
    await wait_until(lambda: len(got) == 20)
    await asyncio.sleep(0.1)
    assert sorted(got) == list(range(20))
    for b in [pub, *members]:
        await b.drain()


async def test_drain_delivers_everything_published_before_it(nats_url):
    pub, sub = await two_buses(nats_url)
    node = unique()
    got: list[int] = []

    async def slow(m: LatencyEvent, inc: Incoming) -> None:
        if m.batch % 500 == 0:
            await asyncio.sleep(0.01)
        got.append(m.batch)

    await sub.subscribe(subjects.latency_of_node(node), slow)
    await sub.flush()
    n = 3000
    for batch in range(n):
        await pub.publish(subjects.latency(node, "c1"), latency(node, batch, "c1"))
    await pub.drain()  # no flush before: drain must send what is still buffered
    await wait_until(lambda: len(got) == n, timeout_s=10.0, what=f"{n} messages")
    await sub.drain()
    assert got == list(range(n))


async def test_subscriber_drain_finishes_messages_already_received(nats_url):
    pub, sub = await two_buses(nats_url)
    node = unique()
    got: list[int] = []

    async def slow(m: LatencyEvent, inc: Incoming) -> None:
        await asyncio.sleep(0.005)
        got.append(m.batch)

    await sub.subscribe(subjects.latency_of_node(node), slow)
    await sub.flush()
    for batch in range(50):
        await pub.publish(subjects.latency(node, "c1"), latency(node, batch, "c1"))
    await pub.flush()
    await asyncio.sleep(0.1)  # all 50 are at the subscriber, most not handled yet
    await sub.drain()
    assert got == list(range(50))
    await pub.drain()


async def test_connect_timeout_is_one_clear_line():
    with NatsServer(jetstream=False) as srv:
        url = srv.url
    t0 = time.monotonic()
    with pytest.raises(BusError) as info:
        await Bus.connect(url, "lonely", connect_timeout_s=1.0)
    assert time.monotonic() - t0 < 3.0
    text = str(info.value)
    assert text.startswith(f"cannot connect to NATS at {url} within 1 s")
    assert "\n" not in text


async def test_kv_put_get_delete_keys_and_watch(nats_url):
    bus = await Bus.connect(nats_url, "kv")
    kv = await bus.kv(unique("b").replace("-", "_"))
    assert await kv.keys() == [] and await kv.get("c01") is None
    seen: list[KVEntry] = []
    rev = await kv.put("c01", b"40")
    watch = await kv.watch(seen.append)
    await asyncio.wait_for(watch.ready.wait(), 5)
    assert [(e.key, e.value) for e in seen] == [("c01", b"40")]
    assert seen[0].revision == rev
    await kv.put("web.1", b"12")
    await kv.delete("c01")
    await wait_until(lambda: len(seen) == 3)
    assert [(e.key, e.value) for e in seen[1:]] == [("web.1", b"12"), ("c01", None)]
    assert seen[2].deleted
    assert await kv.keys() == ["web.1"]
    assert await kv.items() == {"web.1": b"12"}
    assert await kv.get("c01") is None
    entry = await kv.get_entry("web.1")
    assert entry is not None and entry.value == b"12"
    with pytest.raises(ValueError, match="invalid key-value key"):
        await kv.put("a b", b"x")
    await bus.drain()


async def test_kv_create_and_update_are_compare_and_set(nats_url):
    bus = await Bus.connect(nats_url, "kv-cas")
    try:
        bucket = unique("cas").replace("-", "_")
        kv = await bus.kv(bucket)
        rev = await kv.create("lease", b"a")
        with pytest.raises(KVConflict) as exists:
            await kv.create("lease", b"b")
        assert str(exists.value) == f"kv {bucket}: 'lease' exists"
        rev2 = await kv.update("lease", b"a2", last=rev)
        with pytest.raises(KVConflict) as stale:
            await kv.update("lease", b"stale", last=rev)
        assert str(stale.value) == f"kv {bucket}: 'lease' changed since revision {rev}"
        with pytest.raises(ValueError, match="invalid key-value key 'a b'"):
            await kv.update("a b", b"x", last=rev)
        assert await kv.get("lease") == b"a2" and rev2 > rev
        await kv.delete("lease")
        assert await kv.create("lease", b"c") > rev2  # a deleted key may be created again
    finally:
        await bus.close()


async def test_kv_needs_jetstream_and_says_so():
    with NatsServer(jetstream=False) as srv:
        bus = await Bus.connect(srv.url, "kv")
        with pytest.raises(BusError, match="JetStream is not enabled"):
            await bus.kv("objectives")
        await bus.close()


async def test_kv_values_survive_a_server_restart(restartable_nats):
    srv = restartable_nats
    bucket = subjects.KV_OBJECTIVES
    writer = await Bus.connect(srv.url, "manager")
    kv = await writer.kv(bucket)
    await kv.put(subjects.kv_key("web.1"), b"40")
    await kv.put("c02", b"12")
    await kv.delete("c02")
    await writer.drain()

    srv.restart()

    # A fresh client on the same URL finds the bucket and the values.
    reader = await Bus.connect(srv.url, "manager-2")
    kv2 = await reader.kv(bucket)
    assert await kv2.get("web.1") == b"40"
    assert await kv2.get("c02") is None
    assert await kv2.keys() == ["web.1"]
    await reader.drain()


async def test_a_connected_bus_rides_out_a_server_restart(restartable_nats, caplog):
    caplog.set_level(logging.INFO, logger="shared.bus")
    srv = restartable_nats
    pub, sub = await two_buses(srv.url)
    kv = await pub.kv("survive")
    await kv.put("k", b"v1")
    node = unique()
    got: list[int] = []
    await sub.subscribe(subjects.latency_of_node(node), lambda m, inc: got.append(m.batch))
    await sub.flush()

    srv.restart()
    await wait_until(lambda: pub.is_connected and sub.is_connected, timeout_s=10, what="reconnect")

    # Subscriptions are restored on reconnect; retry until the first message gets through.
    deadline = time.monotonic() + 10
    batch = 0
    while not got and time.monotonic() < deadline:
        await pub.publish(subjects.latency(node, "c1"), latency(node, batch, "c1"))
        batch += 1
        await asyncio.sleep(0.1)
    assert got, "no message after the restart"

    # JetStream calls may time out while the server recovers; the value is there after.
    deadline = time.monotonic() + 15
    while True:
        try:
            assert await kv.get("k") == b"v1"
            break
        except BusError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)

    lines = [r.getMessage() for r in caplog.records]
    assert sum("disconnected from NATS" in m for m in lines) == 2  # one line per bus
    assert sum("reconnected to NATS" in m for m in lines) == 2
    assert all(r.exc_info is None for r in caplog.records)
    await pub.drain()
    await sub.drain()


async def test_publishing_after_close_is_a_bus_error(nats_url):
    bus = await Bus.connect(nats_url, "x")
    await bus.close()
    with pytest.raises(BusError, match="publish on dqoes.state.n1 failed"):
        await bus.publish(subjects.state("n1"), ControlMsg())


# --- the private server itself ------------------------------------------------------------


def test_nats_server_restarts_on_the_same_port_and_store(tmp_path):
    with NatsServer(store_dir=tmp_path / "store", log_path=tmp_path / "log") as srv:
        url, port = srv.url, srv.port
        assert url == f"nats://127.0.0.1:{port}" and srv.running
        srv.stop()
        assert not srv.running
        srv.start()
        assert srv.url == url and (tmp_path / "store" / "jetstream").is_dir()
    assert not srv.running
    assert (tmp_path / "store").is_dir(), "a given store dir is left alone"


def test_nats_server_errors_are_one_clear_line(tmp_path, monkeypatch):
    from shared.natsd import NatsServerError, find_binary

    monkeypatch.setenv("DQOES_NATS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(NatsServerError, match="DQOES_NATS_SERVER=.*nope is not an executable"):
        find_binary()
    monkeypatch.delenv("DQOES_NATS_SERVER")
    bad = NatsServer(
        extra_args=("--no-such-flag",), store_dir=tmp_path / "s", log_path=tmp_path / "bad.log"
    )
    with pytest.raises(
        NatsServerError, match=r"exited with status \d+ before it was ready; log tail: .*"
    ):
        bad.start()
    assert not bad.running
    with pytest.raises(NatsServerError, match="has not been started"):
        NatsServer(jetstream=False, log_path=tmp_path / "x.log").url  # noqa: B018
