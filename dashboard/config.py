"""What one dashboard shows: which clusters (label, NATS URL), which run folders, how often.

Why a module: the settings reach the page two ways. `streamlit run
dashboard/app.py -- --source dqoes=nats://... --runs out/` (what
`dashboard.launch.start` runs) passes them after `--`; tests and containers
set environment variables instead (`DQOES_DASHBOARD_SOURCES=dqoes=nats://...,default=nats://...`,
`DQOES_DASHBOARD_RUNS=dir1:dir2`, `DQOES_DASHBOARD_REFRESH_S=1`). Flags win.
`dashboard.launch.start` hands the clusters over in the environment, one a
line, so that a NATS URL with a password in it never shows in `ps`; the
token (`dashboard.access`) only ever travels that way.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dashboard.access import token_from

SOURCES_ENV = "DQOES_DASHBOARD_SOURCES"
RUNS_ENV = "DQOES_DASHBOARD_RUNS"
REFRESH_ENV = "DQOES_DASHBOARD_REFRESH_S"
HISTORY_ENV = "DQOES_DASHBOARD_HISTORY"

DEFAULT_RUNS_DIR = "out"
"""Where `dqoes dashboard` and `dqoes up` look for timeline files unless told (relative to cwd)."""
DEFAULT_REFRESH_S = 1.0
DEFAULT_HISTORY_ROUNDS = 1000


@dataclass(frozen=True)
class Config:
    sources: tuple[tuple[str, str], ...] = ()
    """(label, NATS URL) of each cluster to follow live; empty: recorded runs only."""
    runs_dirs: tuple[str, ...] = ()
    """Folders searched for timeline files (*.jsonl) for the recorded view."""
    refresh_s: float = DEFAULT_REFRESH_S
    """Seconds between refreshes of the live view."""
    history_rounds: int = DEFAULT_HISTORY_ROUNDS
    """Samples kept per node in memory."""
    token: str | None = field(default=None, repr=False)
    """What a browser must present (`?token=`); None: no token set, the page refuses everyone."""


def parse_source(text: str, index: int = 0) -> tuple[str, str]:
    """`label=nats://host:port` -> (label, url); a bare URL is labelled `live` (`live-2`, ...)."""
    text = text.strip()
    if not text:
        raise ValueError("empty source (expected LABEL=nats://host:port)")
    label, sep, url = text.partition("=")
    if not sep or "://" in label:
        label, url = ("live" if index == 0 else f"live-{index + 1}"), text
    label, url = label.strip(), url.strip()
    if not label or not url:
        raise ValueError(f"bad source {text!r} (expected LABEL=nats://host:port)")
    return label, url


def source_args(sources: Sequence[tuple[str, str]]) -> list[str]:
    """The app's command-line arguments for `sources`."""
    out: list[str] = []
    for label, url in sources:
        out += ["--source", f"{label}={url}"]
    return out


def sources_env(sources: Sequence[tuple[str, str]]) -> str:
    """$DQOES_DASHBOARD_SOURCES for `sources`: one LABEL=URL a line, each line ended (a comma may be in a
    password, and a cluster's URL is a comma-separated list: never read as the one-line form)."""
    return "".join(f"{label}={url}\n" for label, url in sources)


def _split_sources(raw: str) -> list[str]:
    """Sources from the environment: one a line, or comma-separated when on one line (then a source
    that is a NATS cluster's URL list must be on a line of its own)."""
    parts = raw.splitlines() if "\n" in raw else raw.split(",")
    return [s for s in parts if s.strip()]


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    """The configuration from the app's arguments, then the environment."""
    env = os.environ if environ is None else environ
    ap = argparse.ArgumentParser(prog="dashboard/app.py", add_help=False)
    ap.add_argument("--source", action="append", default=[])
    ap.add_argument("--runs", action="append", default=[])
    ap.add_argument("--refresh", type=float)
    ap.add_argument("--history", type=int)
    args, _ = ap.parse_known_args(list(argv))
    raw_sources = args.source or _split_sources(env.get(SOURCES_ENV, ""))
    sources = tuple(parse_source(s, i) for i, s in enumerate(raw_sources))
    labels = [label for label, _ in sources]
    if len(set(labels)) != len(labels):
        raise ValueError(f"source labels must be unique, got {', '.join(labels)}")
    runs = args.runs or [d for d in env.get(RUNS_ENV, "").split(os.pathsep) if d.strip()]
    refresh = (
        args.refresh
        if args.refresh is not None
        else float(env.get(REFRESH_ENV) or DEFAULT_REFRESH_S)
    )
    history = (
        args.history
        if args.history is not None
        else int(env.get(HISTORY_ENV) or DEFAULT_HISTORY_ROUNDS)
    )
    return Config(
        sources=sources,
        runs_dirs=tuple(str(Path(d)) for d in runs),
        refresh_s=max(0.2, refresh),
        history_rounds=max(10, history),
        token=token_from(env),
    )


def current() -> Config:
    """This process's configuration: `streamlit run dashboard/app.py -- ARGS` or the environment.

    Arguments are only read when the app was started by `streamlit run`
    (argv[0] is the app), never from a test runner's command line.
    """
    argv = sys.argv[1:] if Path(sys.argv[0]).name == "app.py" else []
    return parse(argv)
