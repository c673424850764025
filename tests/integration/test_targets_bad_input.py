"""Bad input on the public dqoes.targets: a clear refusal, no crash, no stored objective changed.

A generated corpus (hypothesis) goes to a manager running as its own process
(with a worker, so containers are known), as requests and as plain publishes.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.bus import Bus, BusError
from shared.public import parse_target_reply
from shared.scenarios.builtin import load

pytestmark = pytest.mark.integration

GOOD = {"c01": 30.0, "c02": 44.0}

# msgpack can only carry integers in [-2**63, 2**64): keep junk encodable in both.
wire_ints = st.integers(-(2**63), 2**64 - 1)
junk_values = st.one_of(
    st.none(), st.booleans(), st.text(max_size=20), wire_ints,
    st.floats(allow_nan=True, allow_infinity=True), st.lists(wire_ints, max_size=3),
    st.dictionaries(st.text(max_size=5), wire_ints, max_size=2),
)
bad_objective = st.one_of(
    st.just(0), st.just(-1), st.just(-0.0), st.just(math.nan), st.just(math.inf), st.just(1e300),
    st.just(86400.5), st.just(True), st.just("40"), st.none(), st.just([40]),
    st.floats(max_value=0.0, allow_nan=False), st.floats(min_value=86401, allow_infinity=False),
)
bad_alpha = st.one_of(st.just(0), st.just(1), st.just(1.5), st.just(-0.2), st.just(math.nan), st.just("0.1"), st.just(True))
container = st.sampled_from(["c01", "c02", "c03"])
bad_percentile = st.one_of(st.just(0), st.just(100), st.just(-1), st.just(100.5), st.just(math.nan), st.just("95"),
                           st.floats(max_value=0.0, allow_nan=False), st.floats(min_value=100.0, allow_infinity=False))
bad_window = st.one_of(st.just(0), st.just(-1), st.just(-0.0), st.just(math.inf), st.just(3601), st.just("30"),
                       st.floats(max_value=0.0, allow_nan=False))
bad_service = st.one_of(st.sampled_from(["", "a b", "=api", "app=", "x=y=z", "-api", "api!", "*", ">", "a" * 300]),
                        junk_values.filter(lambda v: not isinstance(v, str) and v is not None))


@st.composite
def bad_payloads(draw) -> bytes:
    kind = draw(st.integers(0, 10))
    enc = draw(st.sampled_from(["json", "msgpack"]))

    def pack(obj):
        # json.dumps writes NaN/Infinity literally (not JSON, so refused as such);
        # orjson would turn them into null, which is a valid "no alpha".
        return json.dumps(obj).encode() if enc == "json" else msgpack.packb(obj)

    if kind == 0:
        return draw(st.binary(max_size=200))  # not JSON nor msgpack (mostly)
    if kind == 1:
        return pack(draw(junk_values))  # not a map
    if kind == 2:
        return pack({"container": draw(container), "objective": draw(bad_objective)})
    if kind == 3:
        return pack({"container": draw(container), "objective": 30, "alpha": draw(bad_alpha)})
    if kind == 4:
        extra = draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in (
            "container", "service", "objective", "objective_s", "alpha", "percentile", "window_s")))
        return pack({"container": draw(container), "objective": 30, extra: draw(junk_values)})
    if kind == 5:
        return pack({"container": draw(junk_values.filter(lambda v: not isinstance(v, str))), "objective": 30})
    if kind == 6:
        return pack({"container": draw(st.sampled_from(["ghost", "c99", "c01.x", "a b", "*", ">"])), "objective": 30})
    if kind == 7:
        return pack({"objective": 30} if draw(st.booleans()) else {"container": "c01"})
    if kind == 8:  # a service objective with a bad percentile or window
        return pack({"service": draw(st.sampled_from(["api", "app=api"])), "objective": 0.2,
                     "percentile": draw(bad_percentile), "window_s": draw(st.one_of(st.just(30), bad_window))})
    if kind == 9:  # a service that is no service name nor key=value
        return pack({"service": draw(bad_service), "objective": 0.2})
    return b'{"container": "c01", "objective": ' + draw(st.sampled_from([b"NaN", b"Infinity", b"1e999", b"-5", b"0"])) + b"}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(StackSpec(load("paper-varied"), time_scale=5.0, start_delay_s=0.5, state_interval_s=0.3),
              run_dir=tmp_path_factory.mktemp("bad-input"))
    with s:
        yield s


class Client:
    """One connection, one event loop, for hypothesis's synchronous examples."""

    def __init__(self, url: str, reader_url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.bus = self.loop.run_until_complete(Bus.connect(url, "bad-input"))
        # Only the store identity (the manager's bucket connection) may read the bucket (shared/auth.py).
        self.reader = self.loop.run_until_complete(Bus.connect(reader_url, "bad-input-reader"))

    def request(self, payload: bytes) -> dict:
        return parse_target_reply(self.loop.run_until_complete(self.bus.request(subjects.TARGETS, payload, timeout_s=5)))

    def publish(self, payload: bytes) -> None:
        self.loop.run_until_complete(self.bus.publish_raw(subjects.TARGETS, payload))

    def stored(self) -> dict:
        async def go():
            kv = await self.reader.kv(subjects.KV_OBJECTIVES)
            return {k: orjson.loads(v)["objective_s"] for k, v in (await kv.items()).items()}
        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.bus.close())
        self.loop.run_until_complete(self.reader.close())
        self.loop.close()


@pytest.fixture(scope="module")
def client(stack):
    c = Client(stack.url, stack.url_for("store"))
    try:
        deadline = time.monotonic() + 30
        while True:  # until the manager answers and the worker has reported its containers
            try:
                if c.request(orjson.dumps({"container": "c01", "objective": GOOD["c01"]}))["ok"]:
                    break
            except BusError:
                pass
            assert time.monotonic() < deadline, stack.logs()[-2000:]
            time.sleep(0.2)
        assert c.request(orjson.dumps({"container": "c02", "objective": GOOD["c02"]}))["ok"]
        yield c
    finally:
        c.close()


@given(bad_payloads())
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_bad_requests_are_refused_and_change_nothing(client, payload):
    reply = client.request(payload)
    assert reply["ok"] is False
    assert isinstance(reply["error"], str) and reply["error"] and "\n" not in reply["error"]
    client.publish(payload)  # the same as a plain publish: must be harmless too


@pytest.mark.parametrize(
    "payload, words",
    [
        (b"\x00\xffnot json", "neither JSON nor msgpack"),
        (b'{"container": "c01", "objective": "fast"}', "objective"),
        (b'{"container": "c01", "objective": NaN}', "neither JSON"),
        (msgpack.packb({"container": "c01", "objective": math.nan}), "finite"),
        (b'{"container": "c01", "objective": -3}', "> 0"),
        (b'{"container": "c01", "objective": 0}', "> 0"),
        (b'{"container": "c01", "objective": 1e12}', "at most"),
        (b'{"container": "c01", "objective": 30, "objetive": 3}', "unknown field"),
        (b'{"container": "ghost", "objective": 30}', "unknown container 'ghost'"),
        (b'{"container": "c01", "objective": 30, "alpha": 2}', "alpha"),
        (b" " * 1_000_000, "bytes"),
        (b'{"service": "api", "objective": 0.2, "percentile": 100}', "percentile: must be a percentile in (0, 100)"),
        (b'{"service": "api", "objective": 0.2, "percentile": 0}', "percentile: must be a percentile in (0, 100)"),
        (b'{"service": "api", "objective": 0.2, "percentile": -5}', "percentile"),
        (b'{"container": "c01", "objective": 30, "percentile": 101}', "percentile"),
        (b'{"service": "api", "objective": 0.2, "percentile": 95, "window_s": 0}', "window_s: must be"),
        (b'{"service": "api", "objective": 0.2, "percentile": 95, "window_s": -30}', "window_s: must be"),
        (b'{"service": "api", "objective": 0.2, "window_s": 30}', "window needs a percentile"),
        (b'{"service": "a b", "objective": 0.2}', "service: must be a service name"),
        (b'{"service": "app=", "objective": 0.2}', "service: must be a service name"),
        (b'{"service": "=api", "objective": 0.2}', "service: must be a service name"),
        (b'{"service": ["api"], "objective": 0.2}', "service: must be a service name"),
        (b'{"container": "c01", "service": "api", "objective": 30}', "not both"),
    ],
)
def test_refusals_name_the_problem(client, payload, words):
    reply = client.request(payload)
    assert reply["ok"] is False and words in reply["error"], reply


@pytest.mark.parametrize(("subject", "payload", "words"), [
    (subjects.TARGETS_CLEAR, b'{"service": "a b"}', "service: must be a service name"),
    (subjects.TARGETS_CLEAR, b'{"service": "api"}', "no objective stored for service 'api'"),
    (subjects.TARGETS_CLEAR, b'{"service": "api", "container": "c01"}', "not both"),
    (subjects.TARGETS_GET, b'{"service": "x=y=z"}', "service: must be a service name"),
])
def test_bad_service_requests_on_get_and_clear_change_nothing(client, subject, payload, words):
    reply = parse_target_reply(client.loop.run_until_complete(client.bus.request(subject, payload, timeout_s=5)))
    assert reply["ok"] is False and words in reply["error"] and "\n" not in reply["error"], reply


def test_nothing_stored_changed_and_nothing_crashed(client, stack):
    assert client.stored() == GOOD
    assert stack.dead() == {}
    text = stack.logs()
    assert "Traceback" not in text
    assert "rejected" in (stack.run_dir / "manager.log").read_text()
