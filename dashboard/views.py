"""Figures and tables of a run: pure functions from a `RunData` to DataFrames and Altair charts.

Why: the page must hold layout only, and what it shows must be checkable
with explicit numbers. Everything the dashboard draws is computed here from
the two tables of `dashboard.data.RunData`, so the same code serves a live
cluster, a recorded timeline and a comparison, and the tests read the very
frames the charts are drawn from. A twin or comparison view computes one
`Domains` for all its runs and passes it to every chart, so both sides are
drawn on identical axes.

What is plotted, in the paper's terms:
- in band: |S|, containers within ±alpha of their objective, per worker and
  in total (met, at or under (1 + alpha) x the objective, is G and S);
- delivered QoE: Q_G, Q_S and Q_B per worker, each the sum of
  q = objective - latency over the containers of that class, in seconds per
  batch. Q_S here is that sum over S (the cluster state's `slack_sum_s_s`), close to
  0 by construction; the paper draws Q_S as |S|, which is the in band
  figure;
- CPU: each container's limit and the CPU it used, as fractions of its node
  (no limit is drawn at 1.0, the whole node);
- the adaptive listener: each worker's control interval over time.

Long series are thinned for drawing (`thin`): a step series keeps only the
samples where it changes, which loses nothing, and any series longer than
`MAX_POINTS` keeps the last sample of each of `MAX_POINTS` time buckets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import altair as alt
import pandas as pd

from dashboard.data import PENDING, UNMANAGED, RunData, policy_name
from shared.core.measures import plateau
from shared.schema import NodeState

TOTAL = "total"
STALE_AFTER_S = 15.0
"""A node whose latest state is older than this is left out of live totals (as the manager does)."""
MAX_POINTS = 400
"""Most points drawn per series; longer series are thinned."""
CHART_POINTS = 8000
"""Most points per chart: a chart of many series (the CPU chart: two per container) gets
fewer per series, so a browser redraws it every second without effort."""
FINAL_WINDOW_S = 120.0
"""Window of the simulator's plateau measure (at most a tenth of the run)."""

Q_MEASURES = {"slack_sum_g_s": "Q_G", "slack_sum_s_s": "Q_S", "slack_sum_b_s": "Q_B"}
Q_COLORS = {"Q_G": "#2ca02c", "Q_S": "#1f77b4", "Q_B": "#d62728"}
CLASS_ORDER = ("G", "S", "B", PENDING, UNMANAGED)

FACET_WIDTH_PX = 280
"""Width of one worker's panel when a run has the page to itself."""
FACET_WIDTH_SIDE_BY_SIDE_PX = 170
"""... and when two runs share the page's width."""
FACET_HEIGHT_PX = 130
CHART_HEIGHT_PX = 240


# --- thinning -----------------------------------------------------------------------


def thin(
    df: pd.DataFrame,
    keys: Sequence[str],
    value_cols: Sequence[str],
    max_points: int = MAX_POINTS,
    time_col: str = "t_s",
) -> pd.DataFrame:
    """Fewer rows, same picture: per group of `keys`, rows where a value changes (and the last).

    Then, if a group still has more than `max_points` rows, the last row of
    each of `max_points` equal time buckets. Rows must be in time order.
    """
    if df.empty:
        return df
    keys = list(keys)
    grouped = df.groupby(keys, sort=False)
    prev = grouped[list(value_cols)].shift()
    vals = df[list(value_cols)]
    changed = ~((vals == prev) | (vals.isna() & prev.isna())).all(axis=1)
    last = ~df.duplicated(keys, keep="last")
    out = df[changed | last]
    if out.groupby(keys, sort=False).size().max() <= max_points:
        return out
    t = out[time_col]
    lo, hi = float(t.min()), float(t.max())
    span = hi - lo if hi > lo else 1.0
    bucket = ((t - lo) / span * (max_points - 1)).round().astype("int64")
    return out[~out.assign(_bucket=bucket).duplicated([*keys, "_bucket"], keep="last")]


def points_per_series(series: int) -> int:
    """Points each of `series` series may keep: MAX_POINTS, less when a chart has many."""
    return max(50, min(MAX_POINTS, CHART_POINTS // max(1, series)))


# --- tables -------------------------------------------------------------------------


def latest_per_node(run: RunData) -> pd.DataFrame:
    """The latest rounds row of every node, indexed by node (sorted)."""
    r = run.rounds
    if r.empty:
        return r.set_index("node")
    return r.drop_duplicates("node", keep="last").set_index("node").sort_index()


def node_summary(
    run: RunData,
    *,
    at_by_node: dict[str, float] | None = None,
    now_at: float | None = None,
    stale_after_s: float = STALE_AFTER_S,
) -> pd.DataFrame:
    """Per node and in total: satisfied, G, S, B, pending, containers, Q_G, Q_S, Q_B, interval.

    The latest sample of each node, or with `at_by_node` the sample taken at
    that unix time (to compare with a cluster state that summed exactly
    those). With `now_at` (live), nodes silent for more than `stale_after_s`
    are marked stale and left out of the total, as the manager does.
    """
    cols = [
        "policy",
        "satisfied",
        "G",
        "S",
        "B",
        "pending",
        "containers",
        "slack_sum_g_s",
        "slack_sum_s_s",
        "slack_sum_b_s",
        "interval_s",
        "t_s",
        "at",
    ]
    if at_by_node is None:
        latest = latest_per_node(run)
    else:
        r = run.rounds
        picked = r[r["at"] == r["node"].map(at_by_node)]
        latest = picked.drop_duplicates("node", keep="last").set_index("node").sort_index()
    out = latest.reindex(columns=cols).copy()
    out["policy"] = out["policy"].astype(object)
    age = (now_at - out["at"]) if now_at is not None else pd.Series(math.nan, index=out.index)
    out["age_s"] = age
    out["stale"] = age > stale_after_s if now_at is not None else False
    fresh = out[~out["stale"].astype(bool)]
    total = {c: fresh[c].sum() for c in ("satisfied", "G", "S", "B", "pending", "containers")}
    total.update({c: math.fsum(fresh[c]) for c in ("slack_sum_g_s", "slack_sum_s_s", "slack_sum_b_s")})
    total.update(
        policy=", ".join(sorted(set(fresh["policy"].dropna()))),
        interval_s=math.nan,
        t_s=fresh["t_s"].max() if len(fresh) else math.nan,
        at=fresh["at"].max() if len(fresh) else math.nan,
        age_s=math.nan,
        stale=False,
    )
    out.loc[TOTAL] = pd.Series(total)
    for c in ("satisfied", "G", "S", "B", "pending", "containers"):
        out[c] = out[c].fillna(0).astype("int64")
    return out


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """`node_summary` for people: named columns, seconds rounded."""
    t = pd.DataFrame(
        {
            "node": summary.index,
            "met": (summary["G"] + summary["S"]).to_numpy(),
            "in band": summary["satisfied"].to_numpy(),
            "of": summary["containers"].to_numpy(),
            "G": summary["G"].to_numpy(),
            "S": summary["S"].to_numpy(),
            "B": summary["B"].to_numpy(),
            "pending": summary["pending"].to_numpy(),
            "Q_G (s)": summary["slack_sum_g_s"].round(2).to_numpy(),
            "Q_S (s)": summary["slack_sum_s_s"].round(2).to_numpy(),
            "Q_B (s)": summary["slack_sum_b_s"].round(2).to_numpy(),
            "interval (s)": summary["interval_s"].round(1).to_numpy(),
        }
    )
    if summary["stale"].astype(bool).any():
        t["note"] = ["silent: not counted" if s else "" for s in summary["stale"].astype(bool)]
    return t


def containers_table(run: RunData) -> pd.DataFrame:
    """Every container in its node's latest sample: model, node, objective, latency, class, limit.

    `limit (cores)` is the limit times the node's cores; "none": no limit.
    `met`: latency at or under (1 + alpha) x the objective (class G or S);
    `in band`: class S; both "-" for pending and unmanaged containers.
    `throttled`: share of CFS periods throttled since the worker's previous
    report; "-" where not measured (the simulator).
    """
    c = run.containers
    cols = [
        "container",
        "node",
        "model",
        "objective (s)",
        "latency (s)",
        "class",
        "met",
        "in band",
        "throttled",
        "slack (s)",
        "limit (share of node)",
        "limit (cores)",
        "CPU used (share of node)",
    ]
    if c.empty or run.rounds.empty:
        return pd.DataFrame(columns=cols)
    last_round = latest_per_node(run)["round"]
    now = c[c["round"].to_numpy() == c["node"].map(last_round).to_numpy()]
    cores = now["node"].map(lambda n: run.nodes.get(n, math.nan)).astype("float64")
    limit = now["limit"]
    out = pd.DataFrame(
        {
            "container": now["container"].to_numpy(),
            "node": now["node"].to_numpy(),
            "model": now["model"].fillna("").to_numpy(),
            "objective (s)": now["objective_s"].round(2).to_numpy(),
            "latency (s)": now["latency_s"].round(2).to_numpy(),
            "class": now["cls"].to_numpy(),
            "met": [_yes_no(k in ("G", "S"), k) for k in now["cls"]],
            "in band": [_yes_no(k == "S", k) for k in now["cls"]],
            "throttled": [_fmt_ratio(x) for x in now["throttled_ratio"]],
            "slack (s)": now["slack_s"].round(2).to_numpy(),
            "limit (share of node)": [_fmt_limit(x, 3) for x in limit],
            "limit (cores)": [
                _fmt_limit(x * k if not math.isnan(k) else math.nan, 2)
                for x, k in zip(limit, cores, strict=True)
            ],
            "CPU used (share of node)": now["cpu_share"].round(3).to_numpy(),
        }
    )
    return out.sort_values(["node", "container"], kind="stable").reset_index(drop=True)


def _yes_no(yes: bool, cls: object) -> str:
    return "yes" if yes else ("no" if cls in ("G", "S", "B") else "-")


def _fmt_ratio(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.0f}%"


def params_table(states: Mapping[str, NodeState]) -> pd.DataFrame:
    """Each node's policy parameters in force (what `dqoes control` reads and sets)."""
    rows = [{"node": n, "policy": ns.policy, **{k: round(v, 4) for k, v in sorted(ns.params.items())}}
            for n, ns in sorted(states.items())]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["node", "policy"])


def _fmt_limit(x: float, digits: int) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "none"
    return f"{x:.{digits}f}"


def listener_table(run: RunData) -> pd.DataFrame:
    """Each worker's adaptive listener now: policy, interval to the next round, what it did."""
    latest = latest_per_node(run)
    if latest.empty:
        return pd.DataFrame(columns=["node", "policy", "interval (s)", "listener", "last event"])
    return pd.DataFrame(
        {
            "node": latest.index,
            "policy": latest["policy"].fillna("").to_numpy(),
            "interval (s)": latest["interval_s"].round(1).to_numpy(),
            "listener": latest["listener"].fillna("").to_numpy(),
            "last event": latest["event"].fillna("on schedule").to_numpy(),
        }
    )


# --- series -------------------------------------------------------------------------


def satisfied_frame(run: RunData) -> pd.DataFrame:
    """|S| over time: columns t_s, series (a node or "total"), satisfied.

    The total at a time is the sum of every node's latest count at or before
    it (a node not heard from yet counts 0).
    """
    r = run.rounds
    if r.empty:
        return pd.DataFrame({"t_s": [], "series": [], "satisfied": []})
    per_node = r[["t_s", "node", "satisfied"]].rename(columns={"node": "series"})
    last = r.drop_duplicates(["t_s", "node"], keep="last")
    wide = last.pivot(index="t_s", columns="node", values="satisfied").sort_index().ffill()
    total = wide.fillna(0).sum(axis=1).astype("int64")
    tot = pd.DataFrame(
        {"t_s": total.index.to_numpy(), "series": TOTAL, "satisfied": total.to_numpy()}
    )
    return pd.concat([per_node, tot], ignore_index=True)


def q_frame(run: RunData) -> pd.DataFrame:
    """Q_G, Q_S, Q_B over time per node: columns t_s, node, measure, slack_sum_s (s per batch)."""
    r = run.rounds
    if r.empty:
        return pd.DataFrame({"t_s": [], "node": [], "measure": [], "slack_sum_s": []})
    long = r[["t_s", "node", *Q_MEASURES]].melt(
        ["t_s", "node"], var_name="measure", value_name="slack_sum_s"
    )
    return long.assign(measure=long["measure"].map(Q_MEASURES))


def cpu_frame(run: RunData) -> pd.DataFrame:
    """Each container's limit and CPU used over time: t_s, node, container, measure, share.

    Shares are fractions of the node; no limit is drawn at 1.0 (the whole node).
    """
    c = run.containers
    if c.empty:
        return pd.DataFrame({"t_s": [], "node": [], "container": [], "measure": [], "share": []})
    base = c[["t_s", "node", "container"]]
    limit = base.assign(measure="limit", share=c["limit"].fillna(1.0))
    used = base.assign(measure="CPU used", share=c["cpu_share"])
    used = used[used["share"].notna()]
    return pd.concat([limit, used], ignore_index=True)


def interval_frame(run: RunData) -> pd.DataFrame:
    """The control interval over time per node: t_s, node, interval_s."""
    return run.rounds[["t_s", "node", "interval_s"]].reset_index(drop=True)


# --- shared axes ----------------------------------------------------------------------


@dataclass(frozen=True)
class Domains:
    """Axis ranges shared by every run drawn side by side."""

    t_s: tuple[float, float]
    satisfied_max: int
    slack_sum_s: tuple[float, float]
    interval_s_max: float


def domains_for(runs: Sequence[RunData]) -> Domains:
    """One set of axes for all `runs`: the union of their times and values."""
    t_lo, t_hi, sat, q_lo, q_hi, iv = math.inf, -math.inf, 1, 0.0, 0.0, 1.0
    for run in runs:
        r = run.rounds
        sat = max(sat, run.containers_total)
        if r.empty:
            continue
        t_lo, t_hi = min(t_lo, float(r["t_s"].min())), max(t_hi, float(r["t_s"].max()))
        q = r[list(Q_MEASURES)]
        q_lo, q_hi = min(q_lo, float(q.min().min())), max(q_hi, float(q.max().max()))
        iv = max(iv, float(r["interval_s"].max()))
        sat = max(sat, int(satisfied_frame(run)["satisfied"].max()))
    if t_lo == math.inf:
        t_lo, t_hi = 0.0, 1.0
    if t_hi <= t_lo:
        t_hi = t_lo + 1.0
    pad = 0.05 * (q_hi - q_lo) or 1.0
    return Domains((t_lo, t_hi), sat, (q_lo - pad, q_hi + pad), iv * 1.1)


# --- charts -------------------------------------------------------------------------


NODE_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
)


def node_colors(nodes: Sequence[str]) -> list[str]:
    """One color per node (sorted names), the same in every chart of a run."""
    return [NODE_PALETTE[i % len(NODE_PALETTE)] for i in range(len(nodes))]


def _x(domains: Domains, title: str) -> alt.X:
    return alt.X("t_s:Q", title=title, scale=alt.Scale(domain=list(domains.t_s), nice=False))


def satisfied_chart(
    run: RunData, domains: Domains | None = None, frame: pd.DataFrame | None = None
) -> alt.Chart:
    """Containers in band (|S|) over time, one line per node and a thick black total."""
    d = domains or domains_for([run])
    df = thin(satisfied_frame(run) if frame is None else frame, ["series"], ["satisfied"])
    nodes = sorted(set(df["series"]) - {TOTAL}) if not df.empty else []
    color = alt.Color(
        "series:N",
        title=None,
        legend=alt.Legend(orient="right"),
        scale=alt.Scale(domain=[TOTAL, *nodes], range=["#000000", *node_colors(nodes)]),
    )
    return (
        alt.Chart(df, title="Containers in band (|S|)")
        .mark_line(interpolate="step-after")
        .encode(
            x=_x(d, run.time_label),
            y=alt.Y(
                "satisfied:Q", title="containers", scale=alt.Scale(domain=[0, d.satisfied_max])
            ),
            color=color,
            strokeWidth=alt.condition(f"datum.series === '{TOTAL}'", alt.value(3), alt.value(1.5)),
            tooltip=["series:N", alt.Tooltip("t_s:Q", format=".0f"), alt.Tooltip("satisfied:Q", title="in band")],
        )
        .properties(height=CHART_HEIGHT_PX)
    )


def q_chart(
    run: RunData, domains: Domains | None = None, facet_width_px: int = FACET_WIDTH_PX
) -> alt.FacetChart:
    """Q_G, Q_S, Q_B per worker over time (the paper's delivered QoE), s per batch."""
    d = domains or domains_for([run])
    df = thin(q_frame(run), ["node", "measure"], ["slack_sum_s"])
    return (
        alt.Chart(df)
        .mark_line(interpolate="step-after")
        .encode(
            x=_x(d, run.time_label),
            y=alt.Y("slack_sum_s:Q", title="s per batch", scale=alt.Scale(domain=list(d.slack_sum_s), nice=False)),
            color=alt.Color(
                "measure:N",
                title=None,
                legend=alt.Legend(orient="bottom"),
                scale=alt.Scale(domain=list(Q_COLORS), range=list(Q_COLORS.values())),
            ),
            tooltip=[
                "node:N",
                "measure:N",
                alt.Tooltip("t_s:Q", format=".0f"),
                alt.Tooltip("slack_sum_s:Q", format=".2f"),
            ],
        )
        .properties(width=facet_width_px, height=FACET_HEIGHT_PX)
        .facet(
            facet=alt.Facet("node:N", title=None),
            columns=2,
            title="Delivered QoE: Q_G, Q_S, Q_B per worker",
        )
    )


def cpu_chart(
    run: RunData, domains: Domains | None = None, facet_width_px: int = FACET_WIDTH_PX
) -> alt.FacetChart:
    """Each container's CPU limit (solid) and CPU used (dashed), fractions of its node."""
    d = domains or domains_for([run])
    frame = cpu_frame(run)
    series = 2 * frame["container"].nunique() if not frame.empty else 1
    df = thin(frame, ["container", "measure"], ["share"], points_per_series(series))
    return (
        alt.Chart(df)
        .mark_line(interpolate="step-after")
        .encode(
            x=_x(d, run.time_label),
            y=alt.Y("share:Q", title="share of node", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color(
                "container:N",
                title="container",
                scale=alt.Scale(scheme="tableau20"),
                legend=alt.Legend(
                    orient="bottom", columns=max(2, facet_width_px // 35), symbolLimit=0
                ),
            ),
            strokeDash=alt.StrokeDash(
                "measure:N",
                title=None,
                scale=alt.Scale(domain=["limit", "CPU used"], range=[[1, 0], [4, 3]]),
            ),
            tooltip=[
                "container:N",
                "measure:N",
                alt.Tooltip("t_s:Q", format=".0f"),
                alt.Tooltip("share:Q", format=".3f"),
            ],
        )
        .properties(width=facet_width_px, height=FACET_HEIGHT_PX)
        .facet(
            facet=alt.Facet("node:N", title=None),
            columns=2,
            title="CPU: limit (solid) and used (dashed)",
        )
    )


def interval_chart(run: RunData, domains: Domains | None = None) -> alt.Chart:
    """Each worker's control interval over time (Algorithm 2, the adaptive listener)."""
    d = domains or domains_for([run])
    df = thin(interval_frame(run), ["node"], ["interval_s"])
    nodes = sorted(set(df["node"])) if not df.empty else []
    return (
        alt.Chart(df, title="Adaptive listener: control interval")
        .mark_line(interpolate="step-after")
        .encode(
            x=_x(d, run.time_label),
            y=alt.Y(
                "interval_s:Q", title="interval (s)", scale=alt.Scale(domain=[0, d.interval_s_max])
            ),
            color=alt.Color(
                "node:N",
                title=None,
                legend=alt.Legend(orient="right"),
                scale=alt.Scale(domain=nodes, range=node_colors(nodes)),
            ),
            tooltip=["node:N", alt.Tooltip("t_s:Q", format=".0f"), "interval_s:Q"],
        )
        .properties(height=CHART_HEIGHT_PX * 2 // 3)
    )


# --- several runs on one axis ------------------------------------------------------------

RUN_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def compare_frames(runs: Sequence[RunData]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two runs (or more) as one figure's data.

    Series: every run's total |S| over time (t_s, count, run). Split: every
    container's mean CPU use, in cores, over the run's final window (container,
    run, cpu_cores), the share the policy ended up giving it.
    """
    series, split = [], []
    for run in runs:
        name = run.title
        sat = satisfied_frame(run)
        tot = sat[sat["series"] == TOTAL]
        series.append(pd.DataFrame({"t_s": tot["t_s"], "count": tot["satisfied"], "run": name}))
        c = run.containers
        if c.empty or c["cpu_share"].isna().all():
            continue
        end, begin = float(c["t_s"].max()), float(c["t_s"].min())
        start = max(begin, end - min(FINAL_WINDOW_S, (end - begin) / 10))
        last = c[(c["t_s"] >= start) & c["cpu_share"].notna()]
        cores = last["node"].map(run.nodes).astype(float)
        mean = (last["cpu_share"] * cores).groupby(last["container"]).mean()
        split.append(pd.DataFrame({"container": mean.index, "run": name, "cpu_cores": mean.to_numpy()}))
    empty_split = pd.DataFrame({"container": [], "run": [], "cpu_cores": []})
    return (
        pd.concat(series, ignore_index=True) if series else pd.DataFrame({"t_s": [], "count": [], "run": []}),
        pd.concat(split, ignore_index=True) if split else empty_split,
    )


def runs_figure(
    series: pd.DataFrame,
    split: pd.DataFrame,
    *,
    title: str = "",
    count_title: str = "containers in band |S|",
    count_max: int | None = None,
    time_title: str = "seconds",
) -> alt.HConcatChart:
    """Runs compared on one axis: a count over time per run, and each container's final CPU in cores.

    `series`: t_s, count, run; `split`: container, run, cpu_cores. Runs named
    "... simulated" are dashed (a forecast beside the real thing).
    """
    runs = list(dict.fromkeys([*series.get("run", []), *split.get("run", [])]))
    colors = alt.Scale(domain=runs, range=[RUN_PALETTE[i % len(RUN_PALETTE)] for i in range(len(runs))])
    ymax = count_max if count_max is not None else int(series["count"].max() if len(series) else 1)
    lines = (
        alt.Chart(thin(series, ["run"], ["count"]) if len(series) else series, title="over time")
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("t_s:Q", title=time_title),
            y=alt.Y("count:Q", title=count_title, scale=alt.Scale(domain=[0, max(1, ymax)])),
            color=alt.Color("run:N", scale=colors, title=None),
            strokeDash=alt.condition(
                "indexof(datum.run, 'simulated') >= 0", alt.value([5, 3]), alt.value([1, 0])
            ),
            tooltip=["run:N", alt.Tooltip("t_s:Q", format=".0f"), "count:Q"],
        )
        .properties(width=360, height=CHART_HEIGHT_PX)
    )
    bars = (
        alt.Chart(split, title="CPU per container")
        .mark_bar()
        .encode(
            x=alt.X("container:N", title=None),
            xOffset=alt.XOffset("run:N", sort=runs),
            y=alt.Y("cpu_cores:Q", title="cores (mean of the latest window)"),
            color=alt.Color("run:N", scale=colors, title=None),
            tooltip=["container:N", "run:N", alt.Tooltip("cpu_cores:Q", format=".2f")],
        )
        .properties(width=360, height=CHART_HEIGHT_PX)
    )
    return alt.hconcat(lines, bars, title=title or alt.Undefined)


def calibration_chart(df: pd.DataFrame) -> alt.HConcatChart:
    """Latency and CPU-seconds per batch against the CPU limit, measured and as the fitted profile.

    `df`: model, limit_cores, source ("measured" or "fitted profile"), latency_s, cpu_s.
    """
    def panel(field: str, title: str) -> alt.Chart:
        return (
            alt.Chart(df, title=title)
            .mark_line(point=True)
            .encode(
                x=alt.X("limit_cores:Q", title="CPU limit (cores)"),
                y=alt.Y(f"{field}:Q", title=f"{title} (log)", scale=alt.Scale(type="log")),
                color=alt.Color("model:N", title=None),
                strokeDash=alt.StrokeDash("source:N", title=None, sort=["measured", "fitted profile"]),
                tooltip=["model:N", "source:N", "limit_cores:Q", alt.Tooltip(f"{field}:Q", format=".3f")],
            )
            .properties(width=340, height=CHART_HEIGHT_PX)
        )

    return alt.hconcat(
        panel("latency_s", "seconds per batch"), panel("cpu_s", "CPU-seconds per batch"),
        title="dqoes calibrate: medians of the measured batches, and the fitted profile",
    )


def real_runs_chart(df: pd.DataFrame) -> alt.HConcatChart:
    """Each real run's second-half means against what the oracle expects under that run's noise, met and
    in band side by side, one point per run; on the diagonal a run kept all the oracle expects.

    `df`: run, node, policy, count ("met" or "in band"), expected, got.
    """
    top = float(max(df["expected"].max(), df["got"].max(), 1.0)) if len(df) else 1.0

    def panel(count: str) -> alt.LayerChart:
        part = df[df["count"] == count]
        diagonal = alt.Chart(pd.DataFrame({"x": [0.0, top], "y": [0.0, top]})).mark_line(
            color="gray", strokeDash=[4, 4]).encode(x="x:Q", y="y:Q")
        points = (
            alt.Chart(part)
            .mark_point(filled=True, size=70)
            .encode(
                x=alt.X("expected:Q", title="the oracle under the run's noise expects", scale=alt.Scale(domain=[0, top])),
                y=alt.Y("got:Q", title="mean over the run's second half", scale=alt.Scale(domain=[0, top])),
                color=alt.Color("node:N", title=None),
                shape=alt.Shape("policy:N", title=None),
                tooltip=["run:N", "node:N", "policy:N", alt.Tooltip("expected:Q", format=".2f"),
                         alt.Tooltip("got:Q", format=".2f")],
            )
        )
        return (diagonal + points).properties(title=count, width=300, height=300)

    return alt.hconcat(panel("met"), panel("in band"),
                       title="python -m lab real-index: every stored run against the oracle under its noise")


# --- outcomes and the ratio -------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How many containers of a run met their objective and were in band, and how that was measured.

    The three numbers a client counts: `met` (latest batch at or under
    (1 + alpha) x the objective: classes G and S), `satisfied` (in band, |S|)
    and `cpu_cores` (CPU the managed containers used, of `cores`); None where
    the run does not tell.
    """

    name: str
    policy: str
    satisfied: int
    containers: int
    how: str
    met: int | None = None
    cpu_cores: float | None = None
    cores: float | None = None

    def three_numbers(self) -> str:
        """ "met 25 · in band 21 of 40 · CPU 18.4 of 18.4 cores", with "-" for what is not known."""
        met = "-" if self.met is None else str(self.met)
        cpu = "-" if self.cpu_cores is None else f"{self.cpu_cores:.1f}"
        of = f" of {self.cores:g}" if self.cores else ""
        return f"met {met} · in band {self.satisfied} of {self.containers} · CPU {cpu}{of} cores"


def outcome(run: RunData, summary: pd.DataFrame | None = None) -> Outcome:
    """A live run: met and in band now. A recorded one: the simulator's plateau of the final window.

    A finished timeline carries it (`satisfied_final`, `met_final`,
    `cpu_cores_final`); otherwise it is computed the same way: the lower
    median of |S| (and of met) per node over the last min(120 s, a tenth of
    the run), summed, and the mean CPU used over that window.
    """
    name = policy_name(run.policy) if run.policy else run.label
    cores = float(sum(run.nodes.values())) or None
    if run.live:
        s = summary if summary is not None else node_summary(run)
        met = int(s.loc[TOTAL, "G"] + s.loc[TOTAL, "S"])
        return Outcome(name, run.policy, int(s.loc[TOTAL, "satisfied"]), run.containers_total, "now",
                       met=met, cpu_cores=_cpu_used(run, latest_only=True), cores=cores)
    res = run.result or {}
    if isinstance(res.get("satisfied_final"), int):
        window = res.get("final_window_s")
        how = f"plateau of the last {window:g} s" if isinstance(window, int | float) else "final"
        met_final = res.get("met_final")
        cpu = res.get("cpu_cores_final")
        return Outcome(
            name,
            run.policy,
            int(res["satisfied_final"]),
            int(res.get("containers") or run.containers_total),
            how,
            met=met_final if isinstance(met_final, int) else None,
            cpu_cores=float(cpu) if isinstance(cpu, int | float) else None,
            cores=float(res.get("cores_total") or 0) or cores,
        )
    r = run.rounds
    if r.empty:
        return Outcome(name, run.policy, 0, run.containers_total, "no rounds recorded")
    end = float(r["t_s"].max())
    begin = float(r["t_s"].min())
    start = max(begin, end - min(FINAL_WINDOW_S, (end - begin) / 10))
    total = met = 0
    for _, g in r.groupby("node", sort=True):
        t = g["t_s"].tolist()
        total += plateau(list(zip(t, g["satisfied"].tolist(), strict=True)), start, end)
        met += plateau(list(zip(t, (g["G"] + g["S"]).tolist(), strict=True)), start, end)
    return Outcome(
        name, run.policy, total, run.containers_total, f"plateau of the last {end - start:.0f} s",
        met=met, cpu_cores=_cpu_used(run, since_t_s=start), cores=cores,
    )


def _cpu_used(run: RunData, *, latest_only: bool = False, since_t_s: float = -math.inf) -> float | None:
    """Cores the containers used: at each node's latest sample, or the mean per sample since a time."""
    c = run.containers
    if c.empty or c["cpu_share"].isna().all():
        return None
    if latest_only:
        last = c.groupby("node")["round"].transform("max")
        c = c[c["round"] == last]
    else:
        c = c[c["t_s"] >= since_t_s]
    cores = c["node"].map(run.nodes).astype(float)
    used = (c["cpu_share"] * cores).groupby([c["node"], c["round"]]).sum(min_count=1)
    per_node = used.groupby(level=0).mean()
    return float(per_node.sum()) if per_node.notna().any() else None


def _ratio(x: float) -> str:
    return f"{round(x, 1):g}" if x >= 1 else f"{x:.2g}"


def _times(x: int, y: int, b_name: str, word: str) -> str:
    """x against y as a ratio, or what stands in for one when y is 0 ("met" or "in band")."""
    if x == 0 and y == 0:
        return "neither met any" if word == "met" else "none in band on either side"
    if y == 0:
        return f"no ratio ({b_name} met none)" if word == "met" else f"no ratio (none in band under {b_name})"
    return f"{_ratio(x / y)}x"


def ratio_sentence(a: Outcome, b: Outcome) -> str:
    """ "DQoES met 25 of 40 objectives, default Swarm 20: 1.2x; in band 22 and 2: 11x", 0 cases included.

    Met leads: it is what a client counts. A run that does not tell met (an
    older timeline) is compared on in band alone.
    """
    of_b = f" of {b.containers}" if b.containers != a.containers else ""
    band = _times(a.satisfied, b.satisfied, b.name, "in band")
    if a.met is None or b.met is None:
        return (f"{a.name} kept {a.satisfied} of {a.containers} containers in band, "
                f"{b.name} {b.satisfied}{of_b}: {band}")
    met = _times(a.met, b.met, b.name, "met")
    return (f"{a.name} met {a.met} of {a.containers} objectives, {b.name} {b.met}{of_b}: {met}; "
            f"in band {a.satisfied} and {b.satisfied}: {band}")


def compare_order(runs: Sequence[RunData]) -> list[RunData]:
    """DQoES first, then the rest in the order given (the ratio reads "DQoES to the other")."""
    return sorted(runs, key=lambda r: 0 if r.policy == "dqoes" else 1)


# --- everything for one run -------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """All a run's figures and tables, ready for layout."""

    summary: pd.DataFrame
    summary_table: pd.DataFrame
    outcome: Outcome
    satisfied: alt.Chart
    q: alt.FacetChart
    cpu: alt.FacetChart
    interval: alt.Chart
    containers: pd.DataFrame
    listener: pd.DataFrame


def figures(
    run: RunData,
    domains: Domains | None = None,
    *,
    now_at: float | None = None,
    side_by_side: bool = False,
) -> Figures:
    """Build every figure and table of `run` on `domains` (its own axes if None).

    `now_at` (unix s): a live run's present, to leave silent nodes out of the
    totals. `side_by_side`: narrower worker panels, for two runs in a row.
    """
    d = domains or domains_for([run])
    width = FACET_WIDTH_SIDE_BY_SIDE_PX if side_by_side else FACET_WIDTH_PX
    summary = node_summary(run, now_at=now_at)
    return Figures(
        summary=summary,
        summary_table=summary_table(summary),
        outcome=outcome(run, summary),
        satisfied=satisfied_chart(run, d),
        q=q_chart(run, d, width),
        cpu=cpu_chart(run, d, width),
        interval=interval_chart(run, d),
        containers=containers_table(run),
        listener=listener_table(run),
    )
