"""Start the dashboard as its own process (`python -m dashboard.serve`), ready when it answers.

Why a process and not an import: Streamlit owns its server, event loop and
script threads; `dqoes dashboard` and `dqoes up` only need it running next to
them, on a free port, stopped with them. `start` waits until the server
answers its health check, so the address it returns works at once.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from dashboard.config import source_args
from shared import children
from shared.ports import free_port

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 60.0


class LaunchError(RuntimeError):
    """The dashboard did not start; the text says why (and where its log is)."""


def command(
    sources: Sequence[tuple[str, str]],
    port: int,
    runs_dir: str | None = None,
    address: str = "127.0.0.1",
    refresh_s: float | None = None,
) -> list[str]:
    """The command line (`python -m dashboard.serve`) for these clusters and run folder."""
    cmd = [
        sys.executable,
        "-m",
        "dashboard.serve",
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--",
        *source_args(sources),
    ]
    if runs_dir:
        cmd += ["--runs", str(runs_dir)]
    if refresh_s is not None:
        cmd += ["--refresh", repr(float(refresh_s))]
    return cmd


def start(
    sources: list[tuple[str, str]],
    port: int | None = None,
    runs_dir: str | None = None,
    log_path: str | None = None,
    *,
    address: str = "127.0.0.1",
    refresh_s: float | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    creds: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the dashboard; returns (process, "http://127.0.0.1:PORT") once it answers HTTP.

    `sources`: (label, NATS URL) of each cluster to follow (none: recorded
    runs only). `port` None: a free one. `log_path`: where its output goes
    (default: discarded). Raises LaunchError if it exits or does not answer
    within `ready_timeout_s`; the process is then stopped. `creds`: the
    credentials file it connects with (passed in $DQOES_NATS_CREDS, never on
    its command line).
    """
    port = port or free_port()
    cmd = command(sources, port, runs_dir, address, refresh_s)
    env = dict(os.environ)
    root = str(ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    if creds:
        env["DQOES_NATS_CREDS"] = str(creds)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True,
            preexec_fn=children.die_with_parent(),  # gone with whoever started it
        )
    finally:
        if log_path:
            out.close()  # type: ignore[union-attr]
    host = "127.0.0.1" if address in ("0.0.0.0", "::", "") else address
    url = f"http://{host}:{port}"
    try:
        wait_ready(proc, url, ready_timeout_s, log_path)
    except LaunchError:
        stop(proc)
        raise
    log.info("dashboard at %s (pid %d)", url, proc.pid)
    return proc, url


def wait_ready(
    proc: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: str | None = None
) -> None:
    """Return once `url` answers Streamlit's health check; LaunchError if the process dies or time runs out."""
    where = f"; its log: {log_path}" if log_path else ""
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise LaunchError(f"the dashboard exited with status {proc.returncode}{where}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise LaunchError(f"the dashboard did not answer at {url} within {timeout_s:g} s{where}")


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> int | None:
    """Stop the dashboard process (and its children): terminate, wait, kill."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
    return proc.returncode
