"""`dqoes dashboard` and the dashboard `dqoes up` starts: real processes, a real Streamlit server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dashboard import access
from shared.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "e2e" / "small-cluster.json"


def spawn(*args: str, state_dir: Path, token: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(state_dir)}
    env.pop("DQOES_NATS_URL", None)
    env.pop(access.TOKEN_ENV, None)
    if token is not None:
        env[access.TOKEN_ENV] = token
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def read_until(proc: subprocess.Popen[str], done, timeout_s: float = 60.0) -> list[str]:
    """stdout lines until done(line) (the process must not exit first)."""
    lines: list[str] = []
    t_end = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < t_end:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"exited ({proc.wait()}): {lines} {proc.stderr.read()}")
        lines.append(line.rstrip("\n"))
        if done(lines[-1]):
            return lines
    raise AssertionError(f"no end line within {timeout_s:g} s: {lines}")


TOKEN_URL = re.compile(r"^(http://127\.0\.0\.1:\d+)/\?token=([A-Za-z0-9_-]{32})$")
"""What `dqoes dashboard` and `dqoes up` print: the address with a fresh random token."""


def base_of(url: str) -> str:
    """http://HOST:PORT of a printed address (the part before /?token=)."""
    return url.split("/?", 1)[0]


def health(url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{base_of(url)}/_stcore/health", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGINT) -> tuple[int, str]:
    """Signal the process, wait for it; (exit status, its stderr). Its pipes are closed."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


def test_dashboard_with_no_cluster_says_recorded_runs_only(tmp_path):
    port = free_port()
    proc = spawn("dashboard", "--nats", "nats://127.0.0.1:9", "--runs", str(tmp_path),
                 "--port", str(port), "--log", str(tmp_path / "d.log"), state_dir=tmp_path)
    try:
        lines = read_until(proc, lambda x: "Ctrl-C stops it." in x)
        url = lines[0].removeprefix("DQoES dashboard at ")
        m = TOKEN_URL.match(url)
        assert m and m.group(1) == f"http://127.0.0.1:{port}", lines[0]
        assert lines[1].split()[:2] == ["live", "nats://127.0.0.1:9"]
        assert "no cluster answers (the page shows recorded runs only and keeps trying)" in lines[1]
        assert f"recorded runs from {tmp_path}/" in lines[2]
        assert health(url) == "ok"
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert health(url) is None  # the server went with it


def test_dashboard_json_names_its_address(tmp_path):
    proc = spawn("dashboard", "--no-live", "--runs", str(tmp_path), "--json", state_dir=tmp_path)
    try:
        (line,) = read_until(proc, lambda x: x.startswith("{"))
        info = json.loads(line)
        assert info["sources"] == [] and info["unreachable"] == [] and info["runs"] == str(tmp_path)
        assert TOKEN_URL.match(info["url"]) and health(info["url"]) == "ok"
    finally:
        code, err = stop(proc, signal.SIGTERM)
    assert code == 0, err
    assert health(info["url"]) is None


def test_the_token_and_the_nats_url_never_reach_a_command_line(tmp_path):
    """`ps` shows every user each process's command line: the token and a URL's password stay out of it."""
    secret_url = "nats://someone:hunter2-secret@127.0.0.1:9"
    proc = spawn("dashboard", "--nats", secret_url, "--runs", str(tmp_path), "--json",
                 state_dir=tmp_path, token="given-token-123")
    try:
        (line,) = read_until(proc, lambda x: x.startswith("{"))
        info = json.loads(line)
        assert info["url"].endswith("/?token=given-token-123")  # $DQOES_DASHBOARD_TOKEN is used as given
        cmdline = Path(f"/proc/{info['pid']}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "dashboard.serve" in cmdline and "--server.address 127.0.0.1" in cmdline
        assert "given-token-123" not in cmdline and "hunter2" not in cmdline and "127.0.0.1:9" not in cmdline
        environ = Path(f"/proc/{info['pid']}/environ").read_bytes().split(b"\0")
        assert f"{access.TOKEN_ENV}=given-token-123".encode() in environ
        with urllib.request.urlopen(base_of(info["url"]), timeout=5) as r:  # the page's shell holds no token
            assert b"given-token-123" not in r.read()
    finally:
        code, err = stop(proc, signal.SIGTERM)
    assert code == 0, err
    assert "hunter2" not in err


@pytest.mark.integration
def test_up_starts_the_dashboard_prints_its_address_and_stops_it(tmp_path):
    proc = spawn("up", "--scenario", str(SMALL), "--time-scale", "60", "--duration", "60",
                 "--run-dir", str(tmp_path / "run"), "--runs", str(tmp_path), state_dir=tmp_path)
    try:
        lines = read_until(proc, lambda x: "dashboard:" in x)
        url = lines[-1].split("dashboard:")[1].strip()
        assert TOKEN_URL.match(url), url
        assert health(url) == "ok"
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    assert "final (plateau of the last" in out
    assert health(url) is None
    assert list((tmp_path / "run").glob("*/dashboard.log"))  # beside the stack of the policy in force


def test_a_sigterm_right_after_the_announcement_is_caught_not_fatal():
    # The handlers go in before the dashboard says where it is: whoever reads that line may stop it at
    # once (CI under load once got -15, the default action, from a SIGTERM sent just after it).
    from services.cli.common import signals_as_flag

    before = signal.getsignal(signal.SIGTERM)
    with signals_as_flag() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop["now"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_started_by_hand_it_makes_a_token_and_keeps_the_safe_defaults(tmp_path):
    """`python -m dashboard.serve` with no token set makes one and prints the address, as Jupyter does."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), access.TOKEN_ENV: ""}
    proc = subprocess.Popen([sys.executable, "-m", "dashboard.serve", "--server.port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        (line,) = read_until(proc, lambda x: x.startswith("DQoES dashboard: open "))
        url = line.removeprefix("DQoES dashboard: open ")
        m = TOKEN_URL.match(url)
        assert m and m.group(1) == f"http://127.0.0.1:{port}", line
        t_end = time.monotonic() + 60
        while health(url) != "ok":
            assert time.monotonic() < t_end and proc.poll() is None, "the server never answered"
            time.sleep(0.3)
    finally:
        stop(proc, signal.SIGTERM)
    from dashboard.serve import DEFAULT_FLAGS, with_defaults

    flags = with_defaults(["--server.address=0.0.0.0", "--server.port", "1"])
    assert flags[:3] == ["--server.address=0.0.0.0", "--server.port", "1"]  # what is given is kept
    assert "--server.address" not in flags[3:]
    assert flags[flags.index("--client.toolbarMode") + 1] == DEFAULT_FLAGS["--client.toolbarMode"] == "minimal"
