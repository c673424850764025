"""`dqoes status | target get|list|clear | control` against a live deployment: real processes, real NATS.

One stack (manager + one simulated worker, paper-varied with c10 left
without an objective) serves every test here; each command runs as a user
runs it (`python -m services.cli ...`). Raw public requests go through the
project's bus only where the test checks what any NATS client would get.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.bus import Bus
from shared.scenarios.builtin import load
from shared.schema import ControlMsg, ControlReply, NodeState, decode_as, encode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]


def dqoes(*args, timeout=60):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": "/nonexistent/dqoes-state"}
    env.pop("DQOES_NATS_URL", None)
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def scenario():
    sc = load("paper-varied")
    c10 = next(c for c in sc.containers if c.name == "c10")
    rest = tuple(c for c in sc.containers if c.name != "c10")
    return dataclasses.replace(sc, containers=(*rest, dataclasses.replace(c10, objective_s=None)))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(StackSpec(scenario(), policy="dqoes", time_scale=10.0, start_delay_s=0.5, state_interval_s=0.3),
              run_dir=tmp_path_factory.mktemp("operate"))
    with s:
        wait_for(s, lambda st: len(st["containers"]) == 10 and all(
            r["latency_s"] and (r["cls"] or not r["managed"]) for r in st["containers"]),
            "every container has run a batch and been classified")
        yield s
    for log in s.run_dir.glob("*.log"):
        assert "Traceback" not in log.read_text(), log


def status(stack, *args):
    r = dqoes("status", "--nats", stack.url, "--json", *args)
    assert r.returncode == 0, r.stderr
    return last_json(r.stdout)


def wait_for(stack, ok, what, timeout_s=40.0):
    deadline = time.monotonic() + timeout_s
    while True:
        r = dqoes("status", "--nats", stack.url, "--json")
        if r.returncode == 0:
            st = last_json(r.stdout)
            if ok(st):
                return st
        assert time.monotonic() < deadline, f"timed out waiting until {what}: {r.stdout[-3000:]} {r.stderr}"
        time.sleep(0.3)


def row(st, name):
    return next(r for r in st["containers"] if r["container"] == name)


def request(url, subject, body: bytes):
    async def go():
        bus = await Bus.connect(url, "test-client")
        try:
            return await bus.request(subject, body, timeout_s=3.0)
        finally:
            await bus.close()

    return asyncio.run(go())


def test_status_lists_every_container_as_json_and_as_a_table(stack):
    st = status(stack)
    assert st["type"] == "cluster_state" and set(st["nodes"]) == {"worker-1"}
    rows = {r["container"]: r for r in st["containers"]}
    assert set(rows) == {f"c{i:02d}" for i in range(1, 11)}
    c01 = rows["c01"]
    assert c01["node"] == "worker-1" and c01["model"] == "resnet50" and c01["objective_s"] == 75.0
    assert c01["managed"] is True and c01["cls"] in ("G", "S", "B")
    assert c01["met"] == (c01["cls"] in ("G", "S")) and c01["in_band"] == (c01["cls"] == "S")
    assert c01["last_batch_at"] is not None and c01["cpu_used_cores"] is not None
    assert c01["throttled_ratio"] is None  # the simulated runtime measures none
    assert rows["c10"]["managed"] is False and rows["c10"]["met"] is None and rows["c10"]["cls"] is None

    human = dqoes("status", "--nats", stack.url).stdout.splitlines()
    assert human[0].split()[:2] == ["node", "policy"]
    header = next(line for line in human if line.startswith("NODE"))
    for col in ("CONTAINER", "OBJECTIVE", "LATENCY", "MET", "IN BAND", "CLASS", "LIMIT", "CPU USED", "THROTTLED"):
        assert col in header
    line10 = next(line for line in human if " c10 " in f" {line} ")
    assert "unmanaged" in line10

    assert {r["node"] for r in status(stack, "--node", "worker-1")["containers"]} == {"worker-1"}
    r = dqoes("status", "--nats", stack.url, "--node", "ghost")
    assert r.returncode == 2 and "no node 'ghost'" in r.stderr and "Traceback" not in r.stderr


def test_status_watch_refreshes(stack):
    r = dqoes("status", "--nats", stack.url, "--watch", "--count", "2", "--every", "0.3", timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("CONTAINER") == 2 and r.stdout.count("-- ") == 2
    r = dqoes("status", "--nats", stack.url, "--watch", "--count", "2", "--every", "0.3", "--json", timeout=30)
    assert [len(json.loads(x)["containers"]) for x in r.stdout.strip().splitlines()] == [10, 10]


def test_target_get_list_and_clear(stack):
    r = dqoes("target", "set", "c10", "20", "--alpha", "0.2", "--nats", stack.url)
    assert r.returncode == 0, r.stderr
    got = last_json(dqoes("target", "get", "c10", "--nats", stack.url, "--json").stdout)
    assert got["ok"] and got["target"]["objective_s"] == 20.0 and got["target"]["alpha"] == 0.2
    assert got["target"]["node"] == "worker-1" and got["target"]["running"] is True
    listed = last_json(dqoes("target", "list", "--nats", stack.url, "--json").stdout)
    assert [t["container"] for t in listed["targets"]] == ["c10"]
    assert "c10" in dqoes("target", "list", "--nats", stack.url).stdout

    st = wait_for(stack, lambda s: row(s, "c10")["managed"] and row(s, "c10")["cpu_limit_cores"] is not None,
                  "c10 is managed with a limit")
    assert row(st, "c10")["objective_s"] == 20.0
    # Where each objective in force comes from: the store (c10) or the container's label (the others).
    assert row(st, "c10")["objective_source"] == "target" and row(st, "c01")["objective_source"] == "label"
    got = last_json(dqoes("target", "get", "c10", "--nats", stack.url, "--json").stdout)
    assert got["in_force"] == {"node": "worker-1", "objective_s": 20.0, "alpha": 0.2, "source": "target"}
    r = dqoes("target", "get", "c10", "--nats", stack.url)
    assert r.returncode == 0 and "in force on worker-1: 20 s, from the objective store" in r.stdout
    r = dqoes("target", "get", "c01", "--nats", stack.url)
    label = row(st, "c01")["objective_s"]
    assert r.returncode == 1 and "no objective stored for 'c01'" in r.stderr
    assert f"in force on worker-1: {label:g} s, from its dqoes.objective_s label" in r.stdout
    table = [x.split() for x in dqoes("status", "--nats", stack.url).stdout.splitlines()]
    assert next(x for x in table if x[1:2] == ["c01"])[5] == "label"
    assert next(x for x in table if x[1:2] == ["c10"])[5] == "target"

    r = dqoes("target", "clear", "c10", "--nats", stack.url)
    assert r.returncode == 0 and "cleared (was 20 s)" in r.stdout, r.stderr
    st = wait_for(stack, lambda s: not row(s, "c10")["managed"], "c10 is unmanaged again")
    r = dqoes("target", "get", "c10", "--nats", stack.url)
    assert r.returncode == 1 and "no objective stored for 'c10'" in r.stderr
    assert "in force on worker-1: no objective (unmanaged)" in r.stdout and row(st, "c10")["objective_source"] is None
    assert last_json(dqoes("target", "list", "--nats", stack.url, "--json").stdout)["targets"] == []
    st = wait_for(stack, lambda s: not row(s, "c10")["managed"], "c10 is unmanaged again")
    assert row(st, "c10")["objective_s"] is None and row(st, "c10")["cpu_limit_cores"] is None  # released

    r = dqoes("target", "clear", "c10", "--nats", stack.url, "--json")
    assert r.returncode == 1 and last_json(r.stdout) == {"ok": False, "error": "no objective stored for 'c10'"}


@pytest.mark.parametrize("subject, body, error", [
    (subjects.TARGETS_GET, b'{"container": "c01", "x": 1}', "unknown field 'x'"),
    (subjects.TARGETS_GET, b"{}", "missing field 'container'"),
    (subjects.TARGETS_GET, b"[1, 2]", "must be a JSON object"),
    (subjects.TARGETS_CLEAR, b'{"container": "bad name"}', "whitespace"),
    (subjects.TARGETS_LIST, b'{"all": true}', "unknown field 'all'"),
    (subjects.CLUSTER_CONTAINERS, b'{"nodes": "x"}', "unknown field 'nodes'"),
])
def test_bad_public_requests_get_a_reason_and_change_nothing(stack, subject, body, error):
    before = request(stack.url, subjects.TARGETS_LIST, b"")
    reply = orjson.loads(request(stack.url, subject, body))
    assert reply["ok"] is False and error in reply["error"]
    assert request(stack.url, subjects.TARGETS_LIST, b"") == before


def node_params(url):
    async def go():
        bus = await Bus.connect(url, "test-state")
        got: asyncio.Future[NodeState] = asyncio.get_running_loop().create_future()
        await bus.subscribe(subjects.state("worker-1"), lambda m, _: got.done() or got.set_result(m),
                            expect=NodeState)
        try:
            return (await asyncio.wait_for(got, 10)).params
        finally:
            await bus.close()

    return asyncio.run(go())


def test_control_reads_and_sets_parameters_acknowledged_by_the_worker(stack):
    r = dqoes("control", "--nats", stack.url_for("admin"), "--json")
    assert r.returncode == 0, r.stderr
    before = last_json(r.stdout)["nodes"]["worker-1"]
    assert before["ok"] and before["policy"] == "dqoes" and before["params"]["alpha"] == 0.1

    r = dqoes("control", "--nats", stack.url_for("admin"), "--node", "worker-1", "beta=0.25", "max_interval_s=200", "--json")
    assert r.returncode == 0, r.stderr
    after = last_json(r.stdout)["nodes"]["worker-1"]
    assert after["changed"] == ["beta", "max_interval_s"]
    assert after["params"]["beta"] == 0.25 and after["params"]["max_interval_s"] == 200
    params = node_params(stack.url)
    assert params["beta"] == 0.25 and params["max_interval_s"] == 200  # visible in the node state
    assert "beta=0.25" in dqoes("control", "--nats", stack.url_for("admin")).stdout

    for args, words in ((["nonsense=1"], "has no parameter nonsense"), (["beta=2"], "beta"),
                        (["beta"], "expected NAME=VALUE"), (["beta=x"], "expected a number"),
                        (["--node", "ghost", "beta=0.2"], "no node 'ghost'")):
        r = dqoes("control", "--nats", stack.url_for("admin"), *args)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert node_params(stack.url)["beta"] == 0.25  # nothing changed


def test_the_worker_itself_refuses_a_bad_control_request(stack):
    msg = ControlMsg(params={"no_such_parameter": 1.0, "beta": 0.3})
    reply = decode_as(request(stack.url_for("admin"), subjects.control("worker-1"), encode(msg, "test")), ControlReply)
    assert reply.ok is False and "no parameter no_such_parameter" in reply.error
    assert reply.params["beta"] == 0.25 and reply.changed == ()
    reply = decode_as(request(stack.url_for("admin"), subjects.control("worker-1"),
                              encode(ControlMsg(params={"beta": 0.3, "initial_interval_s": -1}), "test")),
                      ControlReply)
    assert reply.ok is False and reply.params["beta"] == 0.25


def node_state(url, ok=lambda ns: True, timeout_s=20.0):
    """The first state worker-1 publishes that passes `ok`."""
    async def go():
        bus = await Bus.connect(url, "test-state")
        got: asyncio.Future[NodeState] = asyncio.get_running_loop().create_future()
        await bus.subscribe(subjects.state("worker-1"), lambda m, _: got.done() or not ok(m) or got.set_result(m),
                            expect=NodeState)
        try:
            return await asyncio.wait_for(got, timeout_s)
        finally:
            await bus.close()

    return asyncio.run(go())


def control_request(stack, msg: ControlMsg) -> ControlReply:
    return decode_as(request(stack.url_for("admin"), subjects.control("worker-1"), encode(msg, "test")), ControlReply)


def test_control_switches_the_policy_at_runtime_acknowledged_by_the_worker(stack):
    # Last in this module: it leaves the node on DQoES with its default parameters but one.
    r = dqoes("control", "--nats", stack.url_for("admin"), "policy=learned", "--json")
    assert r.returncode == 0, r.stderr
    reply = last_json(r.stdout)["nodes"]["worker-1"]
    assert reply["ok"] and reply["policy"] == "learned" and reply["changed"] == ["policy"]
    assert "half_life_s" in reply["params"] and "beta" not in reply["params"]  # learned's own parameters
    before = node_state(stack.url, lambda ns: ns.policy == "learned")
    after = node_state(stack.url, lambda ns: ns.round > before.round)  # rounds go on under the new policy
    assert after.policy == "learned" and after.params == reply["params"]
    assert "policy now learned (was dqoes), set by control" in (stack.run_dir / "worker-worker-1.log").read_text()

    # An unknown policy: one line from the CLI, nothing sent; the worker refuses one sent anyway.
    r = dqoes("control", "--nats", stack.url_for("admin"), "policy=nonsense")
    assert r.returncode == 2 and "unknown policy 'nonsense'" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    refused = control_request(stack, ControlMsg(policy="nonsense"))
    assert not refused.ok and "unknown policy 'nonsense'" in refused.error
    assert refused.policy == "learned" and refused.changed == ()
    # A switch with a parameter the new policy lacks changes nothing either, the policy included.
    refused = control_request(stack, ControlMsg(policy="dqoes", params={"half_life_s": 5.0}))
    assert not refused.ok and "half_life_s" in refused.error and refused.policy == "learned"
    assert node_state(stack.url).policy == "learned"

    # Back to the paper's algorithm with a parameter of its own, in one message.
    r = dqoes("control", "--nats", stack.url_for("admin"), "policy=dqoes", "beta=0.3", "--json")
    assert r.returncode == 0, r.stderr
    reply = last_json(r.stdout)["nodes"]["worker-1"]
    assert reply["ok"] and reply["policy"] == "dqoes" and reply["changed"] == ["beta", "policy"]
    assert reply["params"]["beta"] == 0.3 and "half_life_s" not in reply["params"]
    assert node_state(stack.url, lambda ns: ns.policy == "dqoes").params["beta"] == 0.3
    assert "dqoes" in dqoes("control", "--nats", stack.url_for("admin")).stdout.split()
