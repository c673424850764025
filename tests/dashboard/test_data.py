"""Runs as tables: timeline files, uploads and live node states all become the same RunData."""

from __future__ import annotations

import math

import orjson
import pytest

from dashboard import config, data, forms
from dashboard.synthetic import node_states
from shared.core.types import Cls
from shared.public import MAX_OBJECTIVE_S, parse_target
from shared.schema import ContainerState, NodeState
from shared.timeline import read_jsonl

# --- timeline files ------------------------------------------------------------------------


def test_a_simulator_timeline_reads_back_whole(sim_runs):
    for policy, path in sim_runs.files.items():
        res = sim_runs.results[policy]
        run = data.load_timeline(path)
        assert (run.policy, run.scenario, run.seed) == (policy, "paper-cluster-40", 1)
        assert run.title == data.policy_name(policy) + f" ({path.stem})"
        assert len(run.rounds) == res.rounds
        assert run.containers_total == res.containers == 40
        assert run.nodes == {f"worker-{i}": 4.6 for i in range(1, 5)}
        assert run.result is not None and run.result["satisfied_final"] == res.satisfied_final
        assert (run.rounds["policy"] == policy).all() and (run.rounds["cores"] == 4.6).all()
        members = run.rounds[["G", "S", "B", "pending"]].sum(axis=1)
        assert (run.rounds["containers"] == members).all()
        n_containers = sum(1 for r in read_jsonl(path) if r.get("kind") == "container")
        assert len(run.containers) == n_containers


def test_a_timeline_written_with_the_v1_names_reads_the_same(sim_runs, tmp_path):
    old = {new: old for old, new in data.OLD_NAMES.items()}
    rows = [{old.get(k, k): v for k, v in r.items()} for r in read_jsonl(sim_runs.files["dqoes"])]
    assert any("q_g_s" in r for r in rows) and any("q_s" in r for r in rows)
    a = data.run_from_rows(rows, "v1")
    b = data.load_timeline(sim_runs.files["dqoes"], "v1")
    assert a.rounds.equals(b.rounds) and a.containers.equals(b.containers)


def test_an_upload_reads_as_the_file_does_and_torn_lines_are_skipped(sim_runs):
    raw = sim_runs.files["default"].read_bytes()
    lines = raw.splitlines()
    torn = b"\n".join(lines[:-1]) + b"\n\n" + lines[-1][:17]  # last line (the result) cut short
    a = data.run_from_rows(data.rows_from_bytes(raw), "up")
    b = data.run_from_rows(data.rows_from_bytes(torn), "up")
    f = data.load_timeline(sim_runs.files["default"])
    assert a.rounds.equals(f.rounds) and a.containers.equals(f.containers)
    assert a.result is not None and b.result is None
    assert b.rounds.equals(f.rounds)
    assert list(data.rows_from_bytes(b"not json\n[1, 2]\n\n{\"kind\": \"meta\"}\n")) == [
        {"kind": "meta"}
    ]


def test_the_counterpart_is_the_same_scenario_and_seed_under_the_other_policy():
    names = ["out/a_dqoes_seed1.jsonl", "out/a_default_seed1.jsonl", "out/a_default_seed2.jsonl"]
    assert data.counterpart(names[0], names) == names[1]
    assert data.counterpart(names[1], names) == names[0]
    assert data.counterpart(names[2], names) is None
    assert data.counterpart("live.jsonl", names) is None


def test_the_first_run_shown_is_a_dqoes_run_with_a_partner_and_names_are_short():
    names = ["out/b_default_seed2.jsonl", "out/a_default_seed1.jsonl", "out/a_dqoes_seed1.jsonl"]
    assert data.first_pick(names) == "out/a_dqoes_seed1.jsonl"
    assert data.first_pick(names[:2]) == names[0]
    assert data.short_name("/x/out/sub/a.jsonl", ["/y", "/x/out/"]) == "sub/a.jsonl"
    assert data.short_name("/x/outer/a.jsonl", ["/x/out"]) == "/x/outer/a.jsonl"


# --- live node states ----------------------------------------------------------------------


def test_a_node_state_becomes_one_round_row_and_a_row_per_container():
    ns, d = next(node_states(1, 5, 1, seed=4))
    rr, rows = data.state_rows(ns, 7, 12.5, d.listener, "latency")
    r = dict(zip(data.ROUND_COLUMNS, rr, strict=True))
    assert (r["t_s"], r["at"], r["node"], r["round"], r["node_round"]) == (12.5, ns.at, ns.node, 7, 1)
    assert (r["G"], r["S"], r["B"], r["pending"]) == tuple(
        len(ns.members[k]) for k in ("G", "S", "B", "pending")
    )
    assert r["satisfied"] == ns.satisfied == r["S"]
    assert r["slack_sum_s_s"] == pytest.approx(
        math.fsum(c.slack_s for c in ns.containers if c.cls is Cls.S)
    )
    assert (r["listener"], r["event"], r["containers"]) == ("kept", "latency", 5)
    assert len(rows) == 5
    for row, c in zip(rows, ns.containers, strict=True):
        x = dict(zip(data.CONTAINER_COLUMNS, row, strict=True))
        assert (x["container"], x["cls"], x["limit"], x["latency_s"]) == (
            c.container,
            c.cls.value,
            c.limit,
            c.latency_s,
        )


def test_unmanaged_and_pending_containers_are_named_so():
    ns = NodeState(
        node="n1",
        policy="dqoes",
        cores=2.0,
        round=3,
        at=1.7e9,
        interval_s=10.0,
        slack_sum_g_s=0.0,
        slack_sum_b_s=0.0,
        satisfied=0,
        members={"G": (), "S": (), "B": (), "pending": ("new",)},
        containers=(
            ContainerState(container="new", objective_s=5.0),
            ContainerState(container="other", managed=False, cpu_share=0.2),
        ),
    )
    _, rows = data.state_rows(ns, 1, 0.0)
    classes = [dict(zip(data.CONTAINER_COLUMNS, r, strict=True))["cls"] for r in rows]
    assert classes == [data.PENDING, data.UNMANAGED]


def test_throttling_is_carried_into_the_containers_table():
    ns = NodeState(
        node="n1", policy="dqoes", cores=2.0, round=3, at=1.7e9, interval_s=10.0, slack_sum_g_s=0.0,
        slack_sum_b_s=0.0, satisfied=0, members={"G": (), "S": (), "B": (), "pending": ("a",)},
        containers=(ContainerState(container="a", objective_s=5.0, throttled_ratio=0.5),
                    ContainerState(container="b", managed=False)),
    )
    _, rows = data.state_rows(ns, 1, 0.0)
    frame = data.containers_frame(rows)
    assert frame["throttled_ratio"].iloc[0] == 0.5 and math.isnan(frame["throttled_ratio"].iloc[1])


# --- the objective form's checks -------------------------------------------------------------


@pytest.mark.parametrize(
    "container, objective, alpha, words",
    [
        ("", "30", "", "container: required"),
        ("   ", "30", "", "container: required"),
        ("c1", "", "", "objective: required"),
        ("c1", "thirty", "", "objective: 'thirty' is not a number"),
        ("c1", "-5", "", "objective: must be more than 0 seconds per batch, got -5"),
        ("c1", "0", "", "objective: must be more than 0"),
        ("c1", "nan", "", "objective: must be a finite number"),
        ("c1", "inf", "", "objective: must be a finite number"),
        ("c1", "1e9", "", f"at most {MAX_OBJECTIVE_S:g}"),
        ("c1", "30", "abc", "alpha: 'abc' is not a number"),
        ("c1", "30", "1", "alpha: must be strictly between 0 and 1, got 1"),
        ("c1", "30", "-0.1", "alpha: must be strictly between 0 and 1"),
        ("bad name", "30", "", "whitespace"),
        ("c.*", "30", "", "container"),
    ],
)
def test_bad_form_input_gives_a_message_and_no_request(container, objective, alpha, words):
    r = forms.validate_target(container, objective, alpha)
    assert not r.ok and r.body is None
    assert words in (r.error or "")


@pytest.mark.parametrize(
    "container, objective, alpha, body",
    [
        ("c1", "30", "", {"container": "c1", "objective": 30.0}),
        (" c2 ", " 12.5 ", "", {"container": "c2", "objective": 12.5}),
        ("c3", "7", "0.2", {"container": "c3", "objective": 7.0, "alpha": 0.2}),
    ],
)
def test_good_form_input_is_a_request_the_manager_accepts(container, objective, alpha, body):
    r = forms.validate_target(container, objective, alpha)
    assert r.ok and r.error is None and r.body == body
    req = parse_target(orjson.dumps(r.body))  # the manager's own parser
    assert req.container == body["container"] and req.objective_s == body["objective"]


def test_pressing_the_button_sends_only_checked_requests_to_the_chosen_stacks():
    sent = []

    def send(label, body):
        sent.append((label, body))
        return {"ok": True, "container": body["container"], "objective_s": body["objective"]}

    assert forms.submit("c1", "-1", "", ["dqoes"], send) == [
        ("", forms.not_sent(
            "objective: must be more than 0 seconds per batch, got -1 (nothing was sent)"))
    ]
    assert forms.submit("c1", "5", "", [], send)[0][1]["error"] == (
        "no cluster to send to: nothing was sent"
    )
    assert forms.submit("c1", "5", "", ["dqoes"], None)[0][1]["answered"] is False
    assert sent == []
    replies = forms.submit("c1", "5", "", ["dqoes", "default"], send)
    assert [label for label, _ in replies] == ["dqoes", "default"]
    assert sent == [("dqoes", {"container": "c1", "objective": 5.0}),
                    ("default", {"container": "c1", "objective": 5.0})]


def test_replies_are_described_in_one_line():
    ok = {"ok": True, "container": "c1", "objective_s": 30.0, "node": "node-a", "running": True,
          "revision": 4}
    assert forms.describe_reply(ok) == (
        "objective for c1: 30 s a batch (running on node-a, revision 4)"
    )
    later = {"ok": True, "container": "c9", "objective_s": 2.5, "node": None, "running": False}
    assert forms.describe_reply(later) == "objective for c9: 2.5 s a batch (expected on no node yet)"
    assert forms.describe_reply({"ok": False, "error": "unknown container 'x'"}) == (
        "refused: unknown container 'x'"
    )


# --- settings ----------------------------------------------------------------------------------


def test_settings_from_arguments_then_environment():
    env = {
        config.SOURCES_ENV: "dqoes=nats://a:1,default=nats://b:2",
        config.RUNS_ENV: "r1:r2",
        config.REFRESH_ENV: "2.5",
    }
    c = config.parse([], env)
    assert c.sources == (("dqoes", "nats://a:1"), ("default", "nats://b:2"))
    assert c.runs_dirs == ("r1", "r2") and c.refresh_s == 2.5
    c = config.parse(["--source", "nats://c:3", "--runs", "x", "--refresh", "0.01"], env)
    assert c.sources == (("live", "nats://c:3"),) and c.runs_dirs == ("x",)
    assert c.refresh_s == 0.2  # never faster than 5 a second
    assert config.parse([], {}).sources == ()
    with pytest.raises(ValueError, match="unique"):
        config.parse(["--source", "a=nats://x:1", "--source", "a=nats://y:1"], {})
    assert config.source_args([("a", "nats://x:1")]) == ["--source", "a=nats://x:1"]


def test_clearing_sends_only_a_checked_container_to_the_chosen_stacks():
    sent = []

    def send(label, body):
        sent.append((label, body))
        return {"ok": True, "container": body["container"], "cleared": True}

    assert forms.submit_clear("  ", ["dqoes"], send)[0][1]["error"].startswith("container: required")
    assert "whitespace" in forms.submit_clear("a b", ["dqoes"], send)[0][1]["error"]
    assert forms.submit_clear("c1", [], send)[0][1]["answered"] is False
    assert sent == []
    [(label, reply)] = forms.submit_clear(" c1 ", ["dqoes"], send)
    assert label == "dqoes" and sent == [("dqoes", {"container": "c1"})]
    assert forms.describe_reply(reply) == (
        "objective for c1 cleared: unmanaged now, its CPU limit released "
        "(unless it carries its own dqoes.objective_s label)")
