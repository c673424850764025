"""Start the dashboard as its own process (`python -m dashboard.serve`), ready when it answers.

Why a process and not an import: Streamlit owns its server, event loop and
script threads; `dqoes dashboard` and `dqoes up` only need it running next to
them, on a free port, stopped with them. `start` waits until the server
answers its health check, so the address it returns works at once.

What a browser needs to get in travels in the environment, never on the
command line (which `ps` shows to every user): the token
(`dashboard.access`), the clusters' URLs (a URL may carry a password) and the
credentials file's path.
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
from pathlib import Path

from dashboard.access import TOKEN_ENV, new_token, token_from, with_token
from dashboard.config import SOURCES_ENV, sources_env
from shared import children
from shared.ports import free_port

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 60.0


class LaunchError(RuntimeError):
    """The dashboard did not start; the text says why (and where its log is)."""


def command(
    port: int,
    runs_dir: str | None = None,
    address: str = "127.0.0.1",
    refresh_s: float | None = None,
) -> list[str]:
    """The command line (`python -m dashboard.serve`) for this port and run folder.

    The clusters, the token and the credentials are not in it: `start`
    passes them in the environment.
    """
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
    ]
    if runs_dir:  # the user's folder: resolved here, where the user named it, not in the server's cwd
        cmd += ["--runs", str(Path(runs_dir).resolve())]
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
    token: str | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the dashboard; returns (process, "http://127.0.0.1:PORT/?token=...") once it answers HTTP.

    `sources`: (label, NATS URL) of each cluster to follow (none: recorded
    runs only). `port` None: a free one. `log_path`: where its output goes
    (default: discarded). Raises LaunchError if it exits or does not answer
    within `ready_timeout_s`; the process is then stopped. `creds`: the
    credentials file it connects with (passed in $DQOES_NATS_CREDS, never on
    its command line). `token`: what a browser must present; default
    $DQOES_DASHBOARD_TOKEN, else a new random one. The address returned
    carries it, as the one to print.
    """
    port = port or free_port()
    token = token or token_from(os.environ) or new_token()
    cmd = command(port, runs_dir, address, refresh_s)
    env = dict(os.environ)
    env[TOKEN_ENV] = token
    env[SOURCES_ENV] = sources_env(sources)
    env.setdefault("STREAMLIT_BROWSER_GATHER_USAGE_STATS", "false")
    if creds:
        env["DQOES_NATS_CREDS"] = str(creds)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=children.die_with_parent(),  # gone with whoever started it
        )
    finally:
        if log_path:
            out.close()  # type: ignore[union-attr]
    host = "127.0.0.1" if address in ("0.0.0.0", "::", "") else address
    base = f"http://{host}:{port}"
    try:
        wait_ready(proc, base, ready_timeout_s, log_path)
    except LaunchError:
        stop(proc)
        raise
    log.info("dashboard at %s (pid %d)", base, proc.pid)
    return proc, with_token(base, token)


def wait_ready(
    proc: subprocess.Popen[bytes], url: str, timeout_s: float, log_path: str | None = None
) -> None:
    """Return once `url` (http://HOST:PORT, no path) answers Streamlit's health check; LaunchError if the process dies or time runs out."""
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
