"""`python -m dashboard.serve [streamlit flags] -- [app args]`: the dashboard's server process.

Why not plain `streamlit run`: Streamlit runs the page script only when a
browser opens the page, so a collector created by the page would start
following the cluster at the first visit and the figures would begin there.
This launcher starts the collector (`dashboard.live.Collector`) first and
registers it, then runs Streamlit's own `streamlit run` in the same process;
the page finds the registered collector (`dashboard.ui.collector`), so the
history covers the run from the moment the dashboard started, whoever looks.

It also holds the defaults every launch gets: loopback only, a minimal
toolbar (no Deploy button, no developer menu), no usage statistics; and a
token: `$DQOES_DASHBOARD_TOKEN`, or when started by hand without one, a new
random one printed with the address (`dashboard.access`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

APP = Path(__file__).resolve().parent / "app.py"

DEFAULT_FLAGS = {
    "--server.address": "127.0.0.1",
    "--server.headless": "true",
    "--client.toolbarMode": "minimal",
    "--browser.gatherUsageStats": "false",
}
"""Streamlit settings of every launch, unless the command line gives its own."""


def split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(Streamlit's flags, the app's arguments): the app's come after `--`."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def with_defaults(flags: Sequence[str]) -> list[str]:
    """`flags` plus each of DEFAULT_FLAGS they do not set (as `--name value` or `--name=value`)."""
    given = {f.split("=", 1)[0] for f in flags if f.startswith("--")}
    out = list(flags)
    for name, value in DEFAULT_FLAGS.items():
        if name not in given:
            out += [name, value]
    return out


def flag_value(flags: Sequence[str], name: str, default: str) -> str:
    """The value of `--name value` or `--name=value` in `flags`, else `default`."""
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
    return default


def main(argv: Sequence[str] | None = None) -> int:
    from dashboard import access, config, live

    flags, app_args = split_args(sys.argv[1:] if argv is None else argv)
    flags = with_defaults(flags)
    if access.token_from(os.environ) is None:  # started by hand: make one and say it, as Jupyter does
        os.environ[access.TOKEN_ENV] = access.new_token()
        host = flag_value(flags, "--server.address", "127.0.0.1")
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        base = f"http://{host}:{flag_value(flags, '--server.port', '8501')}"
        print(f"DQoES dashboard: open {access.with_token(base, os.environ[access.TOKEN_ENV])}", flush=True)
    cfg = config.parse(app_args)
    if cfg.sources:
        live.register(live.Collector(cfg.sources, history_rounds=cfg.history_rounds).start())

    from streamlit.web import cli as stcli

    sys.argv = ["streamlit", "run", str(APP), *flags, "--", *app_args]
    stcli.main()  # exits when the server stops
    return 0


if __name__ == "__main__":
    sys.exit(main())
