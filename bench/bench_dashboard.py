"""Dashboard speed: every figure and table from a snapshot of 40 containers x 1,000 rounds.

Goal (issue "Streamlit dashboard"): building all figures and tables of a
live cluster of 4 workers x 10 containers with 1,000 rounds of history each
takes well under 1 s, so the page can refresh every second. Measured the way
the page does it: the collector's tables (`History.run`), then
`views.figures` and the charts serialized to Vega-Lite (what Streamlit sends
to the browser). Also: one refresh after a new round arrives (the steady
state of a live page), a twin run (two clusters side by side), and a
recorded paper-cluster-40 timeline opened from its file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import altair as alt

from bench.common import median, pct, report, time_it
from dashboard import data, views
from dashboard.live import History, TimeOrigin
from dashboard.synthetic import node_states
from shared.scenarios.builtin import BUILTINS
from shared.sim.engine import simulate
from shared.timeline import run_file_name, write_jsonl

NODES, PER_NODE, ROUNDS = 4, 10, 1000
GOAL_S = 1.0


def history(label: str = "dqoes", seed: int = 1, origin: TimeOrigin | None = None) -> History:
    h = History(label, history_rounds=ROUNDS, origin=origin)
    for ns, d in node_states(NODES, PER_NODE, ROUNDS, seed=seed):
        h.add_decision(d)
        h.add_state(ns)
    return h


def to_browser(chart: Any) -> None:
    """Serialize a chart as `st.altair_chart` does (Vega-Lite spec, data as Arrow)."""
    try:
        from streamlit.elements.vega_charts import _convert_altair_to_vega_lite_spec
    except ImportError:  # Streamlit moved it: plain Altair, the same work less the Arrow step
        with alt.data_transformers.disable_max_rows():
            chart.to_dict()
        return
    _convert_altair_to_vega_lite_spec(chart)


def build_all(runs: list[data.RunData], now_at: float | None = None) -> list[views.Figures]:
    """What one page refresh computes: shared axes, every figure and table, charts serialized."""
    d = views.domains_for(runs)
    figs = [views.figures(r, d, now_at=now_at, side_by_side=len(runs) > 1) for r in runs]
    for f in figs:
        for chart in (f.satisfied, f.q, f.cpu, f.interval):
            to_browser(chart)
    return figs


def points(figs: list[views.Figures]) -> int:
    """Rows of data the browser is sent for the charts."""
    total = 0
    for f in figs:
        for chart in (f.satisfied, f.q, f.cpu, f.interval):
            data_rows: Any = chart.data
            total += len(data_rows) if hasattr(data_rows, "__len__") else 0
    return total


def run() -> dict:
    res: dict = {}
    h = history()
    now = max(ns.at for ns in h.latest.values())
    size = f"{NODES} workers x {PER_NODE} containers x {ROUNDS:,} rounds"

    def rebuild() -> data.RunData:
        h._frames = None  # noqa: SLF001 - time the tables from the ring buffers, not the cache
        h._run = None  # noqa: SLF001
        return h.run()

    ts = time_it(rebuild, repeat=5)
    run_ = rebuild()
    assert len(run_.rounds) == NODES * ROUNDS and len(run_.containers) == NODES * PER_NODE * ROUNDS
    res["tables_from_snapshot_s"] = report(
        f"tables from the snapshot ({size}; median of 5)", median(ts), "s")

    ts = time_it(lambda: build_all([run_], now), repeat=5)
    res["figures_s"] = report("all figures and tables from those tables (median of 5)", median(ts), "s")
    res["chart_points"] = report("  chart rows sent to the browser", points(build_all([run_], now)), "rows")

    ts = time_it(lambda: build_all([rebuild()], now), repeat=5)
    res["snapshot_to_figures_s"] = report(
        "snapshot -> every figure and table, from scratch (median of 5)", median(ts), "s",
        goal=GOAL_S)
    report("  p100 (slowest of 5)", max(ts), "s")

    # Steady state: a new round of every node arrived since the last refresh.
    extra = list(node_states(NODES, PER_NODE, ROUNDS + 20, seed=1))[NODES * ROUNDS:]
    it = iter(extra)

    def refresh() -> None:
        for _ in range(NODES):
            ns, d = next(it)
            h.add_decision(d)
            h.add_state(ns)
        build_all([h.run()], now)

    ts = time_it(refresh, repeat=15, warmup=2)
    res["refresh_after_new_round_s"] = report(
        "one live refresh after a new round (median of 15)", median(ts), "s", goal=GOAL_S)
    report("  p95", pct(ts, 0.95), "s")

    origin = TimeOrigin()
    twin = [history("dqoes", 1, origin).run(), history("default", 2, origin).run()]
    ts = time_it(lambda: build_all(twin, now), repeat=3)
    res["twin_figures_s"] = report(
        "twin run: both clusters side by side, all figures (median of 3)", median(ts), "s",
        goal=GOAL_S)

    sc = BUILTINS["paper-cluster-40"](1)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for policy in ("dqoes", "default"):
            r = simulate(sc, policy, 1, record=True)
            files.append(write_jsonl(Path(tmp) / run_file_name(sc.name, policy, 1),
                                     r.timeline + [{"kind": "result", **r.summary()}]))
        ts = time_it(lambda: build_all([data.load_timeline(f) for f in files]), repeat=3)
    res["recorded_comparison_s"] = report(
        "recorded comparison: read 2 paper-cluster-40 files + all figures (median of 3)",
        median(ts), "s", goal=GOAL_S)
    return res
