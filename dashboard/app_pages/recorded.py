"""Recorded page: one timeline, or two compared side by side with the ratio stated plainly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from dashboard import config, data, ui, views

cfg = st.session_state.get("dqoes_config") or config.current()
st.title("DQoES: recorded runs")
files = ui.list_runs(cfg.runs_dirs)
uploads = st.file_uploader(
    "Add timeline files (JSON lines from `dqoes experiment run --out` or `dqoes record`)",
    type=["jsonl"],
    accept_multiple_files=True,
)
runs_by_name: dict[str, tuple[str, Any]] = {}
for f in files:
    runs_by_name[str(f)] = ("file", f)
for u in uploads or []:
    runs_by_name[f"uploaded: {u.name}"] = ("upload", u)

if not runs_by_name:
    where = ", ".join(cfg.runs_dirs) if cfg.runs_dirs else "no run folder given"
    st.info(
        f"No timeline files found ({where}). Write some with "
        "`dqoes experiment run paper-cluster-40 --policy dqoes --seed 1 --out out/` "
        "(and `--policy default` for a comparison), then start the dashboard with "
        "`--runs out/`, or add files above."
    )
    st.stop()

names = list(runs_by_name)


def shown(name: str) -> str:
    return data.short_name(name, cfg.runs_dirs)


where = ", ".join(cfg.runs_dirs) or "no run folder"
first = st.selectbox(
    "Run",
    names,
    index=names.index(data.first_pick(names)),
    format_func=shown,
    help=f"Timeline files (*.jsonl) found in {where} and below, newest first, and uploads.",
)
others = ["(none)"] + [n for n in names if n != first]
suggested = data.counterpart(first, others) or "(none)"
second = st.selectbox("Compare with", others, index=others.index(suggested), format_func=shown)


def load(name: str):
    kind, what = runs_by_name[name]
    if kind == "file":
        return ui.load_run(what)
    return ui.load_upload(what.name, what.getvalue())


picked = [first] + ([second] if second != "(none)" else [])
chosen = [load(name) for name in picked]
empty = [Path(name).name for name, r in zip(picked, chosen, strict=True) if r.empty]
if empty:
    st.warning(f"No rounds recorded in {', '.join(empty)}.")
ui.show_runs(views.compare_order(chosen))
