"""The figures and tables as numbers: every view function checked against an independent source.

Recorded runs are checked against what the simulator itself wrote or
returned (its per-round totals, its plateau measure); live tables against
`shared.aggregate`, the function the manager sums node states with.
"""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from dashboard import data, views
from dashboard.live import History
from dashboard.synthetic import node_states
from services.manager.logic import aggregate
from shared.timeline import read_jsonl


def _history(nodes: int = 4, per_node: int = 10, rounds: int = 30, seed: int = 1) -> History:
    h = History("dqoes", history_rounds=1000)
    for ns, d in node_states(nodes, per_node, rounds, seed=seed):
        h.add_decision(d)
        h.add_state(ns)
    return h


# --- recorded runs against the simulator ---------------------------------------------------


def test_total_satisfied_series_matches_the_simulators_running_total(sim_runs):
    for policy, path in sim_runs.files.items():
        run = data.load_timeline(path)
        sat = views.satisfied_frame(run)
        total = sat[sat["series"] == views.TOTAL].set_index("t_s")["satisfied"]
        # The simulator writes its cluster total with every round; the last one at each instant.
        expected = {}
        for row in read_jsonl(path):
            if row.get("kind") == "round":
                expected[row["t_s"]] = row["satisfied_total"]
        assert len(total) == len(expected), policy
        for t_s, want in expected.items():
            assert total[t_s] == want, (policy, t_s)
        per_node = sat[sat["series"] != views.TOTAL]
        assert len(per_node) == sim_runs.results[policy].rounds


def test_outcome_is_the_simulators_plateau_with_or_without_the_result_line(sim_runs):
    for policy, path in sim_runs.files.items():
        res = sim_runs.results[policy]
        run = data.load_timeline(path)
        o = views.outcome(run)
        assert (o.satisfied, o.containers) == (res.satisfied_final, res.containers)
        assert "120" in o.how
        rows = [r for r in read_jsonl(path) if r.get("kind") != "result"]
        unfinished = data.run_from_rows(rows, "unfinished")
        assert unfinished.result is None
        assert views.outcome(unfinished).satisfied == res.satisfied_final, policy
        # The three numbers: met and CPU from the result line, and computed alike without it.
        assert o.met == res.met_final and o.cpu_cores == pytest.approx(res.cpu_cores_final, abs=1e-3), policy
        assert o.three_numbers().startswith(f"met {res.met_final} · in band {res.satisfied_final} of 40 · CPU ")
        again = views.outcome(unfinished)
        assert again.met == res.met_final, policy
        assert again.cpu_cores is not None and abs(again.cpu_cores - res.cpu_cores_final) <= 0.05 * res.cores_total


def test_comparison_states_the_ratio_plainly(sim_runs):
    runs = views.compare_order([data.load_timeline(f) for f in sim_runs.files.values()][::-1])
    assert [r.policy for r in runs] == ["dqoes", "default"]
    d, b = (sim_runs.results[p].satisfied_final for p in ("dqoes", "default"))
    dm, bm = (sim_runs.results[p].met_final for p in ("dqoes", "default"))
    assert d > b > 0 and dm > bm > 0  # the paper's finding, here for seed 1
    text = views.ratio_sentence(views.outcome(runs[0]), views.outcome(runs[1]))
    assert text == (
        f"DQoES met {dm} of 40 objectives, default Swarm {bm}: {round(dm / bm, 1):g}x; "
        f"in band {d} and {b}: {round(d / b, 1):g}x"
    )


@pytest.mark.parametrize(
    "a, b, met, band",
    [
        ((26, 23), (21, 2), ": 1.2x;", "in band 23 and 2: 11.5x"),
        ((16, 16), (2, 2), ": 8x;", ": 8x"),
        ((7, 7), (2, 2), ": 3.5x;", ": 3.5x"),
        ((5, 5), (0, 0), ": no ratio (default Swarm met none);", ": no ratio (none in band under default Swarm)"),
        ((0, 0), (0, 0), ": neither met any;", ": none in band on either side"),
        ((1, 1), (3, 3), ": 0.33x;", ": 0.33x"),
    ],
)
def test_ratio_sentence_cases(a, b, met, band):
    one = views.Outcome("DQoES", "dqoes", a[1], 40, "now", met=a[0])
    two = views.Outcome("default Swarm", "default", b[1], 40, "now", met=b[0])
    text = views.ratio_sentence(one, two)
    assert text.startswith(f"DQoES met {a[0]} of 40 objectives, default Swarm {b[0]}{met} in band {a[1]} and {b[1]}")
    assert text.endswith(band)


def test_without_met_the_comparison_is_on_in_band():
    one = views.Outcome("DQoES", "dqoes", 22, 40, "final")
    two = views.Outcome("default Swarm", "default", 2, 30, "final", met=20)
    assert views.ratio_sentence(one, two) == "DQoES kept 22 of 40 containers in band, default Swarm 2 of 30: 11x"
    assert ui_headline(one) == ("DQoES: in band", "22 of 40")
    assert ui_headline(two) == ("default Swarm: met", "20 of 30")


def ui_headline(o: views.Outcome) -> tuple[str, str]:
    from dashboard.ui import headline

    label, value, _ = headline(o.name, o)
    return label, value


def test_two_runs_are_drawn_on_identical_axes(sim_runs):
    runs = [data.load_timeline(f) for f in sim_runs.files.values()]
    d = views.domains_for(runs)
    for r in runs:
        assert d.t_s[0] <= r.rounds["t_s"].min() and r.rounds["t_s"].max() <= d.t_s[1]
        assert d.slack_sum_s[0] < r.rounds[["slack_sum_g_s", "slack_sum_s_s", "slack_sum_b_s"]].min().min()
        assert d.slack_sum_s[1] > r.rounds[["slack_sum_g_s", "slack_sum_s_s", "slack_sum_b_s"]].max().max()
    assert d.satisfied_max == 40
    figs = [views.figures(r, d, side_by_side=True) for r in runs]

    def scales(chart):
        spec = chart.to_dict()
        enc = spec.get("spec", spec)["encoding"]
        return enc["x"]["scale"]["domain"], enc["y"]["scale"]["domain"]

    for name in ("satisfied", "q", "cpu", "interval"):
        a, b = (scales(getattr(f, name)) for f in figs)
        assert a == b, name
        assert a[0] == list(d.t_s)


def test_recorded_q_s_is_the_sum_of_q_over_s_containers(sim_runs):
    run = data.load_timeline(sim_runs.files["dqoes"])
    c = run.containers
    s = c[c["cls"] == "S"].groupby(["node", "round"])["slack_s"].sum()
    r = run.rounds.set_index(["node", "round"])
    assert (r["S"] > 0).any()
    for key, q in s.items():
        assert r.loc[key, "slack_sum_s_s"] == pytest.approx(q)
    assert (r.loc[r["S"] == 0, "slack_sum_s_s"] == 0).all()


# --- live tables against the manager's own sum ----------------------------------------------


def test_node_summary_equals_the_managers_aggregate():
    h = _history(rounds=25)
    run = h.run()
    cs = aggregate(h.latest.values(), at=max(ns.at for ns in h.latest.values()))
    s = views.node_summary(run)
    assert list(s.index) == [*sorted(cs.nodes), views.TOTAL]
    for node, n in cs.nodes.items():
        row = s.loc[node]
        for f in ("satisfied", "G", "S", "B", "pending", "containers"):
            assert row[f] == getattr(n, f), (node, f)
        for f in ("slack_sum_g_s", "slack_sum_s_s", "slack_sum_b_s", "interval_s", "at"):
            assert row[f] == pytest.approx(getattr(n, f), abs=1e-9), (node, f)
    tot = s.loc[views.TOTAL]
    assert tot["satisfied"] == cs.satisfied_total and tot["containers"] == cs.containers_total
    for f in ("G", "S", "B", "pending"):
        assert tot[f] == getattr(cs, f)
    for f in ("slack_sum_g_s", "slack_sum_s_s", "slack_sum_b_s"):
        assert tot[f] == pytest.approx(getattr(cs, f), abs=1e-9)


def test_node_summary_at_given_times_picks_those_samples():
    h = _history(rounds=10)
    past = {}
    for ns, _ in node_states(4, 10, 10, seed=1):
        if ns.round == 4:
            past[ns.node] = ns
    s = views.node_summary(h.run(), at_by_node={n: ns.at for n, ns in past.items()})
    cs = aggregate(past.values(), at=1.0e9 + 1)
    assert s.loc[views.TOTAL, "satisfied"] == cs.satisfied_total
    assert s.loc[views.TOTAL, "slack_sum_b_s"] == pytest.approx(cs.slack_sum_b_s)


def test_silent_nodes_are_marked_and_left_out_of_the_live_total():
    h = _history(nodes=2, rounds=5)
    run = h.run()
    latest = views.latest_per_node(run)
    newest = float(latest["at"].max())
    s = views.node_summary(run, now_at=newest + views.STALE_AFTER_S - 0.2)
    # worker-1 published half a second before worker-2: only worker-1 is silent too long
    assert bool(s.loc["worker-1", "stale"]) and not bool(s.loc["worker-2", "stale"])
    assert s.loc[views.TOTAL, "satisfied"] == s.loc["worker-2", "satisfied"]
    t = views.summary_table(s)
    assert list(t["note"]) == ["silent: not counted", "", ""]


def test_containers_table_is_each_nodes_latest_sample():
    h = _history(nodes=2, per_node=3, rounds=6)
    run = h.run()
    t = views.containers_table(run)
    assert len(t) == 6
    for ns in h.latest.values():
        for c in ns.containers:
            row = t[t["container"] == c.container].iloc[0]
            assert row["node"] == ns.node and row["model"] == c.model
            assert row["class"] == c.cls.value
            assert row["objective (s)"] == round(c.objective_s, 2)
            assert row["latency (s)"] == round(c.latency_s, 2)
            assert row["limit (share of node)"] == f"{c.limit:.3f}"
            assert row["limit (cores)"] == f"{c.limit * ns.cores:.2f}"
            assert row["met"] == ("yes" if c.cls.value in "GS" else "no")
            assert row["in band"] == ("yes" if c.cls.value == "S" else "no")


def test_containers_table_shows_met_in_band_and_throttling():
    rows = [
        {"kind": "meta", "policy": "dqoes", "nodes": {"n1": 2.0}},
        {"kind": "round", "t_s": 0.0, "node": "n1", "round": 1, "satisfied": 1, "G": 1,
         "S": 1, "B": 1, "pending": 1, "slack_sum_g_s": 1.0, "slack_sum_b_s": -1.0, "interval_s": 10.0},
        *({"kind": "container", "t_s": 0.0, "node": "n1", "round": 1, "container": name, "cls": cls,
           "objective_s": 1.0, "throttled_ratio": ratio}
          for name, cls, ratio in (("g", "G", 0.0), ("s", "S", 0.25), ("b", "B", 0.9), ("p", None, None))),
        {"kind": "container", "t_s": 0.0, "node": "n1", "round": 1, "container": "u", "objective_s": None},
    ]
    t = views.containers_table(data.run_from_rows(rows, "t")).set_index("container")
    assert dict(t["met"]) == {"g": "yes", "s": "yes", "b": "no", "p": "-", "u": "-"}
    assert dict(t["in band"]) == {"g": "no", "s": "yes", "b": "no", "p": "-", "u": "-"}
    assert dict(t["throttled"]) == {"g": "0%", "s": "25%", "b": "90%", "p": "-", "u": "-"}


def test_params_table_lists_each_nodes_parameters_in_force():
    h = _history(nodes=2, per_node=2, rounds=2)
    t = views.params_table(h.latest)
    assert list(t["node"]) == sorted(h.latest)
    ns = h.latest[t["node"][0]]
    for k, v in ns.params.items():
        assert t[k][0] == round(v, 4)
    assert views.params_table({}).empty


def test_no_limit_reads_none_and_is_drawn_at_the_whole_node():
    rows = [
        {"kind": "meta", "policy": "default", "nodes": {"n1": 2.0}},
        {"kind": "round", "t_s": 0.0, "node": "n1", "round": 1, "satisfied": 0, "G": 0,
         "S": 0, "B": 1, "pending": 1, "slack_sum_g_s": 0.0, "slack_sum_b_s": -1.0, "interval_s": 10.0},
        {"kind": "container", "t_s": 0.0, "node": "n1", "round": 1, "container": "a",
         "objective_s": 1.0, "cls": "B", "slack_s": -1.0, "latency_s": 2.0, "limit": None,
         "cpu_share": 0.4},
        {"kind": "container", "t_s": 0.0, "node": "n1", "round": 1, "container": "b",
         "objective_s": 1.0, "cls": None, "slack_s": None, "latency_s": None, "limit": 0.25},
        {"kind": "container", "t_s": 0.0, "node": "n1", "round": 1, "container": "x",
         "objective_s": None, "cls": None, "limit": None},
    ]
    run = data.run_from_rows(rows, "t")
    t = views.containers_table(run).set_index("container")
    assert t.loc["a", "limit (share of node)"] == "none" and t.loc["a", "limit (cores)"] == "none"
    assert t.loc["b", "limit (cores)"] == "0.50"
    assert (t.loc["b", "class"], t.loc["x", "class"]) == (data.PENDING, data.UNMANAGED)
    cpu = views.cpu_frame(run)
    limits = cpu[cpu["measure"] == "limit"].set_index("container")["share"]
    assert limits["a"] == 1.0 and limits["b"] == 0.25
    used = cpu[cpu["measure"] == "CPU used"]
    assert list(used["container"]) == ["a"]  # no CPU reading, no point


def test_q_and_interval_series_are_the_nodes_own_values():
    h = _history(nodes=2, rounds=8)
    run = h.run()
    q = views.q_frame(run)
    assert set(q["measure"]) == {"Q_G", "Q_S", "Q_B"} and len(q) == 3 * len(run.rounds)
    for ns, _ in node_states(2, 10, 8, seed=1):
        t_s = ns.at - h.origin.t0
        got = q[(q["node"] == ns.node) & (q["t_s"] == t_s)].set_index("measure")["slack_sum_s"]
        assert got["Q_G"] == pytest.approx(ns.slack_sum_g_s) and got["Q_B"] == pytest.approx(ns.slack_sum_b_s)
        assert got["Q_S"] == pytest.approx(sum(c.slack_s for c in ns.containers if c.cls == "S"))
    iv = views.interval_frame(run)
    assert sorted(iv["interval_s"].unique()) == [10.0, 20.0, 30.0, 40.0]
    lt = views.listener_table(run)
    assert list(lt["node"]) == ["worker-1", "worker-2"] and set(lt["listener"]) == {"kept"}


# --- thinning ----------------------------------------------------------------------------


def _step_value(df: pd.DataFrame, t: float, col: str) -> float:
    before = df[df["t_s"] <= t]
    return before[col].iloc[-1]


def test_thinning_keeps_every_step_of_a_step_series():
    rng = random.Random(3)
    rows = []
    for g in ("a", "b"):
        v = 0
        for i in range(300):
            if rng.random() < 0.1:
                v = rng.randint(0, 5)
            rows.append({"t_s": float(i), "series": g, "satisfied": v})
    df = pd.DataFrame(rows)
    out = views.thin(df, ["series"], ["satisfied"], max_points=1000)
    assert len(out) < len(df) / 3
    for g in ("a", "b"):
        full, thin = df[df["series"] == g], out[out["series"] == g]
        assert thin["t_s"].iloc[-1] == full["t_s"].iloc[-1]  # the last sample is kept
        for t in full["t_s"]:
            assert _step_value(thin, t, "satisfied") == _step_value(full, t, "satisfied")


def test_thinning_bounds_the_points_of_a_noisy_series():
    df = pd.DataFrame(
        {"t_s": [float(i) for i in range(5000)], "node": "n", "slack_s": [math.sin(i) for i in range(5000)]}
    )
    out = views.thin(df, ["node"], ["slack_s"], max_points=200)
    assert 150 <= len(out) <= 200
    assert out["t_s"].iloc[-1] == 4999.0 and out["t_s"].is_monotonic_increasing


def test_a_chart_of_many_series_keeps_fewer_points_each():
    assert views.points_per_series(12) == views.MAX_POINTS
    assert views.points_per_series(80) == views.CHART_POINTS // 80
    assert views.points_per_series(10_000) == 50
    h = _history(nodes=4, per_node=10, rounds=300)
    cpu = views.cpu_chart(h.run())
    assert len(cpu.data) <= views.CHART_POINTS
    per = cpu.data.groupby(["container", "measure"]).size()
    assert per.max() <= views.points_per_series(80) and per.min() >= 50


# --- everything at once ------------------------------------------------------------------


def test_figures_of_an_empty_run_are_empty_not_errors():
    run = data.run_from_rows([], "nothing")
    f = views.figures(run)
    assert f.outcome.satisfied == 0 and f.outcome.how == "no rounds recorded"
    assert f.containers.empty and f.listener.empty
    assert list(f.summary.index) == [views.TOTAL]
    for chart in (f.satisfied, f.q, f.cpu, f.interval):
        chart.to_dict()
