"""Generated bad input at every entry point: nothing crashes, nothing stored changes.

Why: every message a peer or an operator sends enters through one of a few
doors (issue 11 lists them): target requests, latency events, decisions, node
states, objective hand-overs, control messages, scenario files and container
labels, and what the worker reads from a latency source (a container's metrics page, a
Prometheus server's answer). `fuzz(name, examples)` throws `examples` generated inputs (hypothesis:
random bytes, well-formed messages with hostile values, duplicate keys, huge
and tiny numbers) at one door, into the real code behind it (the manager's
logic with its store, the worker's logic on a simulated node, the parsers),
and checks after each one that

- nothing but the documented error came out (no exception, no traceback),
- an input refused changed nothing: the stored objectives, the worker's
  objectives and its policy parameters are what they were before.

`make fuzz` runs 10,000 inputs per entry point (bench/bench_fuzz.py);
tests/unit/test_fuzz.py runs a few hundred of each on every `make test`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.manager.logic import Manager
from services.worker.logic import Worker
from shared import schema, subjects
from shared.core import registry
from shared.core.controller import NodeController
from shared.core.policy import PolicyContext
from shared.core.quantiles import Histogram, window
from shared.latency.events import decode_latency_any
from shared.latency.exposition import ExpositionError, parse_metric
from shared.latency.sources import SourceAnswer, instant_value
from shared.latency.spec import LABELS as LATENCY_LABELS
from shared.latency.spec import parse_source
from shared.public import parse_target_reply
from shared.runtime.docker import parse_labels
from shared.runtime.factory import RuntimeSettings, make_runtime
from shared.scenarios.spec import ScenarioError, parse_scenario
from shared.schema import NodeState, SchemaError

NODE = "n1"
CONTAINERS = ("c1", "c2", "c3")

# --- generated values -------------------------------------------------------------------

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -0.0, 5e-324, 1e-300, 1e300, 2**62, 2**63, 2**64, -1, 0.0009, 0.001, 86400, 86401]),
)
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(["", " ", "c1", "n1", "a.b", "*", ">", "x" * 300]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT, st.binary(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(TEXT, inner, max_size=4)),
                      max_leaves=8)


def _mutated(fields: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A message's fields with some values replaced by hostile ones, some dropped, some added."""
    keys = list(fields)
    return st.builds(
        lambda repl, drop, extra: {**{k: v for k, v in fields.items() if k not in drop}, **repl, **extra},
        st.dictionaries(st.sampled_from(keys), VALUES, max_size=len(keys)),
        st.sets(st.sampled_from(keys), max_size=2),
        st.dictionaries(TEXT, SCALARS, max_size=2),
    )


def _wire(kind: str, fields: dict[str, Any]) -> st.SearchStrategy[bytes]:
    env = {"type": kind, "v": schema.SCHEMA_VERSION, "ts": time.time(), "sender": "fuzz"}
    return st.one_of(
        st.binary(max_size=200),
        _mutated({**env, **fields}).map(lambda m: msgpack.packb(m, use_bin_type=True, default=repr)),
    )


def _json_text(fields: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """JSON objects as a client might write them, duplicate keys included."""
    def dump(pairs: list[tuple[str, Any]]) -> bytes:
        body = ", ".join(f"{json.dumps(k)}: {json.dumps(v, default=repr)}" for k, v in pairs)
        return ("{" + body + "}").encode()

    pair = st.tuples(st.sampled_from([*fields, "container", "objective", "alpha", "x"]), SCALARS.filter(
        lambda v: not isinstance(v, bytes)))
    return st.one_of(
        _mutated(fields).map(lambda m: json.dumps(m, default=repr).encode()),
        st.lists(pair, min_size=1, max_size=5).map(dump),
        st.binary(max_size=120),
        _mutated(fields).map(lambda m: msgpack.packb(m, use_bin_type=True, default=repr)),
    )


LATENCY = {"container": "c1", "node": NODE, "latency_s": 2.0, "images": 10, "batch": 3, "cpu_s": 1.0}
DECISION = {"node": NODE, "policy": "dqoes", "round": 1, "at": 1.7e9, "interval_s": 10.0,
            "slack_sum_g_s": 0.0, "slack_sum_b_s": 0.0, "satisfied": 0,
            "containers": [{"container": "c1", "cls": "G", "slack_s": 1.0}]}
STATE = {"node": "n9", "policy": "dqoes", "cores": 4.0, "round": 1, "at": 1.7e9, "interval_s": 10.0,
         "slack_sum_g_s": 0.0, "slack_sum_b_s": 0.0, "satisfied": 1,
         "members": {"G": [], "S": ["c1"], "B": [], "pending": []},
         "containers": [{"container": "c1", "objective_s": 5.0}], "expected": ["c9"]}
OBJECTIVE = {"container": "c1", "objective_s": 5.0, "alpha": 0.2, "revision": 3}
CONTROL = {"alpha": 0.2, "beta": 0.1, "initial_interval_s": 10.0, "max_interval_s": 100.0,
           "params": {"beta": 0.2}}
TARGET = {"container": "c1", "objective": 5.0, "alpha": 0.2}
SERVICE_TARGET = {"service": "app=api", "objective": 0.2, "percentile": 95, "window_s": 30}
SERVICE_OBJECTIVE = {"selector": "api", "objective_s": 0.2, "alpha": 0.1, "revision": 3, "percentile": 95.0,
                     "window_s": 30.0}
SCENARIO = {"name": "f", "duration_s": 100, "nodes": [{"name": NODE, "cores": 2}],
            "models": [{"name": "m", "work_cpu_s": 1.0, "threads": 1}],
            "containers": [{"name": "c1", "model": "m", "objective_s": 3.0}]}
LABELS = {"dqoes.managed": "true", "dqoes.objective_s": "5", "dqoes.alpha": "0.2",
          "dqoes.latency.source": "prometheus", "dqoes.latency.port": "8000",
          "dqoes.latency.metric": "m", "dqoes.latency.percentile": "95", "dqoes.latency.window_s": "10"}
PAGE_LINES = ("# TYPE m histogram", 'm_bucket{le="0.1"} 3', 'm_bucket{le="+Inf"} 5', "m_count 5", "m_sum 1.5",
              "# TYPE m summary", 'm{quantile="0.95"} 0.4', 'm{quantile="0.5",x="y"} 0.1',
              "# HELP m Latency.", 'm_bucket{le="0.2",route="/a"} 4', "m_bucket 1")
MATCHES = ("path=/v2/models/m/infer", "route=/a,method=POST", "a=1,a=2", "=x", "a=b=c", "a=\u00e9,")
PROMQL_ANSWER = {"status": "success", "data": {"resultType": "vector",
                                               "result": [{"metric": {}, "value": [1.7e9, "0.25"]}]}}

# --- the real code behind each door ---------------------------------------------------------


class MemoryStore:
    """The manager's Store in memory (revisions like a key-value bucket's)."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[int, bytes]] = {}
        self.rev = 0

    async def items(self) -> dict[str, tuple[int, bytes]]:
        return dict(self.data)

    async def put(self, key: str, value: bytes) -> int:
        self.rev += 1
        self.data[key] = (self.rev, value)
        return self.rev

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)


class Harness:
    """A manager (memory store) and a worker on a simulated node, one event loop for all inputs."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = MemoryStore()
        self.sent: list[Any] = []

        async def send(subject: str, msg: Any) -> None:
            self.sent.append(msg)

        self.manager = Manager(self.store, send)
        scenario = parse_scenario({**SCENARIO, "containers": [
            {"name": c, "model": "m", "objective_s": 3.0} for c in CONTAINERS]})
        runtime = make_runtime(RuntimeSettings(kind="sim", node=NODE, scenario=scenario))
        policy = registry.build("dqoes", {}, PolicyContext(runtime.latency_curve))
        ctrl = NodeController(NODE, runtime.cores, policy)

        async def publish(subject: str, msg: Any) -> None:
            pass

        self.worker = Worker(NODE, runtime, ctrl, publish)
        for c in CONTAINERS:
            ctrl.add(c, runtime.now_s(), limit=None)
            ctrl.set_objective(c, 3.0, runtime.now_s(), None)
        now = time.time()
        self.run(self.manager.on_node_state(NodeState(
            node=NODE, policy="dqoes", cores=2.0, round=1, at=now, interval_s=10.0, slack_sum_g_s=0.0,
            slack_sum_b_s=0.0, satisfied=0, members={}, containers=(), expected=CONTAINERS)))
        self.run(self.manager.on_target(b'{"container": "c1", "objective": 4.0}'))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def snapshot(self) -> tuple[Any, ...]:
        ctrl = self.worker.ctrl
        return (dict(self.store.data),
                {n: (t.objective_s, t.alpha) for n, t in ctrl.containers.items()},
                ctrl.policy.params, dict(self.worker.service_objectives))

    def close(self) -> None:
        self.loop.close()


def _decode(data: bytes) -> Any:
    try:
        return schema.decode_envelope(data).msg
    except SchemaError:
        return None


def door_target(h: Harness, data: bytes) -> bool:
    reply = parse_target_reply(h.run(h.manager.on_target(data)))
    return bool(reply["ok"])


def door_latency(h: Harness, data: bytes) -> bool:
    """The worker's fast decoder must agree with the generic one on every input."""
    try:
        fast = schema.decode_latency(data)
    except SchemaError:
        fast = None
    msg = _decode(data)
    generic = msg if isinstance(msg, schema.LatencyEvent) else None
    assert fast == generic, f"decode_latency disagrees with decode on {data!r}: {fast!r} != {generic!r}"
    if fast is None:
        return False
    h.worker.on_latencies([(subjects.latency(fast.node, fast.container), fast)])
    return True


def door_latency_json(h: Harness, data: bytes) -> bool:
    """The nats source's JSON form: an event or SchemaError, and then the worker takes it as any other."""
    try:
        event = decode_latency_any(data)
    except SchemaError:
        return False
    h.worker.on_latencies([(subjects.latency(event.node, event.container), event)])
    return True


def door_decision(h: Harness, data: bytes) -> bool:
    msg = _decode(data)
    return isinstance(msg, schema.DecisionMsg)


def door_state(h: Harness, data: bytes) -> bool:
    msg = _decode(data)
    if not isinstance(msg, NodeState):
        return False
    h.run(h.manager.on_node_state(msg))
    h.manager.cluster_state()
    return True


def door_objective(h: Harness, data: bytes) -> bool:
    msg = _decode(data)
    if not isinstance(msg, schema.ObjectiveAssign):
        return False
    h.worker.on_objective(msg)
    return True


def door_service_objective(h: Harness, data: bytes) -> bool:
    msg = _decode(data)
    if not isinstance(msg, schema.ServiceObjective):
        return False
    h.worker.on_service_objective(msg)
    return True


def door_control(h: Harness, data: bytes) -> bool:
    msg = _decode(data)
    if not isinstance(msg, schema.ControlMsg):
        return False
    return bool(h.worker.on_control(msg).ok)


def door_scenario(h: Harness, data: bytes) -> bool:
    try:
        obj = json.loads(data)
    except ValueError:
        return False
    try:
        parse_scenario(obj)
    except ScenarioError:
        return False
    return True


def door_labels(h: Harness, data: bytes) -> bool:
    labels = msgpack.unpackb(data, raw=False)
    try:
        spec = parse_source(labels)
        assert 0 < spec.percentile < 100 and spec.window_s > 0 and spec.kind in ("nats", "prometheus", "promql")
        assert all(name and "," not in value and value.isprintable() for name, value in spec.match)
    except ValueError as e:
        assert "\n" not in str(e)
    objective_s, alpha, error = parse_labels(labels)
    assert objective_s is None or 0.001 <= objective_s <= 86400
    assert alpha is None or 0 < alpha < 1
    assert error is None or isinstance(error, str)
    return objective_s is not None or alpha is not None


def _labels() -> st.SearchStrategy[bytes]:
    text_or_number = st.one_of(TEXT, NUMBERS.map(repr), st.sampled_from([*LABELS.values(), "promql", "ms", *MATCHES]))
    return st.dictionaries(st.sampled_from([*LABELS, *LATENCY_LABELS, "x"]), text_or_number, max_size=6).map(
        lambda d: msgpack.packb(d, use_bin_type=True))


BEFORE = Histogram(((0.1, 1.0), (math.inf, 2.0)))


def door_metrics_page(h: Harness, data: bytes) -> bool:
    """A container's metrics page (the prometheus latency source): a snapshot or ExpositionError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    with contextlib.suppress(ExpositionError):  # the same page read through a matcher (dqoes.latency.match)
        parse_metric(text, "m", (("route", "/a"),))
    try:
        snapshot = parse_metric(text, "m")
    except ExpositionError:
        return False
    r = window(0.95, BEFORE, snapshot, 1.0)
    assert r.latency_s is None or (math.isfinite(r.latency_s) and r.latency_s >= 0), r
    assert r.rate_per_s is None or (math.isfinite(r.rate_per_s) and r.rate_per_s >= 0), r
    return False  # nothing is stored from a page


def _pages() -> st.SearchStrategy[bytes]:
    number = st.one_of(NUMBERS.map(repr), st.sampled_from(["+Inf", "-Inf", "NaN", "1e999", "0x10", ""]))
    line = st.one_of(st.sampled_from(PAGE_LINES), st.text(max_size=60),
                     st.builds(lambda name, le, v: f'{name}{{le="{le}"}} {v}',
                               st.sampled_from(["m_bucket", "m", "m_count"]), number, number),
                     st.builds(lambda q, v: f'm{{quantile="{q}"}} {v}', number, number),
                     st.builds(lambda v: f"m_count {v}", number))
    well_formed = st.lists(line, max_size=3).map(lambda ls: "\n".join([*PAGE_LINES[:5], *ls]).encode())
    return st.one_of(st.binary(max_size=200), st.lists(line, max_size=12).map(lambda ls: "\n".join(ls).encode()),
                     well_formed)


def door_promql_answer(h: Harness, data: bytes) -> bool:
    """A Prometheus server's answer to the promql latency source: one number, None or SourceAnswer."""
    try:
        value = instant_value(data)
    except SourceAnswer as e:
        assert "\n" not in str(e)
        return False
    assert value is None or isinstance(value, float)
    return False


@dataclass(frozen=True)
class Door:
    name: str
    inputs: Callable[[], st.SearchStrategy[bytes]]
    enter: Callable[[Harness, bytes], bool]
    """Feed one input; True when it was accepted (then a change is allowed)."""


DOORS: dict[str, Door] = {d.name: d for d in (
    Door("targets", lambda: _json_text(TARGET), door_target),
    Door("service-targets", lambda: _json_text(SERVICE_TARGET), door_target),
    Door("latency", lambda: _wire("latency", LATENCY), door_latency),
    Door("latency-json", lambda: _json_text(LATENCY), door_latency_json),
    Door("decisions", lambda: _wire("decision", DECISION), door_decision),
    Door("states", lambda: _wire("node_state", STATE), door_state),
    Door("objectives", lambda: _wire("objective", OBJECTIVE), door_objective),
    Door("service-objectives", lambda: _wire("service_objective", SERVICE_OBJECTIVE), door_service_objective),
    Door("control", lambda: _wire("control", CONTROL), door_control),
    Door("scenarios", lambda: _json_text(SCENARIO), door_scenario),
    Door("labels", _labels, door_labels),
    Door("metrics-pages", _pages, door_metrics_page),
    Door("promql-answers", lambda: _json_text(PROMQL_ANSWER), door_promql_answer),
)}


@dataclass
class FuzzResult:
    name: str
    inputs: int
    accepted: int
    seconds: float


def fuzz(name: str, examples: int, seed: int | None = None) -> FuzzResult:
    """Run `examples` generated inputs through one door; AssertionError (with the input) on a failure."""
    door = DOORS[name]
    h = Harness()
    counts = {"inputs": 0, "accepted": 0}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is not None,
              suppress_health_check=list(HealthCheck))
    @given(door.inputs())
    def check(data: bytes) -> None:
        before = h.snapshot()
        accepted = door.enter(h, data)
        counts["inputs"] += 1
        if accepted:
            counts["accepted"] += 1
        else:
            assert h.snapshot() == before, f"{name}: a refused input changed state: {data!r}"
        params = h.worker.ctrl.policy.params
        assert params.initial_interval_s >= 0.05 and math.isfinite(params.initial_interval_s)

    t0 = time.perf_counter()
    try:
        check()
    finally:
        h.close()
    return FuzzResult(name, counts["inputs"], counts["accepted"], time.perf_counter() - t0)


__all__ = ["DOORS", "FuzzResult", "fuzz"]
