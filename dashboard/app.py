"""The DQoES dashboard's entry point: `python -m dashboard.serve -- --source LABEL=URL --runs DIR`.

(`streamlit run dashboard/app.py -- ...` works too, with $DQOES_DASHBOARD_TOKEN
set; the collector then starts with the first page view.) Layout only: the pages (`app_pages/live.py`,
`app_pages/recorded.py`) place what `dashboard.views` computes. `dqoes
dashboard` and `dqoes up` start it through `dashboard.launch.start`. Before
anything else the page checks the token (`dashboard.access`): without it,
one line of refusal and nothing more.

The pages live in `app_pages/`, not `pages/`: Streamlit treats a `pages/`
folder next to the main script as a second, older kind of navigation, and a
link straight to one of its pages would skip this script (and its settings).
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # `streamlit run` puts dashboard/ on the path, not the repository
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboard import config, ui  # noqa: E402

st.set_page_config(page_title="DQoES dashboard", page_icon=":material/speed:", layout="wide")
cfg = config.current()
if not ui.admitted(cfg.token):  # no token, no page: not even the navigation
    st.stop()
st.session_state["dqoes_config"] = cfg
pages = [
    st.Page("app_pages/live.py", title="Live", icon=":material/monitoring:", default=True),
    st.Page(
        "app_pages/recorded.py",
        title="Recorded runs",
        icon=":material/history:",
        url_path="recorded",
    ),
    st.Page("app_pages/training.py", title="Training", icon=":material/model_training:", url_path="training"),
]
st.navigation(pages).run()
