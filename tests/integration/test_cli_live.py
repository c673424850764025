"""`dqoes up | status | target set | watch` as a user runs them: real processes, real NATS."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.cli.stack import Stack, StackSpec
from shared.scenarios.builtin import load

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def dqoes(*args, timeout=120, env=None):
    e = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(Path(env or "/tmp") / "dqoes-state")}
    e.pop("DQOES_NATS_URL", None)
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=e)


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_up_runs_a_scenario_and_reports_like_the_simulator(tmp_path):
    r = dqoes("up", "--scenario", "paper-varied", "--time-scale", "60", "--duration", "600", "--json",
              "--no-dashboard", "--run-dir", str(tmp_path / "run"), timeout=180, env=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    res = last_json(r.stdout)
    assert res["scenario"] == "paper-varied" and res["interrupted"] is False
    # learned is the default policy
    assert res["policies"].keys() == {"learned"}
    assert res["policies"]["learned"]["satisfied_per_node"].keys() == {"worker-1"}
    assert res["policies"]["learned"]["satisfied_final"] >= 4  # well on its way to 8 by 600 s
    # The three numbers: met counts every in-band container and those faster than asked.
    dq = res["policies"]["learned"]
    assert dq["met_per_node"].keys() == {"worker-1"} and dq["met_final"] >= dq["satisfied_final"]
    assert 0 < dq["cpu_cores_final"] <= dq["cores_total"] and dq["cpu_cores_idle"] >= 0
    for log in (tmp_path / "run" / "learned").glob("*.log"):
        assert "Traceback" not in log.read_text(), log


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(StackSpec(load("paper-varied"), time_scale=5.0, start_delay_s=0.5, state_interval_s=0.3),
              run_dir=tmp_path_factory.mktemp("cli"))
    with s:
        deadline = time.monotonic() + 30
        while dqoes("status", "--nats", s.url, "--json").returncode != 0:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        yield s


def test_target_set_status_and_watch(stack, tmp_path):
    deadline = time.monotonic() + 30
    while True:
        r = dqoes("target", "set", "c01", "30", "--nats", stack.url, "--json")
        if r.returncode == 0:
            break
        assert time.monotonic() < deadline, r.stdout + r.stderr
        time.sleep(0.3)
    reply = last_json(r.stdout)
    assert reply["ok"] and reply["node"] == "worker-1" and reply["objective_s"] == 30

    r = dqoes("target", "set", "c02", "12.5", "--alpha", "0.2", "--nats", stack.url)
    assert r.returncode == 0 and "objective for c02: 12.5 s a batch" in r.stdout

    assert dqoes("target", "set", "c03", "0.25", "--nats", stack.url).returncode == 0
    deadline = time.monotonic() + 30  # status prints an objective as it was set, not rounded
    while not any(x.split()[1:2] == ["c03"] and "0.25 s" in x for x in dqoes("status", "--nats", stack.url).stdout.splitlines()):
        assert time.monotonic() < deadline, dqoes("status", "--nats", stack.url).stdout
        time.sleep(0.5)

    r = dqoes("target", "set", "ghost", "30", "--nats", stack.url)
    assert r.returncode == 1 and "refused: unknown container 'ghost'" in r.stderr

    status = last_json(dqoes("status", "--nats", stack.url, "--json").stdout)
    assert status["type"] == "cluster_state" and "worker-1" in status["nodes"]
    human = dqoes("status", "--nats", stack.url).stdout
    assert "worker-1" in human and "total" in human
    assert human.splitlines()[0].split()[:6] == ["node", "policy", "met", "in", "band", "CPU"]
    assert status["met_total"] is not None and status["cpu_cores_used_total"] is not None

    r = dqoes("watch", "--nats", stack.url, "--count", "2", "--every", "0.5", "--json", timeout=30)
    lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
    assert r.returncode == 0 and len(lines) >= 2 and all(x["type"] == "cluster_state" for x in lines)


@pytest.mark.parametrize("args, words", [
    (["target", "set", "c01", "-5"], "must be > 0"),
    (["target", "set", "c01", "nan"], "finite"),
    (["target", "set", "c01", "30", "--alpha", "1.5"], "alpha"),
    (["target", "set", "bad name", "30"], "whitespace"),
])
def test_bad_target_arguments_send_nothing(stack, args, words):
    r = dqoes(*args, "--nats", stack.url)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_status_with_nothing_running_is_one_clear_line(tmp_path):
    r = dqoes("status", "--nats", "nats://127.0.0.1:9", env=tmp_path)
    assert r.returncode == 2 and "cannot connect" in r.stderr and "Traceback" not in r.stderr


def _shape(line: str) -> str:
    """A printed line with its numbers and padding taken out: what stays the same from run to run."""
    return re.sub(r"\s+", " ", re.sub(r"\d+(\.\d+)?", "N", line)).strip()


DEMO_MARKER = "`make demo` ends like this"
"""The sentence before the block of what `make demo` prints, in README.md and the quick start."""
POLICY_LINE = re.compile(r"^  (default|dqoes|learned) +met ")
RATIO_LINE = re.compile(r"^  (DQoES|learned) / default Swarm")


def demo_blocks() -> dict[str, list[str]]:
    """Each page's lines of the fenced block after DEMO_MARKER, by page."""
    blocks = {}
    for page in (REPO / "README.md", REPO / "docs" / "guide" / "quickstart.md"):
        text = page.read_text()
        if DEMO_MARKER in text:
            block = text.split(DEMO_MARKER, 1)[1].split("```", 2)[1]
            blocks[page.name] = [x for x in block.split("\n", 1)[1].rstrip().splitlines() if x != "..."]
    return blocks


def per_node(shape: str) -> str:
    """A progress line's shape with the per-node counts taken out (one node here, four in the demo)."""
    return re.sub(r"\(N(/N)*\)", "(N)", shape)


def test_the_readme_shows_what_dqoes_up_prints(tmp_path):
    """The demo block has the lines `dqoes up --compare` prints, in the same shapes and order."""
    blocks = demo_blocks()
    assert blocks, f"no page has a block after {DEMO_MARKER!r}"
    r = dqoes("up", "--compare", "default,dqoes,learned", "--scenario", "paper-varied", "--time-scale", "60",
              "--duration", "900", "--no-metrics", "--run-dir", str(tmp_path / "run"), timeout=180, env=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    printed = r.stdout.strip().splitlines()
    progress = [_shape(x) for x in printed if x.startswith("t = ")]
    ending = printed[printed.index(next(x for x in printed if x.startswith("final"))):]
    final = [_shape(x) for x in ending]
    assert [POLICY_LINE.match(x)[1] for x in ending if POLICY_LINE.match(x)] == ["default", "dqoes", "learned"]
    assert final[-1].startswith("the dashboard stops"), ending
    for page, shown in blocks.items():
        assert shown[-1].startswith("  the dashboard stops"), page  # the demo ends saying how to keep it up
        for line in shown:
            s = _shape(line)
            if line.startswith("t = "):
                # one node here, four in the demo: compare with the per-node counts taken out
                assert per_node(s) in {per_node(p) for p in progress}, line
            elif POLICY_LINE.match(line):
                assert re.sub(r"\(.*\)", "", s) in {re.sub(r"\(.*\)", "", f) for f in final}, line
            elif RATIO_LINE.match(line):  # here default Swarm may have 0 in band: "no ratio"
                assert s.split(", in band")[0] in {f.split(", in band")[0] for f in final}, line
            else:
                assert s in final, (page, line)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_a_sigterm_while_the_stacks_start_stops_everything_they_started(tmp_path):
    # Stopped as soon as its first child (the NATS server) runs, before it has announced anything:
    # the signal must not kill it outright and leave that child behind.
    import signal

    e = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(tmp_path / "dqoes-state")}
    e.pop("DQOES_NATS_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "up", "--scenario", "paper-varied",
                             "--time-scale", "60", "--duration", "600", "--json", "--no-dashboard",
                             "--run-dir", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=e)
    try:
        deadline = time.monotonic() + 60
        while not (children := _children(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert last_json(out)["interrupted"] is True
    time.sleep(0.5)
    assert not [c for c in children if Path(f"/proc/{c}").exists()], children
