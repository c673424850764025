"""Training page: FlowCon against default on recorded training runs (completion bars, G and CPU share)."""

from __future__ import annotations

import streamlit as st

from dashboard import config, training, ui

cfg = st.session_state.get("dqoes_config") or config.current()
st.title("Training jobs: FlowCon and default")
if cfg.sources:
    snap = ui.collector(cfg.sources, cfg.history_rounds).snapshot()
    for src in snap.sources:
        if not src.training:
            continue
        live = training.live_run(src.label, src.training)
        st.subheader(f"Live: {src.label} ({live.policy})")
        st.dataframe(training.latest_jobs(live), hide_index=True)
        left, right = st.columns(2)
        left.altair_chart(training.growth_chart(live), use_container_width=True)
        right.altair_chart(training.share_chart(live), use_container_width=True)
files = [f for f in ui.list_runs(cfg.runs_dirs) if training.is_training_timeline(f)]
if not files:
    st.info(
        "No recorded training timelines. Write a pair with "
        "`dqoes experiment compare flowcon-4w-20jobs --seed 1 --out out/` and start the dashboard with "
        "`--runs out/`. Live clusters show here while their workers run training jobs "
        "(`dqoes submit`)."
    )
    st.stop()
first = st.selectbox("Run", files, format_func=lambda p: p.name)
others = [f for f in files if f != first]
suggested = training.counterpart(first, others)
second = st.selectbox("Compare with", [None, *others], index=0 if suggested is None else 1 + others.index(suggested),
                      format_func=lambda p: "(none)" if p is None else p.name)
runs = [training.load(first)] + ([training.load(second)] if second is not None else [])
if len(runs) == 2:
    st.markdown(training.summary_sentence(runs[0], runs[1]))
st.subheader("Completion time per job")
st.altair_chart(training.completion_chart(training.completion_frame(runs)), use_container_width=True)
for r in runs:
    st.subheader(f"{r.policy}: {r.scenario}, seed {r.seed}")
    left, right = st.columns(2)
    left.altair_chart(training.growth_chart(r), use_container_width=True)
    right.altair_chart(training.share_chart(r), use_container_width=True)
