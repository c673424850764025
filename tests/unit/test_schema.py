"""The wire schema: round trips, golden bytes, errors that name the field, hostile input.

Golden files in tests/fixtures/golden/ pin the bytes of one fixed instance
of each message. If a change to the schema is intended, regenerate them with
DQOES_UPDATE_GOLDEN=1 and say so in the change: every deployed peer reads
these bytes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import msgpack
import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.manager.logic import aggregate
from shared import public, schema, subjects
from shared.core.types import Cls, ContainerDecision, Decision
from shared.public import ClusterState
from shared.schema import (
    ContainerDecisionMsg,
    ContainerState,
    ControlMsg,
    ControlReply,
    DecisionMsg,
    JobDone,
    LatencyEvent,
    Launch,
    LaunchReply,
    NodeState,
    ObjectiveAssign,
    Progress,
    SchemaError,
    ServiceObjective,
    TrainingJobState,
    TrainingState,
)
from shared.subjects import MAX_ID_CHARS

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
GOLDEN_TS = 1700000000.25
GOLDEN_SENDER = "golden"

SAMPLES: dict[str, schema.Message] = {
    "latency": LatencyEvent(
        container="resnet.1",
        node="node-a",
        latency_s=12.5,
        images=100,
        cpu_s=11.75,
        batch=7,
        model="resnet50",
        finished_at=1700000000.0,
        follows_limit=True,
    ),
    "decision": DecisionMsg(
        node="node-a",
        policy="dqoes",
        round=42,
        at=1700000000.0,
        event="objective",
        listener="converging",
        interval_s=20.0,
        slack_sum_g_s=5.0,
        slack_sum_b_s=-3.5,
        satisfied=1,
        containers=(
            ContainerDecisionMsg(
                container="resnet.1",
                cls=Cls.G,
                slack_s=5.0,
                latency_s=35.0,
                cpu_share=0.5,
                old_limit=0.5,
                new_limit=0.45,
                reason="G: give back",
            ),
            ContainerDecisionMsg(
                container="minilm",
                cls=Cls.B,
                slack_s=-3.5,
                latency_s=13.5,
                cpu_share=0.25,
                old_limit=0.25,
                new_limit=0.3,
                reason="B: take",
            ),
            ContainerDecisionMsg(
                container="fresh",
                cls=None,
                slack_s=None,
                latency_s=None,
                cpu_share=None,
                old_limit=None,
                new_limit=None,
                reason="pending",
            ),
        ),
        extra={"r_g": 0.5, "r_b": 0.25},
    ),
    "node_state": NodeState(
        node="node-a",
        policy="dqoes",
        cores=2.0,
        round=42,
        at=1700000000.0,
        interval_s=20.0,
        slack_sum_g_s=5.0,
        slack_sum_b_s=-3.5,
        satisfied=1,
        members={"G": ("resnet.1",), "S": ("mobilenet",), "B": ("minilm",), "pending": ("fresh",)},
        containers=(
            ContainerState(
                container="resnet.1",
                model="resnet50",
                objective_s=40.0,
                alpha=0.1,
                latency_s=35.0,
                cls=Cls.G,
                slack_s=5.0,
                limit=0.45,
                cpu_share=0.5,
                managed=True,
                met=True,
                cpu_cores_used=1.0,
                throttled_ratio=0.25,
                last_batch_at=1699999990.0,
            ),
            ContainerState(
                container="mobilenet",
                model="mobilenetv2",
                objective_s=10.0,
                alpha=0.1,
                latency_s=10.5,
                cls=Cls.S,
                slack_s=-0.5,
                limit=0.2,
                cpu_share=0.2,
                managed=True,
                objective_source="label",
            ),

            ContainerState(
                container="minilm", objective_s=10.0, latency_s=13.5, cls=Cls.B, slack_s=-3.5,
                objective_selector="app=nlp", percentile=95.0, window_s=30.0, request_rate_per_s=12.5,
            ),
            ContainerState(container="fresh", objective_s=5.0),
        ),
        expected=("later",),
        params={"alpha": 0.1, "beta": 0.1, "initial_interval_s": 10.0},
        met=2,
        cpu_cores_used=1.4,
        cpu_cores_idle=0.6,
        service_objectives={"app=nlp": 7},
    ),
    "objective": ObjectiveAssign(container="resnet.1", objective_s=40.0, alpha=0.05, revision=3,
                                 percentile=95.0, window_s=30.0),
    "service_objective": ServiceObjective(selector="app=api", objective_s=0.2, alpha=0.1, revision=7,
                                          percentile=99.0, window_s=30.0),
    "control": ControlMsg(alpha=0.2, beta=0.15, initial_interval_s=5.0, max_interval_s=80.0,
                          params={"dead_band": 0.05}, policy="learned"),
    "control_reply": ControlReply(node="node-a", policy="dqoes", ok=True,
                                  params={"alpha": 0.2, "beta": 0.15}, changed=("alpha", "beta")),
    "progress": Progress(job="job-1", node="node-a", value=1.25, epoch=3, step=120, eval_fn="cross entropy",
                         model="cnn", cpu_s=4.5, at=1700000000.0),
    "job_done": JobDone(job="job-1", node="node-a", epochs=30, duration_s=95.5, value=0.05),
    "training_state": TrainingState(
        node="node-a", policy="flowcon", cores=4.0, round=7, at=1700000000.0, interval_s=20.0, training_share=0.75,
        jobs=(TrainingJobState(job="job-1", stage="CL", model="vae", value=160.5, progress=0.01, growth=0.004,
                               cpu_cores=1.0, limit=0.25),
              TrainingJobState(job="job-2", stage="NL", model="cnn", limit=1.0, stale=True)),
        alpha=0.0125, free_competition=False),
    "launch": Launch(job="job-3", model="gru", epochs=40, image="dqoes-workload", threads=1, seed=2),
    "launch_reply": LaunchReply(ok=False, node="node-a", job="job-3", error="unknown image 'x'"),
}

V3_ONLY = {"service_objective", "control_reply", "progress", "job_done", "training_state", "launch", "launch_reply"}
"""Message types that did not exist before version 3 (no older fixtures)."""
OLD_KINDS = sorted(set(SAMPLES) - V3_ONLY)


def as_before_objectives(msg):
    """The sample as a v3 sender before service and percentile objectives wrote it (v3-early fixtures)."""
    if isinstance(msg, NodeState):
        return msgspec.structs.replace(
            msg, service_objectives={}, containers=tuple(
                msgspec.structs.replace(c, objective_selector=None, percentile=None, window_s=None,
                                        request_rate_per_s=None) for c in msg.containers))
    if isinstance(msg, ObjectiveAssign):
        return msgspec.structs.replace(msg, percentile=None, window_s=None)
    return msg


def as_before_v3(msg):
    """The sample as a v1/v2 sender wrote it: the fields version 3 added at their defaults."""
    msg = as_before_objectives(msg)
    if isinstance(msg, NodeState):
        return msgspec.structs.replace(
            msg, met=None, cpu_cores_used=None, cpu_cores_idle=None,
            containers=tuple(msgspec.structs.replace(c, met=None, cpu_cores_used=None, throttled_ratio=None,
                                                 last_batch_at=None, objective_source=None)
                             for c in msg.containers))
    if isinstance(msg, ControlMsg):
        return msgspec.structs.replace(msg, params={}, policy=None)
    if isinstance(msg, LatencyEvent):  # added later within v3, optional like the others
        return msgspec.structs.replace(msg, follows_limit=False)
    return msg

MESSAGE_CLASSES = {
    "latency": LatencyEvent,
    "decision": DecisionMsg,
    "node_state": NodeState,
    "objective": ObjectiveAssign,
    "service_objective": ServiceObjective,
    "control": ControlMsg,
    "control_reply": ControlReply,
    "progress": Progress,
    "job_done": JobDone,
    "training_state": TrainingState,
    "launch": Launch,
    "launch_reply": LaunchReply,
}


def golden_map(kind: str) -> dict:
    return msgpack.unpackb(schema.encode(SAMPLES[kind], GOLDEN_SENDER, GOLDEN_TS), raw=False)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# --- golden bytes ---------------------------------------------------------------------


def test_every_message_type_has_a_sample():
    assert set(SAMPLES) == set(schema.MESSAGE_TYPES) == set(MESSAGE_CLASSES)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_encode_reproduces_the_golden_bytes(kind):
    path = GOLDEN / f"{kind}.msgpack"
    data = schema.encode(SAMPLES[kind], GOLDEN_SENDER, GOLDEN_TS)
    if os.environ.get("DQOES_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    assert path.exists(), f"missing {path}; run with DQOES_UPDATE_GOLDEN=1 once"
    assert data == path.read_bytes(), f"{kind}: the wire format changed"


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_golden_bytes_decode_to_the_sample(kind):
    env = schema.decode_envelope((GOLDEN / f"{kind}.msgpack").read_bytes())
    assert env.msg == SAMPLES[kind]
    assert (env.type, env.v, env.ts, env.sender) == (kind, 3, GOLDEN_TS, GOLDEN_SENDER)


@pytest.mark.parametrize("kind", ["node_state", "objective"])
def test_v3_bytes_from_before_service_objectives_still_decode(kind):
    """Service and percentile objectives only added optional fields: earlier v3 bytes decode unchanged."""
    env = schema.decode_envelope((GOLDEN / "v3-early" / f"{kind}.msgpack").read_bytes())
    assert env.msg == as_before_objectives(SAMPLES[kind])
    assert env.v == 3


@pytest.mark.parametrize("kind", OLD_KINDS)
def test_version_1_bytes_still_decode_to_the_sample(kind):
    """v1 named slack `q_s` and the class sums `q_g_s`/`q_b_s`; those names are still read."""
    env = schema.decode_envelope((GOLDEN / "v1" / f"{kind}.msgpack").read_bytes())
    assert env.msg == as_before_v3(SAMPLES[kind])
    assert env.v == 1


@pytest.mark.parametrize("kind", OLD_KINDS)
def test_version_2_bytes_still_decode_to_the_sample(kind):
    """v3 only added optional fields and a message type: v2 bytes decode, the new fields at defaults."""
    env = schema.decode_envelope((GOLDEN / "v2" / f"{kind}.msgpack").read_bytes())
    assert env.msg == as_before_v3(SAMPLES[kind])
    assert env.v == 2


def test_a_latency_event_without_follows_limit_reads_as_a_fixed_thread_count():
    """`follows_limit` came within v3 (optional): events from senders before it decode, fixed threads."""
    m = golden_map("latency")
    del m["follows_limit"]
    assert schema.decode(pack(m)) == msgspec.structs.replace(SAMPLES["latency"], follows_limit=False)
    assert schema.decode_latency(pack(m)) == msgspec.structs.replace(SAMPLES["latency"], follows_limit=False)
    m["follows_limit"] = 1
    with pytest.raises(schema.SchemaError, match="follows_limit"):
        schema.decode(pack(m))
    with pytest.raises(schema.SchemaError, match="follows_limit"):
        schema.decode_latency(pack(m))


@pytest.mark.parametrize("field", ["container", "node"])
def test_the_hot_decoder_refuses_a_bad_name_every_time_and_remembers_only_good_ones(field, monkeypatch):
    """Ids found good are remembered (`subjects.is_good_id`: a set lookup for the next event); a bad name is
    never remembered, and the memory is bounded: past its size it starts again and still decides the same."""
    monkeypatch.setattr(subjects, "_IDS_SEEN_MAX", 8)
    subjects._ids_seen.clear()
    m = golden_map("latency")
    for bad in ["a b", "c*", "n>", "~x", "tab\t", "bell\x07", "", "n" * (MAX_ID_CHARS + 1), 5, ["c1"], None, b"c1"]:
        m[field] = bad
        for _ in range(2):
            with pytest.raises(schema.SchemaError, match=field):
                schema.decode_latency(pack(m))
            with pytest.raises(schema.SchemaError, match=field):
                schema.decode(pack(m))
    for i in range(30):
        m[field] = f"name-{i % 12}"
        assert schema.decode_latency(pack(m)) == schema.decode(pack(m))
        assert len(subjects._ids_seen) <= 8
    assert not any(type(n) is not str or not n.startswith(("name-", "resnet.", "node-")) for n in subjects._ids_seen)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_older_cluster_state_json_still_parses(version):
    old = public.ClusterState.from_json((GOLDEN / version / "cluster_state.json").read_bytes())
    # Before the three numbers (met, CPU used and idle) the summary did not carry them.
    now = aggregate([SAMPLES["node_state"]], at=GOLDEN_TS)
    blank = {"met": None, "cpu_cores_used": None, "cpu_cores_idle": None}
    now = msgspec.structs.replace(now, met_total=None, cpu_cores_used_total=None, cpu_cores_idle_total=None,
                              nodes={k: msgspec.structs.replace(v, **blank) for k, v in now.nodes.items()})
    assert old == now


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_golden_message_with_an_unknown_field_still_decodes(kind):
    m = msgpack.unpackb((GOLDEN / f"{kind}.msgpack").read_bytes(), raw=False)
    m["added_in_v2"] = {"anything": [1, 2.5, None]}
    assert schema.decode(pack(m)) == SAMPLES[kind]


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_a_newer_version_decodes_when_the_required_fields_are_there(kind):
    m = golden_map(kind)
    m["v"] = schema.SCHEMA_VERSION + 5
    env = schema.decode_envelope(pack(m))
    assert env.msg == SAMPLES[kind] and env.v == schema.SCHEMA_VERSION + 5


def test_golden_cluster_state_json():
    path = GOLDEN / "cluster_state.json"
    state = aggregate([SAMPLES["node_state"]], at=GOLDEN_TS)
    data = state.to_json()
    if os.environ.get("DQOES_UPDATE_GOLDEN") == "1":
        path.write_bytes(data)
    assert data == path.read_bytes()
    assert ClusterState.from_json(path.read_bytes()) == state


def test_the_envelope_comes_first_and_is_flat():
    m = golden_map("latency")
    assert list(m)[:4] == ["type", "v", "ts", "sender"]
    assert m["type"] == "latency" and m["v"] == 3 and m["ts"] == GOLDEN_TS
    assert m["latency_s"] == 12.5 and m["container"] == "resnet.1"


wire_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.binary(max_size=300),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=40), inner, max_size=20),
    max_leaves=60,
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(wire_values)
def test_the_encoder_writes_the_bytes_msgpack_python_writes(value):
    """The codec encodes with msgspec; peers and the golden files were written by msgpack-python."""
    assert msgspec.msgpack.encode(value) == pack(value)


# --- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_every_type_round_trips(kind):
    msg = SAMPLES[kind]
    data = schema.encode(msg, "worker-a")
    assert schema.decode(data) == msg
    assert schema.decode_as(data, MESSAGE_CLASSES[kind]) == msg
    assert schema.decode_envelope(data).sender == "worker-a"


def test_decode_as_refuses_another_type():
    data = schema.encode(SAMPLES["control"], "op")
    with pytest.raises(SchemaError, match="expected 'latency', got 'control'"):
        schema.decode_as(data, LatencyEvent)


def test_ts_defaults_to_now():
    import time

    before = time.time()
    env = schema.decode_envelope(schema.encode(SAMPLES["objective"], "m"))
    assert before <= env.ts <= time.time()


def test_optional_latency_fields_take_defaults_and_finished_at_the_envelope_ts():
    m = {
        "type": "latency",
        "v": 1,
        "ts": 1234.5,
        "sender": "c",
        "container": "c1",
        "node": "n1",
        "latency_s": 2,
        "images": 10,
        "batch": 0,
    }
    e = schema.decode(pack(m))
    assert e == LatencyEvent(
        container="c1", node="n1", latency_s=2.0, images=10, batch=0, finished_at=1234.5
    )
    assert e.cpu_s == 0.0 and e.model is None and isinstance(e.latency_s, float)


def test_built_without_finished_at_the_wire_carries_the_ts():
    e = LatencyEvent(container="c1", node="n1", latency_s=1.0, images=1, batch=0)
    assert e.finished_at is None
    assert schema.decode(schema.encode(e, "c", ts=99.0)).finished_at == 99.0


def test_lists_are_stored_as_tuples_and_class_strings_as_cls():
    """`build` (values a person or a decoder gave) makes lists tuples and class strings Cls."""
    ns = NodeState.build(
        **msgspec.structs.asdict(SAMPLES["node_state"]) | dict(
        members={"G": ["a"], "S": [], "B": []},
        containers=[{"container": "a", "cls": "G"}],
        expected=["x"],
    ))
    assert ns.members == {"G": ("a",), "S": (), "B": (), "pending": ()}
    assert ns.containers == (ContainerState(container="a", cls=Cls.G),)
    assert ns.expected == ("x",)
    assert schema.decode(schema.encode(ns, "w")) == ns


def test_objective_none_clears_but_must_be_present():
    clear = ObjectiveAssign(container="c1", objective_s=None, revision=4)
    assert schema.decode(schema.encode(clear, "m")) == clear
    m = msgpack.unpackb(schema.encode(clear, "m"))
    del m["objective_s"]
    with pytest.raises(SchemaError, match=r"^objective\.objective_s: missing required field$"):
        schema.decode(pack(m))


def test_from_decision_converts_the_core_decision():
    d = Decision(
        node="n1",
        now_s=123.0,
        policy="dqoes",
        containers=(
            ContainerDecision("a", Cls.G, 5.0, 35.0, 0.5, 0.5, 0.45, "give"),
            ContainerDecision("b", None, None, None, None, None, 0.5, "pending"),
        ),
        slack_sum_g_s=5.0,
        slack_sum_b_s=0.0,
        satisfied=0,
        interval_s=10.0,
        listener="initial",
        event="added",
        extra={"r_g": 0.5},
    )
    msg = DecisionMsg.from_decision(d, round=3, at=1700000000.0)
    assert msg.node == "n1" and msg.round == 3 and msg.at == 1700000000.0
    assert msg.event == "added" and msg.listener == "initial" and msg.extra == {"r_g": 0.5}
    assert msg.containers[0] == ContainerDecisionMsg(
        container="a",
        cls=Cls.G,
        slack_s=5.0,
        latency_s=35.0,
        cpu_share=0.5,
        old_limit=0.5,
        new_limit=0.45,
        reason="give",
    )
    assert msg.containers[1].cls is None and msg.containers[1].new_limit == 0.5
    assert schema.decode(schema.encode(msg, "w")) == msg


# --- errors name the field --------------------------------------------------------------


def required_fields(cls) -> list[str]:
    return [f.name for f in msgspec.structs.fields(cls) if f.required]


@pytest.mark.parametrize(
    "kind, name",
    [(k, n) for k, c in MESSAGE_CLASSES.items() for n in required_fields(c)]
    + [(k, n) for k in MESSAGE_CLASSES for n in ("v", "ts", "sender")],
)
def test_a_missing_required_field_is_named(kind, name):
    m = golden_map(kind)
    del m[name]
    with pytest.raises(SchemaError, match=rf"^{kind}\.{name}: missing required field$"):
        schema.decode(pack(m))


def test_required_fields_are_what_the_contract_says():
    assert required_fields(LatencyEvent) == ["container", "node", "latency_s", "images", "batch"]
    assert required_fields(ControlMsg) == []


@pytest.mark.parametrize(
    "kind, name, value, message",
    [
        ("latency", "latency_s", -3, "latency.latency_s: must be a finite number > 0, got -3"),
        ("latency", "latency_s", 0, "latency.latency_s: must be a finite number > 0, got 0"),
        (
            "latency",
            "latency_s",
            float("nan"),
            "latency.latency_s: must be a finite number > 0, got nan",
        ),
        (
            "latency",
            "latency_s",
            float("inf"),
            "latency.latency_s: must be a finite number > 0, got inf",
        ),
        ("latency", "latency_s", "12", "latency.latency_s: must be a finite number > 0, got '12'"),
        ("latency", "latency_s", True, "latency.latency_s: must be a finite number > 0, got True"),
        ("latency", "latency_s", None, "latency.latency_s: must be a finite number > 0, got None"),
        ("latency", "images", 0, "latency.images: must be an integer >= 1, got 0"),
        ("latency", "images", 2.0, "latency.images: must be an integer >= 1, got 2.0"),
        ("latency", "batch", -1, "latency.batch: must be an integer >= 0, got -1"),
        ("latency", "cpu_s", -0.5, "latency.cpu_s: must be a finite number >= 0, got -0.5"),
        ("latency", "container", "a b", "latency.container: 'a b' contains whitespace"),
        ("latency", "container", "", "latency.container: must not be empty"),
        ("latency", "node", 7, "latency.node: must be a string, got 7"),
        ("latency", "model", 3, "latency.model: must be a string, got 3"),
        ("decision", "containers", "x", "decision.containers: must be a list, got 'x'"),
        (
            "decision",
            "containers",
            [{"container": "a", "cls": "X"}],
            "decision.containers[0].cls: must be one of 'G', 'S', 'B' or nil, got 'X'",
        ),
        (
            "decision",
            "containers",
            [{"cls": "G"}],
            "decision.containers[0].container: missing required field",
        ),
        (
            "decision",
            "containers",
            [{"container": "a"}, 5],
            "decision.containers[1]: must be a map, got 5",
        ),
        (
            "decision",
            "extra",
            {"r_g": "x"},
            "decision.extra['r_g']: must be a finite number, got 'x'",
        ),
        ("decision", "round", -1, "decision.round: must be an integer >= 0, got -1"),
        ("decision", "interval_s", 0, "decision.interval_s: must be a finite number > 0, got 0"),
        ("node_state", "members", {"X": []}, "node_state.members: unknown key 'X'"),
        (
            "node_state",
            "members",
            {"G": ["a b"]},
            "node_state.members['G'][0]: 'a b' contains whitespace",
        ),
        (
            "node_state",
            "containers",
            [{"container": "a", "managed": 1}],
            "node_state.containers[0].managed: must be true or false, got 1",
        ),
        (
            "node_state",
            "containers",
            [{"container": "a", "alpha": 1.5}],
            "node_state.containers[0].alpha: must be a number in (0, 1), got 1.5",
        ),
        ("node_state", "cores", 0, "node_state.cores: must be a finite number > 0, got 0"),
        ("node_state", "params", [1], "node_state.params: must be a map of names to numbers"),
        ("objective", "revision", "3", "objective.revision: must be an integer >= 0, got '3'"),
        (
            "objective",
            "objective_s",
            -1,
            "objective.objective_s: must be a finite number > 0, got -1",
        ),
        ("control", "alpha", 1.0, "control.alpha: must be a number in (0, 1), got 1.0"),
        # A parameter name is a policy's field name: one with a newline or a space would go into the
        # worker's reply and log as it came.
        ("control", "params", {"dead_band\nFAKE LOG LINE": 0.1},
         "control.params: keys must be parameter names (a letter or _, then letters, digits or _; at most 64), "
         "got 'dead_band\\nFAKE LOG LINE'"),
        ("control", "params", {"1x": 0.1}, "control.params: keys must be parameter names"),
        ("control_reply", "params", {"a b": 1.0}, "control_reply.params: keys must be parameter names"),
        ("node_state", "params", {"x" * 65: 1.0}, "node_state.params: keys must be parameter names"),
        ("control", "beta", 0, "control.beta: must be a number in (0, 1), got 0"),
        (
            "control",
            "initial_interval_s",
            -5,
            "control.initial_interval_s: must be a finite number > 0",
        ),
        (
            "control",
            "max_interval_s",
            1.0,
            "control.max_interval_s: must be >= initial_interval_s (5), got 1",
        ),
        ("latency", "ts", -1, "latency.ts: must be a unix time in seconds (finite, >= 0), got -1"),
        ("latency", "v", 0, "latency.v: must be an integer >= 1, got 0"),
        ("latency", "sender", b"x", "latency.sender: must be a string, got b'x'"),
    ],
)
def test_a_wrong_value_is_named_with_the_problem(kind, name, value, message):
    m = golden_map(kind)
    m[name] = value
    with pytest.raises(SchemaError) as info:
        schema.decode(pack(m))
    assert str(info.value).startswith(message)


def test_building_or_sending_an_invalid_message_fails_the_same_way():
    """`build` checks every rule; `encode` refuses what a peer would; plain construction checks ids and the
    cross-field rules."""
    with pytest.raises(
        SchemaError, match=r"^latency\.latency_s: must be a finite number > 0, got -3$"
    ):
        LatencyEvent.build(container="c1", node="n1", latency_s=-3, images=1, batch=0)
    with pytest.raises(
        SchemaError, match=r"^latency\.latency_s: must be a finite number > 0, got -3$"
    ):
        schema.encode(LatencyEvent(container="c1", node="n1", latency_s=-3, images=1, batch=0), "c")
    with pytest.raises(SchemaError, match=r"^latency\.node: 'a b' contains whitespace"):
        LatencyEvent(container="c1", node="a b", latency_s=1.0, images=1, batch=0)
    with pytest.raises(SchemaError, match=r"^control\.max_interval_s"):
        ControlMsg(initial_interval_s=10, max_interval_s=5)
    with pytest.raises(SchemaError, match=r"^node_state\.members: unknown key 'g'"):
        msgspec.structs.replace(SAMPLES["node_state"], members={"g": ()})


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "message: not msgpack"),
        (b"\xc1", "message: not msgpack"),
        (pack([1, 2]), "message: must be a msgpack map, got list"),
        (pack("latency"), "message: must be a msgpack map, got str"),
        (pack({"v": 1}), "message.type: missing required field"),
        (pack({"type": 5}), "message.type: must be a string, got 5"),
        (pack({"type": "gossip", "v": 1}), "message.type: unknown message type 'gossip'"),
        (b'{"type": "latency"}', "message: not msgpack"),
    ],
)
def test_undecodable_and_foreign_payloads(data, message):
    with pytest.raises(SchemaError, match=f"^{message}"):
        schema.decode(data)


def test_decode_refuses_non_bytes():
    with pytest.raises(SchemaError, match="expected bytes"):
        schema.decode("latency")  # type: ignore[arg-type]


def test_encode_refuses_non_messages():
    with pytest.raises(TypeError):
        schema.encode({"type": "latency"}, "x")  # type: ignore[arg-type]


# --- hostile input: only SchemaError, ever -----------------------------------------------

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.binary(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=12) | st.integers(-5, 5), inner, max_size=6)
    ),
    max_leaves=25,
)


def assert_only_schema_error(fn, arg):
    try:
        fn(arg)
    except SchemaError as e:
        assert "internal error" not in str(e), str(e)
        assert "\n" not in str(e)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_decode_of_arbitrary_bytes_raises_only_schema_error(data):
    assert_only_schema_error(schema.decode, data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(msgpack_values)
def test_decode_of_arbitrary_msgpack_values_raises_only_schema_error(value):
    assert_only_schema_error(schema.decode, pack(value))


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(SAMPLES)), st.data())
def test_decode_of_mutated_messages_raises_only_schema_error(kind, data):
    m = golden_map(kind)
    keys = sorted(m)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(keys))
        if data.draw(st.booleans()):
            m[key] = data.draw(msgpack_values)
        else:
            m.pop(key, None)
    assert_only_schema_error(schema.decode, pack(m))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_parse_target_of_arbitrary_bytes_raises_only_schema_error(data):
    assert_only_schema_error(public.parse_target, data)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=25,
)
target_like = st.fixed_dictionaries(
    {},
    optional={
        "container": msgpack_values,
        "objective": msgpack_values,
        "objective_s": msgpack_values,
        "alpha": msgpack_values,
    },
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, target_like))
def test_parse_target_of_arbitrary_values_raises_only_schema_error(value):
    assert_only_schema_error(public.parse_target, pack(value))
    try:
        as_json = orjson.dumps(value)
    except TypeError:  # bytes or non-finite floats: JSON cannot carry them
        return
    assert_only_schema_error(public.parse_target, as_json)


# --- public target requests -------------------------------------------------------------


@pytest.mark.parametrize(
    "payload, expected",
    [
        (b'{"container": "c01", "objective": 40}', ("c01", 40.0, None)),
        (b'{"container":"c01","objective":40.5,"alpha":0.2}', ("c01", 40.5, 0.2)),
        (b'{"container": "web.1", "objective_s": 2}', ("web.1", 2.0, None)),
        (b'  {"container": "c01", "objective": 1, "alpha": null}\n', ("c01", 1.0, None)),
        (b'{"container": "3f2a9cbe01", "objective": 86400}', ("3f2a9cbe01", 86400.0, None)),
        (pack({"container": "c01", "objective": 40}), ("c01", 40.0, None)),
        (pack({"container": "c01", "objective_s": 0.5, "alpha": 0.1}), ("c01", 0.5, 0.1)),
    ],
)
def test_parse_target_accepts_json_and_msgpack(payload, expected):
    t = public.parse_target(payload)
    assert (t.container, t.objective_s, t.alpha) == expected
    assert isinstance(t.objective_s, float)


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"", "empty payload"),
        (b"   ", "empty payload"),
        (b"not json", "payload is neither JSON nor msgpack"),
        (b'{"container": "c01", "objective": 40', "payload is neither JSON nor msgpack"),
        (b"[1, 2]", "payload must be a JSON object or msgpack map, got list"),
        (b"40", "payload must be a JSON object or msgpack map, got int"),
        (b'"c01"', "payload must be a JSON object or msgpack map, got str"),
        (b'{"objective": 40}', "missing field 'container'"),
        (b'{"container": "c01"}', "missing field 'objective'"),
        (b'{"container": "c01", "objetive": 40}', "unknown field 'objetive'"),
        (b'{"container": "c01", "objective": 40, "node": "n1"}', "unknown field 'node'"),
        (
            b'{"container": "c01", "objective": 4, "objective_s": 4}',
            "give 'objective' or 'objective_s'",
        ),
        (b'{"container": 12, "objective": 40}', "container: must be a string, got 12"),
        (b'{"container": "", "objective": 40}', "container: must not be empty"),
        (b'{"container": "a b", "objective": 40}', "container: 'a b' contains whitespace"),
        (b'{"container": "a*", "objective": 40}', "container: 'a*' contains '*'"),
        (b'{"container": "a~b", "objective": 40}', "container: 'a~b' contains '~'"),
        (
            b'{"container": "c01", "objective": "40"}',
            "objective: must be a number of seconds per batch, got '40'",
        ),
        (
            b'{"container": "c01", "objective": true}',
            "objective: must be a number of seconds per batch, got True",
        ),
        (
            b'{"container": "c01", "objective": null}',
            "objective: must be a number of seconds per batch, got None",
        ),
        (b'{"container": "c01", "objective": [40]}', "objective: must be a number"),
        (
            b'{"container": "c01", "objective": 0}',
            "objective: must be > 0 seconds per batch, got 0",
        ),
        (
            b'{"container": "c01", "objective": -3}',
            "objective: must be > 0 seconds per batch, got -3",
        ),
        (
            b'{"container": "c01", "objective": 86401}',
            "objective: must be at most 86400 seconds per batch",
        ),
        (b'{"container": "c01", "objective": 1e300}', "objective: must be at most 86400"),
        (b'{"container": "c01", "objective_s": -1}', "objective_s: must be > 0"),
        (b'{"container": "c01", "objective": NaN}', "payload is neither JSON nor msgpack"),
        (
            pack({"container": "c01", "objective": float("nan")}),
            "objective: must be a finite number",
        ),
        (
            pack({"container": "c01", "objective": float("inf")}),
            "objective: must be a finite number",
        ),
        (pack({"container": "c01", "objective": 2**64 - 1}), "objective: must be at most 86400"),
        (
            b'{"container": "c01", "objective": 40, "alpha": 0}',
            "alpha: must be a number in (0, 1), got 0",
        ),
        (
            b'{"container": "c01", "objective": 40, "alpha": 1}',
            "alpha: must be a number in (0, 1), got 1",
        ),
        (
            b'{"container": "c01", "objective": 40, "alpha": -0.1}',
            "alpha: must be a number in (0, 1)",
        ),
        (
            b'{"container": "c01", "objective": 40, "alpha": "0.1"}',
            "alpha: must be a number in (0, 1)",
        ),
        (
            b'{"container": "c01", "objective": 40, "alpha": false}',
            "alpha: must be a number in (0, 1)",
        ),
        (pack({"container": b"c01", "objective": 40}), "container: must be a string, got b'c01'"),
        (pack({1: "x"}), "unknown field 1"),
        (
            b'{"container": "c01", "objective": 40, "pad": "' + b"x" * (1 << 20) + b'"}',
            "bytes; at most 65536 are accepted",
        ),
        (b" " * (64 * 1024 + 1), "at most 65536"),
    ],
)
def test_parse_target_rejects_bad_requests_with_a_reason(payload, message):
    with pytest.raises(SchemaError) as info:
        public.parse_target(payload)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_request_of_exactly_64_kib_is_parsed():
    body = b'{"container": "c01", "objective": 40}'
    payload = body + b" " * (64 * 1024 - len(body))
    assert public.parse_target(payload).objective_s == 40.0


def test_target_request_to_json_is_what_parse_target_reads():
    t = public.TargetRequest(container="web.1", objective_s=12, alpha=0.2)
    assert orjson.loads(t.to_json()) == {"container": "web.1", "objective": 12.0, "alpha": 0.2}
    assert public.parse_target(t.to_json()) == t


def test_target_replies_are_json_with_ok():
    ok = public.target_reply_ok(container="c01", objective_s=40.0, revision=3)
    assert orjson.loads(ok) == {"ok": True, "container": "c01", "objective_s": 40.0, "revision": 3}
    err = public.target_reply_error("objective: must be > 0 seconds per batch, got -3")
    assert orjson.loads(err) == {
        "ok": False,
        "error": "objective: must be > 0 seconds per batch, got -3",
    }
    assert public.parse_target_reply(err)["ok"] is False
    with pytest.raises(SchemaError):
        public.parse_target_reply(b'{"error": "x"}')


# --- cluster state ----------------------------------------------------------------------


def node_state(node: str, at: float, **changes) -> NodeState:
    return msgspec.structs.replace(SAMPLES["node_state"], node=node, at=at, **changes)


def test_aggregate_adds_up_the_nodes():
    a = node_state("a", 10.0)
    b = node_state(
        "b",
        11.0,
        satisfied=2,
        slack_sum_g_s=1.0,
        slack_sum_b_s=-1.0,
        slack_sum_s_s=None,  # left out, as a v1 worker does: summed from the S containers
        members={"S": ("x", "y")},
        containers=(
            ContainerState(container="x", cls=Cls.S, slack_s=0.5),
            ContainerState(container="y", cls=Cls.S, slack_s=-0.25),
        ),
    )
    c = aggregate([a, b], at=20.0)
    assert list(c.nodes) == ["a", "b"]
    assert c.nodes["a"].G == 1 and c.nodes["a"].S == 1 and c.nodes["a"].B == 1
    assert c.nodes["a"].pending == 1 and c.nodes["a"].containers == 4
    assert c.nodes["a"].slack_sum_s_s == -0.5 and c.nodes["b"].slack_sum_s_s == 0.25
    assert c.satisfied_total == 3 and c.S == 3 and c.G == 1 and c.B == 1 and c.pending == 1
    assert c.slack_sum_g_s == 6.0 and c.slack_sum_b_s == -4.5 and c.slack_sum_s_s == -0.25
    assert c.containers_total == 6 and c.at == 20.0


def test_aggregate_keeps_the_newest_state_per_node():
    old = node_state("a", 10.0, satisfied=0)
    new = node_state("a", 12.0, satisfied=5)
    assert aggregate([new, old], at=13.0).nodes["a"].satisfied == 5
    assert aggregate([old, new], at=13.0).satisfied_total == 5


def test_aggregate_of_nothing_is_an_empty_cluster():
    c = aggregate([], at=1.0)
    assert c.nodes == {} and c.satisfied_total == 0 and c.slack_sum_g_s == 0.0 and c.containers_total == 0


def test_cluster_state_json_round_trip_and_tolerance():
    c = aggregate([node_state("a", 10.0), node_state("b.x", 11.0)], at=20.0)
    obj = orjson.loads(c.to_json())
    assert obj["type"] == "cluster_state" and obj["v"] == schema.SCHEMA_VERSION
    assert obj["nodes"]["b.x"]["satisfied"] == 1 and obj["satisfied_total"] == 2
    obj["new_total"] = 5
    obj["nodes"]["a"]["new_field"] = "x"
    assert ClusterState.from_json(orjson.dumps(obj)) == c


@pytest.mark.parametrize(
    "data, message",
    [
        (b"{", "cluster_state: not JSON"),
        (b"[]", "cluster_state: must be a JSON object"),
        (b'{"type": "latency"}', "cluster_state.type: expected 'cluster_state'"),
        (b'{"nodes": {}}', "cluster_state.satisfied_total: missing required field"),
    ],
)
def test_cluster_state_from_json_rejects_with_the_field(data, message):
    with pytest.raises(SchemaError, match=f"^{message}"):
        ClusterState.from_json(data)


def test_numbers_are_floats_once_built_or_decoded():
    ns = NodeState.build(**msgspec.structs.asdict(SAMPLES["node_state"]) | dict(cores=2, slack_sum_g_s=1))
    assert isinstance(ns.cores, float) and isinstance(ns.slack_sum_g_s, float)
    sent = schema.decode(schema.encode(msgspec.structs.replace(SAMPLES["node_state"], cores=2), "w"))
    assert isinstance(sent.cores, float)
    assert math.isclose(ns.cores, 2.0)


def test_the_bytes_are_the_same_however_the_numbers_were_built():
    """An int where a float belongs is sent as the float a peer reads (the golden bytes hold floats)."""
    ints = msgspec.structs.replace(SAMPLES["node_state"], cores=2, round=42, containers=(
        ContainerState(container="fresh", objective_s=5),))
    floats = msgspec.structs.replace(SAMPLES["node_state"], cores=2.0, containers=(
        ContainerState(container="fresh", objective_s=5.0),))
    assert schema.encode(ints, "w", GOLDEN_TS) == schema.encode(floats, "w", GOLDEN_TS)
    assert msgpack.unpackb(schema.encode(ints, "w", GOLDEN_TS))["cores"] == 2.0


def test_aggregate_adds_up_the_three_numbers_and_says_when_no_node_reports_them():
    a = node_state("a", 10.0, met=3, cpu_cores_used=1.5, cpu_cores_idle=0.5)
    b = node_state("b", 11.0, met=2, cpu_cores_used=2.25, cpu_cores_idle=1.75)
    old = node_state("c", 11.0, met=None, cpu_cores_used=None, cpu_cores_idle=None)  # a worker before v3
    c = aggregate([a, b, old], at=20.0)
    assert (c.nodes["a"].met, c.nodes["b"].cpu_cores_used, c.nodes["c"].met) == (3, 2.25, None)
    assert c.met_total == 5 and c.cpu_cores_used_total == 3.75 and c.cpu_cores_idle_total == 2.25
    none = aggregate([old], at=20.0)
    assert none.met_total is None and none.cpu_cores_used_total is None and none.cpu_cores_idle_total is None
    assert ClusterState.from_json(c.to_json()) == c


def test_an_objective_source_is_target_or_label():
    ns = msgspec.structs.replace(SAMPLES["node_state"], containers=(
        ContainerState(container="c1", objective_s=5.0, objective_source="target"),))
    assert schema.decode_envelope(schema.encode(ns, "t")).msg == ns
    with pytest.raises(SchemaError, match="objective_source"):
        ContainerState.build(container="c1", objective_s=5.0, objective_source="somewhere")
