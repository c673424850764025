"""`python -m dashboard.serve [streamlit flags] -- [app args]`: the dashboard's server process.

Why not plain `streamlit run`: Streamlit runs the page script only when a
browser opens the page, so a collector created by the page would start
following the cluster at the first visit and the figures would begin there.
This launcher starts the collector (`dashboard.live.Collector`) first and
registers it, then runs Streamlit's own `streamlit run` in the same process;
the page finds the registered collector (`dashboard.ui.collector`), so the
history covers the run from the moment the dashboard started, whoever looks.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(Streamlit's flags, the app's arguments): the app's come after `--`."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    from dashboard import config, live

    flags, app_args = split_args(sys.argv[1:] if argv is None else argv)
    cfg = config.parse(app_args)
    if cfg.sources:
        live.register(live.Collector(cfg.sources, history_rounds=cfg.history_rounds).start())

    from streamlit.web import cli as stcli

    sys.argv = ["streamlit", "run", str(APP), *flags, "--", *app_args]
    stcli.main()  # exits when the server stops
    return 0


if __name__ == "__main__":
    sys.exit(main())
