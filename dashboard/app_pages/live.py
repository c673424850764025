"""Live page: every cluster the dashboard follows, refreshed in place; the objective form."""

from __future__ import annotations

import streamlit as st

from dashboard import config, ui

cfg = st.session_state.get("dqoes_config") or config.current()
st.title("DQoES: live")
if not cfg.sources:
    st.info(
        "No cluster given: showing recorded runs only. Start the dashboard with "
        "`dqoes dashboard --nats nats://HOST:4222` to follow a running cluster."
    )
    st.page_link("app_pages/recorded.py", label="Open the recorded runs", icon=":material/history:")
    coll = None
else:
    coll = ui.collector(cfg.sources, cfg.history_rounds)
    coll.wait_first_attempt(3.0)

    live_coll = coll

    @st.fragment(run_every=cfg.refresh_s)
    def live_view() -> None:
        ui.show_live(live_coll.snapshot())

    live_view()

st.divider()
ui.objective_form(st, coll, [label for label, _ in cfg.sources])
