"""Layout shared by the dashboard's pages: where each figure and table goes, nothing computed.

Why a module: the live and the recorded pages show the same figures for one
run or two side by side; laying them out in one place keeps both pages
identical in shape. Numbers come from `dashboard.views`, data from
`dashboard.live` (cached once per set of NATS URLs) and `dashboard.data`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import access, forms, views
from dashboard.data import RunData, load_timeline, rows_from_bytes, run_from_rows
from dashboard.live import CONNECTED, UNREACHABLE, Collector, Snapshot, registered
from shared import subjects
from shared.auth import redact

log = logging.getLogger(__name__)

IN_BAND_HEIGHT_PX = 300
INTERVAL_HEIGHT_PX = 230
"""Heights of the single-panel charts, given to Streamlit (its theme takes the title out of
a chart's own height)."""


# --- the token ------------------------------------------------------------------------

ADMITTED_KEY = "dqoes_admitted"
"""Session state set once this browser session presented the token (it then moves between pages)."""


def admitted(token: str | None) -> bool:
    """Whether this session may see the pages: it presented `token` (`?token=`) now or earlier.

    Otherwise one line says why and nothing else is drawn; the caller stops.
    An admitted session keeps the token in the address bar: Streamlit drops
    the query when it moves to another page, and a reload there would
    otherwise be refused.
    """
    given = st.query_params.get(access.TOKEN_PARAM)
    if token and (st.session_state.get(ADMITTED_KEY) == token or access.allowed(given, token)):
        st.session_state[ADMITTED_KEY] = token
        if given != token:
            st.query_params[access.TOKEN_PARAM] = token
        return True
    st.markdown(access.REFUSAL if token else access.NO_TOKEN_SET)
    return False


# --- data, cached per process -------------------------------------------------------


def _release(collector: Collector) -> None:
    collector.stop()


@st.cache_resource(show_spinner=False, on_release=_release)
def _own_collector(sources: tuple[tuple[str, str], ...], history_rounds: int) -> Collector:
    return Collector(sources, history_rounds=history_rounds).start()


def collector(sources: tuple[tuple[str, str], ...], history_rounds: int) -> Collector:
    """The collector of these clusters, shared by every browser tab.

    The one `dashboard.serve` started with the server if there is one (its
    history begins when the dashboard started), else one started now.
    """
    return registered(sources) or _own_collector(sources, history_rounds)


@st.cache_resource(show_spinner=False, max_entries=16)
def _load_file(path: str, mtime_ns: int, size: int) -> RunData:
    return load_timeline(path)


def load_run(path: str | Path) -> RunData:
    """A timeline file, read once per version of the file."""
    st_ = Path(path).stat()
    return _load_file(str(path), st_.st_mtime_ns, st_.st_size)


@st.cache_resource(show_spinner=False, max_entries=8)
def load_upload(name: str, data: bytes) -> RunData:
    return run_from_rows(rows_from_bytes(data), Path(name).stem)


def list_runs(dirs: Sequence[str]) -> list[Path]:
    """Timeline files (*.jsonl) in the run folders and below them, newest first."""
    found: dict[Path, float] = {}
    for d in dirs:
        p = Path(d)
        if p.is_file() and p.suffix == ".jsonl":
            found[p] = p.stat().st_mtime
        elif p.is_dir():
            for f in p.rglob("*.jsonl"):
                found[f] = f.stat().st_mtime
    return sorted(found, key=lambda f: (-found[f], str(f)))


# --- one or more runs side by side ----------------------------------------------------


def show_runs(runs: Sequence[RunData], *, now_at: float | None = None) -> None:
    """Every figure of every run, side by side on shared axes, one row per figure."""
    runs = list(runs)
    if not runs:
        return
    domains = views.domains_for(runs)
    figs = [views.figures(r, domains, now_at=now_at, side_by_side=len(runs) > 1) for r in runs]
    if len(runs) == 2:
        st.subheader(views.ratio_sentence(figs[0].outcome, figs[1].outcome))
        st.caption(
            f"{figs[0].outcome.name}: {figs[0].outcome.how}; {figs[1].outcome.name}: "
            f"{figs[1].outcome.how}. Both sides are drawn on the same axes."
        )
    cols = st.columns(len(runs))
    for col, run, f in zip(cols, runs, figs, strict=True):
        label, value, why = headline(run.title, f.outcome)
        col.metric(label, value, help=why)
        col.caption(f.outcome.three_numbers())
    if len(runs) > 1:
        series, split = views.compare_frames(runs)
        st.altair_chart(views.runs_figure(series, split, time_title=runs[0].time_label), width="content")
    _row(runs, "summary", lambda c, r, f: c.dataframe(f.summary_table, hide_index=True), figs)
    _row(
        runs,
        "in band",
        lambda c, r, f: c.altair_chart(f.satisfied, width="stretch", height=IN_BAND_HEIGHT_PX),
        figs,
    )
    _row(runs, "q", lambda c, r, f: c.altair_chart(f.q), figs)
    st.caption(
        "Q_G, Q_S, Q_B: sums of q = objective - latency over the containers in G, S "
        "and B, in seconds per batch. Q_S is that sum over S (close to 0 by "
        "construction, the cluster state's slack_sum_s_s); the paper draws Q_S as |S|, "
        "which is the in band figure above."
    )
    _row(runs, "cpu", lambda c, r, f: c.altair_chart(f.cpu), figs)
    st.caption("No limit is drawn at 1.0, the whole node. Long series are thinned for drawing.")
    _row(
        runs,
        "interval",
        lambda c, r, f: c.altair_chart(f.interval, width="stretch", height=INTERVAL_HEIGHT_PX),
        figs,
    )
    _row(runs, "listener", lambda c, r, f: c.dataframe(f.listener, hide_index=True), figs)
    st.markdown("**Containers** (latest sample of each node)")
    _row(runs, "containers", lambda c, r, f: c.dataframe(f.containers, hide_index=True), figs)


def headline(title: str, o: views.Outcome) -> tuple[str, str, str]:
    """A run's metric (label, value, help): met of the containers; in band when met is not known."""
    if o.met is None:
        return (f"{title}: in band", f"{o.satisfied} of {o.containers}",
                f"containers within ±alpha of their objective (|S|), {o.how}")
    return (f"{title}: met", f"{o.met} of {o.containers}",
            f"containers whose latest batch took at most (1 + alpha) x their objective, {o.how}; "
            "in band: within ±alpha")


def _row(runs: Sequence[RunData], what: str, draw: Any, figs: Sequence[views.Figures]) -> None:
    cols = st.columns(len(runs))
    for col, run, f in zip(cols, runs, figs, strict=True):
        if len(runs) > 1 and what == "summary":
            col.markdown(f"**{run.title}**")
        draw(col, run, f)


# --- live -------------------------------------------------------------------------------


def no_cluster_text(snapshot: Snapshot) -> str:
    urls = ", ".join(redact(s.url) for s in snapshot.sources)
    return f"No cluster at {urls}: showing recorded runs only."


def show_live(snapshot: Snapshot) -> None:
    """The live view of every cluster in the snapshot."""
    if snapshot.all_unreachable:
        st.warning(
            no_cluster_text(snapshot) + " The page keeps trying and switches to the live "
            "view as soon as a cluster answers."
        )
        for s in snapshot.sources:
            st.caption(f"{s.label}: {s.error}")
        st.page_link(
            "app_pages/recorded.py", label="Open the recorded runs", icon=":material/history:"
        )
        return
    waiting = []
    for s in snapshot.sources:
        if s.status == UNREACHABLE:
            st.warning(f"No cluster at {redact(s.url)} ({s.label}): {s.error}")
        elif s.status != CONNECTED:
            st.info(f"{s.label}: connecting to {redact(s.url)}... {s.error}")
        elif not s.has_data:
            waiting.append(s)
    for s in waiting:
        st.info(
            f"{s.label}: connected to {redact(s.url)}; waiting for the first node state "
            "(no worker has published yet)."
        )
    ready = [s for s in snapshot.sources if s.has_data]
    if not ready:
        return
    st.caption(
        " | ".join(f"{s.label}: {redact(s.url)}, {s.states} node states received" for s in ready)
        + f" | refreshed {time.strftime('%H:%M:%S', time.localtime(snapshot.taken_at))}"
    )
    show_runs(views.compare_order([s.run for s in ready]), now_at=snapshot.taken_at)
    st.markdown("**Policy parameters in force** (`dqoes control` reads and sets them)")
    cols = st.columns(len(ready))
    for col, s in zip(cols, ready, strict=True):
        col.dataframe(views.params_table(s.latest), hide_index=True)


def objective_form(col: Any, coll: Collector | None, labels: Sequence[str]) -> None:
    """Set or clear a container's objective (`dqoes.targets`, `.clear`); checked here first, reply shown."""
    col.subheader("Set or clear an objective")
    with col.form("objective", clear_on_submit=False):
        all_label = "all stacks"
        choices = list(labels) + ([all_label] if len(labels) > 1 else [])
        target = (
            st.selectbox("stack", choices, disabled=not choices)
            if len(choices) > 1
            else (choices[0] if choices else None)
        )
        container = st.text_input("container", placeholder="c01")
        service = st.text_input("service (instead of a container: every replica, present and future)",
                                placeholder="api, or app=api")
        objective = st.text_input("objective (seconds per batch, or at the percentile)", placeholder="30")
        alpha = st.text_input("alpha (optional, 0 < alpha < 1)", placeholder="node default")
        percentile = st.text_input("percentile (optional, 0 < p < 100)", placeholder="per batch")
        window = st.text_input("window in seconds (optional, with a percentile)", placeholder="the source's")
        buttons = st.columns(2)
        sent = buttons[0].form_submit_button("Set objective")
        clear = buttons[1].form_submit_button("Clear objective")
    to = list(labels) if target == all_label else ([str(target)] if target else [])
    if sent:
        send = coll.request_target if coll is not None else None
        replies = forms.submit(container, objective, alpha, to, send, service=service, percentile=percentile,
                               window_s=window)
        st.session_state["objective_reply"] = replies
    elif clear:
        send_clear = coll.request_clear if coll is not None else None
        st.session_state["objective_reply"] = forms.submit_clear(container, to, send_clear, service)
    for label, reply in st.session_state.get("objective_reply", []):
        where = f"{label}: " if label and len(labels) > 1 else ""
        if reply.get("answered") is False:  # checked here, or never reached a manager
            col.error(where + str(reply.get("error")))
        elif reply.get("ok"):
            col.success(where + forms.describe_reply(reply))
            col.json(reply)
        else:
            col.error(where + forms.describe_reply(reply))
            col.json(reply)
    stored_objectives(col, coll, labels)


def stored_objectives(col: Any, coll: Collector | None, labels: Sequence[str]) -> None:
    """Every stored objective of each cluster (`dqoes.targets.list`): for services and for containers."""
    if coll is None or not labels:
        return
    col.subheader("Stored objectives")
    for label in labels:
        reply = coll.request_target(label, {}, timeout_s=1.0, subject=subjects.TARGETS_LIST)
        where = f"{label}: " if len(labels) > 1 else ""
        if not reply.get("ok"):
            col.caption(where + str(reply.get("error")))
        elif not reply.get("targets"):
            col.caption(where + "no objectives stored")
        else:
            if where:
                col.caption(where)
            col.dataframe(pd.DataFrame(forms.targets_rows(reply["targets"]), columns=list(forms.TARGET_COLUMNS)),
                          hide_index=True)
