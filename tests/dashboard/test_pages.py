"""Every page of the app under Streamlit's AppTest: recorded runs, live clusters, the form.

The app is run from its entry point (dashboard/app.py, as `streamlit run`
does) with its settings in the environment. Live pages follow a real
cluster (`small_stack`); what the form puts on the bus is watched with a
real subscription to `dqoes.targets`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import orjson
import pytest
from dash_helpers import TOKEN, BusTap, app_test
from streamlit.testing.v1 import AppTest

from dashboard import access, config, data, views
from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.scenarios.builtin import load

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "dashboard" / "app.py")
SMALL = REPO / "tests" / "e2e" / "small-cluster.json"
LIVE = "app_pages/live.py"
RECORDED = "app_pages/recorded.py"


def app(monkeypatch, *, sources: str = "", runs: str = "", page: str = LIVE) -> AppTest:
    monkeypatch.setenv(config.SOURCES_ENV, sources)
    monkeypatch.setenv(config.RUNS_ENV, runs)
    at = app_test(monkeypatch, APP)
    at.run()
    if page != LIVE:
        at.switch_page(page)
        at.run()
    assert not at.exception, at.exception
    return at


def texts(elements) -> list[str]:
    return [e.value for e in elements]


def specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("vega_lite_chart")]


def rerun_until(at: AppTest, pred, timeout_s: float = 30.0):
    t_end = time.monotonic() + timeout_s
    while True:
        at.run()
        assert not at.exception, at.exception
        v = pred(at)
        if v:
            return v
        assert time.monotonic() < t_end, "the page never showed it: " + repr(
            texts(at.info) + texts(at.warning) + [m.value for m in at.metric]
        )
        time.sleep(0.3)


def field(at: AppTest, label: str):
    return next(t for t in at.text_input if t.label.startswith(label))


def submit(at: AppTest, container: str, objective: str, alpha: str = "") -> AppTest:
    field(at, "container").input(container)
    field(at, "objective").input(objective)
    field(at, "alpha").input(alpha)
    next(b for b in at.button if b.label == "Set objective").click()
    at.run()
    assert not at.exception, at.exception
    return at


def words_shown(at: AppTest) -> str:
    """Every piece of text the page shows: titles, text, metrics, table headers, chart and axis titles."""
    parts = [e.value for kind in ("title", "subheader", "markdown", "caption", "info", "warning", "error",
                                  "success") for e in at.get(kind)]
    parts += [f"{m.label} {m.value} {m.help}" for m in at.metric]
    parts += [" ".join(map(str, d.value.columns)) for d in at.dataframe]

    def titles(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "title":
                    yield json.dumps(v)
                yield from titles(v)
        elif isinstance(node, list):
            for v in node:
                yield from titles(v)

    for spec in specs(at):
        parts += list(titles(spec))
    return "\n".join(parts)


# --- the token ---------------------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, "", "wrong", TOKEN[:-1], TOKEN + "x"])
def test_without_the_token_the_page_shows_one_line_and_no_form(monkeypatch, sim_runs, given):
    monkeypatch.setenv(config.SOURCES_ENV, "dqoes=nats://127.0.0.1:9")
    monkeypatch.setenv(config.RUNS_ENV, str(sim_runs.dir))
    at = app_test(monkeypatch, APP, token=given)
    at.run()
    assert not at.exception, at.exception
    assert texts(at.markdown) == [access.REFUSAL]
    assert not at.text_input and not at.button and not at.selectbox and not at.metric
    assert not at.title and not at.dataframe and not at.get("vega_lite_chart") and not at.info
    at.switch_page(RECORDED)  # a page's own address without the token: the same line
    at.run()
    assert texts(at.markdown) == [access.REFUSAL] and not at.selectbox and not at.metric


def test_with_no_token_set_the_page_refuses_everyone(monkeypatch):
    monkeypatch.setenv(config.SOURCES_ENV, "")
    at = app_test(monkeypatch, APP, token="")
    monkeypatch.delenv(access.TOKEN_ENV)
    at.run()
    assert texts(at.markdown) == [access.NO_TOKEN_SET] and not at.text_input and not at.button


def test_the_token_admits_the_session_to_every_page(monkeypatch, sim_runs):
    at = app(monkeypatch, runs=str(sim_runs.dir))
    assert [t.value for t in at.title] == ["DQoES: live"]
    assert [b.label for b in at.button] == ["Set objective", "Clear objective"]
    at.query_params.clear()  # Streamlit drops the query on moving to another page
    at.switch_page(RECORDED)
    at.run()
    assert [t.value for t in at.title] == ["DQoES: recorded runs"] and len(at.metric) == 2
    assert at.query_params[access.TOKEN_PARAM] == TOKEN  # back in the address: a reload there works


def test_pages_speak_of_met_and_in_band_never_satisfied(monkeypatch, sim_runs):
    at = app(monkeypatch, runs=str(sim_runs.dir), page=RECORDED)
    shown = words_shown(at)
    assert "met" in shown and "in band" in shown
    assert "satisf" not in shown.lower(), [line for line in shown.splitlines() if "satisf" in line.lower()]
    assert "final CPU split" not in shown


# --- recorded runs ----------------------------------------------------------------------------


def test_recorded_page_without_files_says_how_to_make_some(monkeypatch, tmp_path):
    at = app(monkeypatch, runs=str(tmp_path), page=RECORDED)
    (info,) = texts(at.info)
    assert f"No timeline files found ({tmp_path})" in info
    assert "dqoes experiment run paper-cluster-40 --policy dqoes --seed 1 --out out/" in info
    assert not at.metric and not at.get("vega_lite_chart")


def test_recorded_comparison_states_the_ratio_and_shares_the_axes(monkeypatch, sim_runs):
    at = app(monkeypatch, runs=str(sim_runs.dir), page=RECORDED)
    first, second = at.selectbox
    # The partner run (same scenario and seed, other policy) is chosen by itself.
    assert {first.value, second.value} == {str(f) for f in sim_runs.files.values()}
    d, b = (sim_runs.results[p].satisfied_final for p in ("dqoes", "default"))
    dm, bm = (sim_runs.results[p].met_final for p in ("dqoes", "default"))
    (headline,) = texts(at.subheader)
    assert headline == (f"DQoES met {dm} of 40 objectives, default Swarm {bm}: {round(dm / bm, 1):g}x; "
                        f"in band {d} and {b}: {round(d / b, 1):g}x")
    assert [m.value for m in at.metric] == [f"{dm} of 40", f"{bm} of 40"]
    assert [m.label.split(": ")[-1] for m in at.metric] == ["met", "met"]
    assert [m.label.split(" (")[0] for m in at.metric] == ["DQoES", "default Swarm"]
    charts = specs(at)
    assert len(charts) == 9  # both runs on one axis, then four figures each side by side

    def domains(spec):
        enc = spec.get("spec", spec)["encoding"]
        return enc["x"]["scale"]["domain"], enc["y"]["scale"]["domain"]

    assert [len(c["hconcat"]) for c in charts[:1]] == [2]  # the runs figure: counts, CPU split
    pairs = charts[1:]
    for left, right in zip(pairs[::2], pairs[1::2], strict=True):
        assert domains(left) == domains(right)
    # The tables are the view's own: the summary of each run.
    runs = views.compare_order([data.load_timeline(f) for f in sim_runs.files.values()])
    want = views.summary_table(views.node_summary(runs[0]))
    got = at.dataframe[0].value
    assert list(got["in band"]) == list(want["in band"])
    assert list(got["node"]) == ["worker-1", "worker-2", "worker-3", "worker-4", "total"]


def test_recorded_single_run_and_an_empty_file(monkeypatch, sim_runs, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a_dqoes_seed1.jsonl").write_bytes(sim_runs.files["dqoes"].read_bytes())
    (runs / "empty.jsonl").write_text('{"kind": "meta", "policy": "dqoes"}\n')
    at = app(monkeypatch, runs=str(runs), page=RECORDED)
    at.selectbox[0].select(str(runs / "a_dqoes_seed1.jsonl"))
    at.run()
    at.selectbox[1].select("(none)")
    at.run()
    assert not at.exception and not at.subheader  # no comparison, no ratio
    res = sim_runs.results["dqoes"]
    assert [m.value for m in at.metric] == [f"{res.met_final} of 40"]
    assert len(specs(at)) == 4
    at.selectbox[0].select(str(runs / "empty.jsonl"))
    at.run()
    assert not at.exception
    assert "No rounds recorded in empty.jsonl." in texts(at.warning)


# --- live: no cluster --------------------------------------------------------------------------


def test_live_page_with_no_cluster_given_says_recorded_runs_only(monkeypatch):
    at = app(monkeypatch)
    assert any("No cluster given: showing recorded runs only" in t for t in texts(at.info))
    submit(at, "c1", "30")
    assert texts(at.error) == ["no cluster to send to: nothing was sent"]


def test_live_page_with_no_cluster_answering_says_so(monkeypatch):
    at = app(monkeypatch, sources="dqoes=nats://127.0.0.1:9")
    (warning,) = texts(at.warning)
    assert warning.startswith("No cluster at nats://127.0.0.1:9: showing recorded runs only.")
    assert "cannot connect to 127.0.0.1:9" in " ".join(texts(at.caption))
    assert not at.metric
    submit(at, "c1", "30")
    assert texts(at.error) == ["not connected to nats://127.0.0.1:9: nothing was sent"]


# --- live: a real cluster -------------------------------------------------------------------------


def test_live_page_shows_the_cluster_and_the_form_talks_to_its_manager(monkeypatch, small_stack):
    at = app(monkeypatch, sources=f"dqoes={small_stack.url}")
    rerun_until(at, lambda a: a.metric and a.dataframe and len(a.dataframe[2].value) == 6)
    (metric,) = at.metric
    assert metric.label == "DQoES: met" and metric.value.endswith(" of 6")
    summary, listener, containers, params = (d.value for d in at.dataframe)
    assert list(summary["node"]) == ["node-a", "node-b", "total"]
    assert {"met", "in band", "throttled"} <= set(containers.columns)
    assert set(containers["throttled"]) == {"-"}  # the simulated runtime measures no throttling
    for _, row in containers.iterrows():
        assert row["met"] == {"G": "yes", "S": "yes", "B": "no"}.get(row["class"], "-")
        assert row["in band"] == {"G": "no", "S": "yes", "B": "no"}.get(row["class"], "-")
    assert list(params["node"]) == ["node-a", "node-b"] and list(params["alpha"]) == [0.1, 0.1]
    assert int(metric.value.split()[0]) == summary["met"].iloc[-1]
    assert sorted(containers["container"]) == ["c1", "c2", "c3", "c4", "c5", "c6"]
    assert set(containers["model"]) == {"small"}
    assert list(listener["policy"]) == ["dqoes", "dqoes"]
    assert len(specs(at)) == 4

    with BusTap(small_stack.url_for("admin"), subjects.TARGETS) as tap:  # only the admin may listen there
        for container, objective, alpha, words in [
            ("", "30", "", "container: required"),
            ("c3", "", "", "objective: required"),
            ("c3", "soon", "", "objective: 'soon' is not a number"),
            ("c3", "-4", "", "objective: must be more than 0 seconds per batch, got -4"),
            ("c3", "30", "2", "alpha: must be strictly between 0 and 1, got 2"),
        ]:
            submit(at, container, objective, alpha)
            (err,) = texts(at.error)
            assert words in err and err.endswith("(nothing was sent)")
            assert not at.json
        time.sleep(0.3)
        assert tap.messages == []  # nothing invalid reached the bus

        submit(at, "c3", "30", "0.2")
        (ok,) = texts(at.success)
        assert ok.startswith("objective for c3: 30 s a batch (running on node-a")
        reply = at.json[0].value
        reply = json.loads(reply) if isinstance(reply, str) else reply
        assert reply["ok"] is True and reply["container"] == "c3" and reply["node"] == "node-a"
        submit(at, "ghost", "12")
        (err,) = texts(at.error)
        assert err.startswith("refused: unknown container 'ghost'")
        reply = at.json[0].value
        reply = json.loads(reply) if isinstance(reply, str) else reply
        assert reply["ok"] is False and err == "refused: " + reply["error"]
        time.sleep(0.3)
        assert [orjson.loads(m) for m in tap.messages] == [
            {"container": "c3", "objective": 30.0, "alpha": 0.2},
            {"container": "ghost", "objective": 12.0},
        ]

    with BusTap(small_stack.url_for("admin"), subjects.TARGETS_CLEAR) as tap:
        field(at, "container").input("c3")
        next(b for b in at.button if b.label == "Clear objective").click()
        at.run()
        assert not at.exception, at.exception
        (ok,) = texts(at.success)
        assert ok == ("objective for c3 cleared: unmanaged now, its CPU limit released "
                      "(unless it carries its own dqoes.objective_s label)")
        field(at, "container").input("c3")
        next(b for b in at.button if b.label == "Clear objective").click()
        at.run()
        (err,) = texts(at.error)
        assert err == "refused: no objective stored for 'c3'"
        time.sleep(0.3)
        assert [orjson.loads(m) for m in tap.messages] == [{"container": "c3"}, {"container": "c3"}]

    # A service objective at a percentile: set through the form, shown with its kind, cleared.
    field(at, "service").input("dqoes.model=small")
    field(at, "percentile").input("95")
    field(at, "window").input("30")
    submit(at, "", "30")
    (ok,) = texts(at.success)
    assert ok.startswith("objective for service dqoes.model=small: p95 30 s over 30 s (governs"), ok
    stored = next(d.value for d in at.dataframe if "from" in d.value.columns)
    assert list(stored["for"]) == ["dqoes.model=small"] and list(stored["from"]) == ["service"]
    assert list(stored["objective"]) == ["p95 30 s over 30 s"]
    next(b for b in at.button if b.label == "Clear objective").click()
    at.run()
    (ok,) = texts(at.success)
    assert ok.startswith("objective for service dqoes.model=small cleared")
    for name in ("service", "percentile", "window"):
        field(at, name).input("")


@pytest.fixture(scope="module")
def default_stack(tmp_path_factory, small_stack):
    """The same workload under default Swarm, on the same scenario clock as small_stack."""
    spec = StackSpec(load(str(SMALL), 1), policy="default", time_scale=20.0, state_interval_s=0.3)
    s = Stack(spec, run_dir=tmp_path_factory.mktemp("default"))
    s.start(small_stack.start_at)
    yield s
    s.stop()


def test_twin_runs_side_by_side_on_the_same_axes(monkeypatch, small_stack, default_stack):
    at = app(monkeypatch, sources=f"dqoes={small_stack.url},default={default_stack.url}")
    rerun_until(at, lambda a: len(a.metric) == 2)
    assert [m.label for m in at.metric] == ["DQoES: met", "default Swarm: met"]
    headline, form, stored = texts(at.subheader)
    assert headline.startswith("DQoES met ") and " of 6 objectives, default Swarm " in headline
    assert "; in band " in headline
    assert (form, stored) == ("Set or clear an objective", "Stored objectives")
    charts = specs(at)
    assert len(charts) == 9  # both runs on one axis, then four figures each side by side
    assert [len(c["hconcat"]) for c in charts[:1]] == [2]  # the runs figure: counts, CPU split
    pairs = charts[1:]
    for left, right in zip(pairs[::2], pairs[1::2], strict=True):
        l_enc = left.get("spec", left)["encoding"]
        r_enc = right.get("spec", right)["encoding"]
        assert l_enc["x"]["scale"] == r_enc["x"]["scale"]
        assert l_enc["y"]["scale"] == r_enc["y"]["scale"]
    # One form for both stacks: a stack is chosen, or both.
    assert at.selectbox[0].options == ["dqoes", "default", "all stacks"]
    at.selectbox[0].select("all stacks")
    submit(at, "c1", "9")
    assert [t.split(":")[0] for t in texts(at.success)] == ["dqoes", "default"]
