"""Recording a live cluster: the file reads back exactly as the live view showed it."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dashboard import data, views
from dashboard.live import History, TimeOrigin
from dashboard.record import Recorder
from dashboard.synthetic import node_states
from shared.core.measures import plateau

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_recording_reads_back_as_the_live_view_showed_it():
    pairs = list(node_states(2, 4, 40, seed=5))
    t0 = pairs[0][0].at
    clock = Clock(t0)
    buf = io.BytesIO()
    rec = Recorder(buf, url="nats://x:1", label="twin", started_at=t0, meta_after_s=2.0, wall=clock)
    shown = History("twin", origin=TimeOrigin(t0))
    for ns, d in pairs:
        clock.t = ns.at
        rec.on_decision(d)
        rec.on_state(ns)
        shown.add_decision(d)
        shown.add_state(ns)
    result = rec.finish()

    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert lines[0]["kind"] == "meta" and lines[-1]["kind"] == "result"
    assert lines[0]["nodes"] == {"worker-1": 4.6, "worker-2": 4.6}
    assert sorted(lines[0]["containers"]) == [f"c{i:02d}" for i in range(1, 9)]
    assert rec.lines == len(lines)

    back = data.run_from_rows(lines, "twin")
    live = shown.run()
    assert back.rounds.equals(live.rounds) and back.containers.equals(live.containers)
    assert (back.policy, back.scenario, back.containers_total) == ("dqoes", "live", 8)
    assert back.time_label == "time (s since the recording began)"

    # The result is the simulator's measure over the recording's own series.
    end = pairs[-1][0].at - t0
    window = min(120.0, end / 10)
    want = sum(
        plateau([(ns.at - t0, ns.satisfied) for ns, _ in pairs if ns.node == n], end - window, end)
        for n in ("worker-1", "worker-2")
    )
    assert result["satisfied_final"] == want
    assert views.outcome(back).satisfied == want
    want_met = sum(
        plateau([(ns.at - t0, ns.met) for ns, _ in pairs if ns.node == n], end - window, end)
        for n in ("worker-1", "worker-2")
    )
    assert result["met_final"] == want_met and views.outcome(back).met == want_met
    assert result["met_per_node"].keys() == result["satisfied_per_node"].keys()
    assert result["satisfied_at_end"] == sum(ns.satisfied for ns in shown.latest.values())


def test_the_meta_line_waits_for_the_nodes_to_show_up():
    pairs = list(node_states(2, 2, 3, seed=1))
    clock = Clock(pairs[0][0].at)
    buf = io.BytesIO()
    rec = Recorder(buf, started_at=clock.t, meta_after_s=5.0, wall=clock)
    rec.on_state(pairs[0][0])  # worker-1 only so far
    assert buf.getvalue() == b""
    rec.on_state(pairs[1][0])
    clock.t += 5.0
    rec.tick()
    first = json.loads(buf.getvalue().splitlines()[0])
    assert first["kind"] == "meta" and sorted(first["nodes"]) == ["worker-1", "worker-2"]


def _dqoes(*args: str, env_dir) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(env_dir)}
    env.pop("DQOES_NATS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )


@pytest.mark.integration
def test_dqoes_record_writes_a_timeline_the_recorded_view_opens(small_stack, tmp_path):
    out = tmp_path / "live" / "small.jsonl"
    r = _dqoes("record", "--nats", small_stack.url, "--out", str(out), "--duration", "3",
               "--json", env_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["kind"] == "result" and res["states"] > 5 and res["out"] == str(out)
    run = data.load_timeline(out)
    assert set(run.nodes) == {"node-a", "node-b"} and run.nodes["node-a"] == 2.0
    assert run.policy == "dqoes" and run.scenario == "live" and run.containers_total == 6
    assert len(run.rounds) == res["states"]
    assert views.outcome(run).satisfied == res["satisfied_final"]
    assert views.outcome(run).met == res["met_final"]
    r = _dqoes("record", "--nats", small_stack.url, "--out", str(out), "--duration", "2", env_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert re.search(r": met \d+, in band \d+ of 6 \(plateau of the last \d+ s\)", last), last
    assert "satisf" not in r.stdout


def test_dqoes_record_with_no_cluster_is_one_clear_line(tmp_path):
    r = _dqoes("record", "--nats", "nats://127.0.0.1:9", "--out", str(tmp_path / "x.jsonl"),
               "--duration", "1", env_dir=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cannot connect to NATS at nats://127.0.0.1:9" in r.stderr
    assert "is a deployment running?" in r.stderr
    r = _dqoes("record", "--out", str(tmp_path / "x.jsonl"), "--duration", "-1", env_dir=tmp_path)
    assert r.returncode == 2 and "--duration: must be more than 0 seconds" in r.stderr
