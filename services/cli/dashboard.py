"""`dqoes dashboard` and `dqoes record`: look at clusters and runs in a browser; record a live run.

`dqoes dashboard` starts the Streamlit dashboard (`dashboard.launch`) on a
free port, prints its address (with the token a browser needs, as Jupyter
does: `http://127.0.0.1:PORT/?token=...`) and runs until Ctrl-C. It follows the clusters
given with --nats/--source, else the stacks of the running `dqoes up` on this
machine (--deployment when several run), else $DQOES_NATS_URL, else localhost; with no cluster answering it
says so and shows recorded runs only. `dqoes record` writes a live cluster's
node states as a timeline file that the dashboard's recorded view opens.
`dqoes up` starts the same dashboard next to its stacks
(`services.cli.live`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from dashboard import launch
from dashboard.access import TOKEN_ENV
from dashboard.config import DEFAULT_RUNS_DIR, parse_source
from services.cli.common import (
    CliError,
    add_deployment_flag,
    add_nats_flags,
    emit_json,
    last_up,
    resolve_url,
    set_on_signals,
    signals_as_flag,
)
from shared import auth
from shared.bus import BusError
from shared.settings import DEFAULT_NATS_URL


def default_sources(deployment: str | None = None) -> list[tuple[str, str]]:
    """The stacks of the running `dqoes up` (labelled by policy), else $DQOES_NATS_URL, else localhost."""
    stacks = [(str(s["name"]), str(s["nats_url"])) for s in last_up(deployment)]
    return stacks or [("live", os.environ.get("DQOES_NATS_URL") or DEFAULT_NATS_URL)]


def sources_from(args: argparse.Namespace) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    try:
        for i, text in enumerate(args.source or []):
            out.append(parse_source(text, i))
    except ValueError as e:
        raise CliError(f"--source: {e}") from None
    for url in args.nats or []:
        label = "live" if not out and len(args.nats) == 1 else f"live-{len(out) + 1}"
        out.append((label, url))
    if not out:
        out = default_sources(getattr(args, "deployment", None))
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise CliError(
            f"cluster labels must be unique, got {', '.join(labels)} (use --source LABEL=URL)"
        )
    return out


def _wait_forever(proc: subprocess.Popen[bytes], stop: dict[str, bool]) -> None:
    while not stop["now"] and proc.poll() is None:
        time.sleep(0.2)


def dashboard_creds(args: argparse.Namespace, sources: list[tuple[str, str]]) -> str | None:
    """--creds, else $DQOES_NATS_CREDS, else the client credentials of the `dqoes up` followed."""
    if args.creds or os.environ.get(auth.CREDS_ENV):
        return args.creds or os.environ[auth.CREDS_ENV]
    urls = {u for _, u in sources}
    for s in last_up(getattr(args, "deployment", None)):
        if s.get("nats_url") in urls and s.get("auth_dir"):
            return str(auth.creds_path(s["auth_dir"], "client"))
    return None


def cmd_dashboard(args: argparse.Namespace) -> int:
    sources = [] if args.no_live else sources_from(args)
    runs = args.runs or DEFAULT_RUNS_DIR
    log_path = args.log or str(
        Path(os.environ.get("TMPDIR", "/tmp")) / f"dqoes-dashboard-{os.getpid()}.log"
    )
    try:
        proc, url = launch.start(
            sources, port=args.port, runs_dir=runs, log_path=log_path, address=args.address,
            creds=dashboard_creds(args, sources),
        )
    except launch.LaunchError as e:
        raise CliError(str(e)) from None
    from dashboard.live import probe  # pandas and the bus: only for this command

    with signals_as_flag() as stop:
        try:
            return _announce_and_wait(args, proc, url, sources, runs, log_path, probe, stop)
        finally:
            launch.stop(proc)


def _announce_and_wait(args: argparse.Namespace, proc: subprocess.Popen[bytes], url: str,
                       sources: list[tuple[str, str]], runs: str, log_path: str, probe: Any,
                       stop: dict[str, bool]) -> int:
    """Say where the dashboard is (a line, or one JSON object), then wait for a signal or its end."""
    missing = [(label, u) for label, u in sources if probe(u) is not None]
    if args.json:
        emit_json(
            {
                "url": url,
                "pid": proc.pid,
                "sources": [{"label": lb, "nats_url": u} for lb, u in sources],
                "unreachable": [u for _, u in missing],
                "runs": runs,
                "log": log_path,
            }
        )
    else:
        print(f"DQoES dashboard at {url}", flush=True)
        for label, u in sources:
            state = (
                "no cluster answers (the page shows recorded runs only and keeps trying)"
                if (label, u) in missing
                else "following"
            )
            print(f"  {label:<8} {u}   {state}")
        if not sources:
            print("  no cluster: recorded runs only")
        print(f"  recorded runs from {runs}/   log: {log_path}")
        print("  the address carries the page's token: whoever holds it can set objectives", flush=True)
        print("  Ctrl-C stops it.", flush=True)
    _wait_forever(proc, stop)
    if proc.poll() is not None and proc.returncode not in (0, -signal.SIGTERM):
        raise CliError(
            f"the dashboard exited with status {proc.returncode}; its log: {log_path}"
        )
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    if args.duration is not None and not args.duration > 0:
        raise CliError(f"--duration: must be more than 0 seconds, got {args.duration:g}")
    from dashboard.record import record  # pandas and the bus: only for this command

    url = resolve_url(args.nats, args.creds, deployment=args.deployment)
    stop = asyncio.Event()

    async def go(early: dict[str, bool]) -> dict[str, Any]:
        set_on_signals(stop, early)  # early: stopped before the loop took the signals over
        return await record(url, args.out, duration_s=args.duration, stop=stop, label=args.label)

    with signals_as_flag() as early:
        if not args.json:
            until = f"for {args.duration:g} s" if args.duration else "until Ctrl-C"
            print(f"recording {auth.redact(url)} into {args.out} {until}", flush=True)
        try:
            result = asyncio.run(go(early))
        except BusError as e:
            raise CliError(f"{e} (is a deployment running? try `dqoes up`)") from None
    if args.json:
        emit_json({**result, "out": str(args.out)})
    else:
        met = f"met {result['met_final']}, " if "met_final" in result else ""
        print(
            f"recorded {result['states']} node states over {result['recorded_s']:.0f} s: "
            f"{met}in band {result['satisfied_final']} of {result['containers']} "
            f"(plateau of the last {result['final_window_s']:.0f} s); open it with "
            f"`dqoes dashboard --runs {Path(args.out).parent}`"
        )
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard",
        help="the web dashboard: live clusters side by side, recorded runs, objectives",
        description="Start the Streamlit dashboard and print its address, which carries the token a "
        f"browser needs (${TOKEN_ENV}, else a random one). It follows the clusters "
        "given (default: the stacks of the running `dqoes up` (--deployment when several run), else $DQOES_NATS_URL, "
        "else localhost) "
        "and shows timeline files from --runs; with no cluster answering it shows recorded runs only.",
    )
    p.add_argument(
        "--nats",
        action="append",
        metavar="URL",
        help="NATS URL of a cluster to follow (repeatable)",
    )
    p.add_argument(
        "--source",
        action="append",
        metavar="LABEL=URL",
        help="a cluster with its label, e.g. dqoes=nats://127.0.0.1:4222 (repeatable)",
    )
    p.add_argument("--creds", metavar="FILE", help="credentials file (client role) for the clusters "
                   f"(default: ${auth.CREDS_ENV}, else the running `dqoes up`'s; docs/guide/security.md)")
    add_deployment_flag(p)
    p.add_argument("--no-live", action="store_true", help="recorded runs only; follow no cluster")
    p.add_argument(
        "--runs", metavar="DIR", help=f"folder of timeline files (default: ./{DEFAULT_RUNS_DIR})"
    )
    p.add_argument("--port", type=int, help="port to serve on (default: a free one)")
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to serve on (default 127.0.0.1; 0.0.0.0 for every interface, where the token "
        "in the printed address is then the only guard)",
    )
    p.add_argument("--log", metavar="FILE", help="the dashboard's log file (default: in $TMPDIR)")
    p.add_argument(
        "--json", action="store_true", help="print {url, pid, sources, ...} as one JSON line"
    )
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser(
        "record",
        help="record a live cluster as a timeline file (opens in the dashboard)",
        description="Write every node state of a running cluster as timeline JSON lines "
        "(the format of `dqoes experiment run --out`), until --duration or Ctrl-C.",
    )
    add_nats_flags(p)
    p.add_argument(
        "--out", required=True, metavar="FILE", help="the timeline file to write (.jsonl)"
    )
    p.add_argument(
        "--duration", type=float, metavar="S", help="stop after S wall seconds (default: Ctrl-C)"
    )
    p.add_argument("--label", default="live", help="name of the run in the file (default: live)")
    p.add_argument("--json", action="store_true", help="last line of stdout: the result as JSON")
    p.set_defaults(func=cmd_record)
