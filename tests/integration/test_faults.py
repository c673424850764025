"""Crashes under supervision: kill -9 of nats-server, the manager and a worker, real processes.

`dqoes up` calls `Stack.supervise()` four times a second; here a thread does
the same for a `Stack` with its own authenticated nats-server, and one test
runs `dqoes up` itself. Each process killed with SIGKILL comes back, no
stored objective is lost, and a restarted worker controls with the stored
objective from its first round on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.bus import Bus, BusError
from shared.ports import free_port
from shared.public import parse_target_reply
from shared.scenarios.spec import parse_scenario
from shared.schema import ControlMsg, ControlReply, NodeState, decode_as

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]

SCENARIO = {
    "name": "faults", "duration_s": 100000, "noise_sigma": 0.0,
    "nodes": [{"name": "n1", "cores": 2}],
    "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
    "containers": [{"name": "c1", "model": "m", "objective_s": 100.0},
                   {"name": "c2", "model": "m", "objective_s": 50.0}],
}


class Supervised:
    """A Stack and a thread calling its supervise() like `dqoes up` does."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self.lines += self.stack.supervise()

    def __enter__(self) -> Supervised:
        self.stack.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.stack.stop()


def wait_for(pred, timeout_s: float = 30.0, every_s: float = 0.1):
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        value = pred()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError("condition not met in time")


def states(stack: Stack, until, timeout_s: float = 30.0) -> NodeState:
    """Node states of n1 until `until(state)` holds; that state."""
    async def go() -> NodeState:
        t_end = time.monotonic() + timeout_s
        while time.monotonic() < t_end:
            try:
                bus = await Bus.connect(stack.url, "test-faults", connect_timeout_s=2.0)
            except BusError:
                await asyncio.sleep(0.3)
                continue
            got: asyncio.Queue[NodeState] = asyncio.Queue()
            try:
                await bus.subscribe(subjects.state("n1"), lambda m, _, q=got: q.put_nowait(m), expect=NodeState)
                while time.monotonic() < t_end:
                    try:
                        ns = await asyncio.wait_for(got.get(), 1.0)
                    except TimeoutError:
                        continue
                    if until(ns):
                        return ns
            finally:
                await bus.close()
        raise AssertionError("no node state as wanted in time")
    return asyncio.run(go())


def set_target(stack: Stack, container: str, objective_s: float) -> dict:
    async def go() -> dict:
        bus = await Bus.connect(stack.url, "test-target")
        try:
            body = orjson.dumps({"container": container, "objective": objective_s})
            return parse_target_reply(await bus.request(subjects.TARGETS, body, timeout_s=3.0))
        finally:
            await bus.close()
    return wait_for(lambda: _try(go), 30)


def _try(go) -> dict | None:
    try:
        reply = asyncio.run(go())
    except BusError:
        return None
    return reply if reply.get("ok") else None


def control(stack: Stack, msg: ControlMsg) -> ControlReply:
    """`dqoes control` as the admin sends it to n1's worker."""
    async def go() -> ControlReply:
        bus = await Bus.connect(stack.url_for("admin"), "admin")
        try:
            return decode_as(await bus.request(subjects.control("n1"), msg, timeout_s=3.0), ControlReply)
        finally:
            await bus.close()
    return asyncio.run(go())


def objective_of(ns: NodeState, name: str) -> float | None:
    return next((c.objective_s for c in ns.containers if c.container == name), None)


@pytest.fixture
def supervised(tmp_path):
    stack = Stack(StackSpec(parse_scenario(json.loads(json.dumps(SCENARIO))), time_scale=5.0,
                            start_delay_s=0.3, state_interval_s=0.2), run_dir=tmp_path / "run")
    with Supervised(stack) as s:
        states(stack, lambda ns: len(ns.containers) == 2)
        assert set_target(stack, "c1", 30.0)["ok"]
        states(stack, lambda ns: objective_of(ns, "c1") == 30.0)
        yield s
    assert "Traceback" not in stack.logs()


def test_a_killed_worker_comes_back_with_the_stored_objective_in_its_first_round(supervised):
    stack = supervised.stack
    # An operator's parameter change outlives the worker too (kept in the stack's state directory).
    assert control(stack, ControlMsg(alpha=0.25)).ok
    assert (stack.run_dir / "params-n1.json").is_file()
    stack.procs["worker-n1"].send_signal(signal.SIGKILL)
    wait_for(lambda: any("worker-n1 restarted" in line for line in supervised.lines))
    assert any("worker-n1 exited with status -9" in line for line in supervised.lines)
    # Its state from before any round (round 0) onwards: the first one with a round
    # already carries the stored objective, not the scenario's 100 s.
    first = states(stack, lambda ns: ns.round >= 1)
    assert objective_of(first, "c1") == 30.0
    assert first.params["alpha"] == 0.25


def test_a_killed_manager_comes_back_and_keeps_the_objectives(supervised):
    stack = supervised.stack
    stack.procs["manager"].send_signal(signal.SIGKILL)
    wait_for(lambda: any("manager restarted" in line for line in supervised.lines))
    assert set_target(stack, "c2", 20.0)["ok"]  # it answers again
    ns = states(stack, lambda ns: objective_of(ns, "c2") == 20.0)
    assert objective_of(ns, "c1") == 30.0


def test_a_killed_nats_server_is_restarted_on_the_same_port_and_store(supervised):
    stack = supervised.stack
    url = stack.plain_url
    os.kill(stack.nats.pid, signal.SIGKILL)
    wait_for(lambda: any("nats-server exited" in line and "restarted" in line for line in supervised.lines))
    assert stack.plain_url == url
    assert set_target(stack, "c2", 25.0)["ok"]  # manager and bucket reachable again
    ns = states(stack, lambda ns: objective_of(ns, "c2") == 25.0)
    assert objective_of(ns, "c1") == 30.0  # nothing lost
    assert not [n for n, p in stack.procs.items() if p.poll() is not None]


def test_backoff_grows_for_a_service_that_keeps_dying(tmp_path):
    stack = Stack(StackSpec(parse_scenario(json.loads(json.dumps(SCENARIO)))), run_dir=tmp_path / "run")
    stack.start_nats()
    try:
        stack._spawn("flaky", ["-c", "import sys; sys.exit(3)"], "client")
        now = time.monotonic()
        waits = []
        for _ in range(4):
            stack.procs["flaky"].wait(10)
            lines = stack.supervise(now)
            assert len(lines) == 1 and "flaky exited with status 3" in lines[0]
            waits.append(float(lines[0].split("restarting in ")[1].split(" s")[0]))
            assert stack.supervise(now + waits[-1] - 0.01) == []
            (line,) = stack.supervise(now + waits[-1])
            assert "flaky restarted" in line
            now += waits[-1]
        assert waits == [1.0, 2.0, 4.0, 8.0]
        assert (tmp_path / "run" / "supervisor.log").read_text().count("restarted") == 4
    finally:
        stack.stop()


# Listens on the port after --metrics-port, or exits with status 2 as a service does when it cannot.
LISTENER = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[sys.argv.index("--metrics-port") + 1])))
except OSError:
    sys.exit(2)
s.listen()
time.sleep(60)
"""


def test_a_service_whose_metrics_port_is_taken_comes_back_on_another(tmp_path):
    # Something else took the port after it was handed out (29 Nov: another worker): the service cannot
    # listen and exits; restarted on the same port it would exit again at every restart.
    stack = Stack(StackSpec(parse_scenario(json.loads(json.dumps(SCENARIO))), metrics=True), run_dir=tmp_path / "run")
    port = free_port()
    stack.metrics_urls["flaky"] = f"http://127.0.0.1:{port}/metrics"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        try:
            stack._spawn("flaky", ["-c", LISTENER, "--metrics-port", str(port)], "client")
            assert stack.procs["flaky"].wait(10) == 2
            now = time.monotonic()
            stack.supervise(now)
            (line,) = stack.supervise(now + 1.0)
            assert "flaky restarted" in line and f"its metrics port {port} was taken" in line
            new = int(line.rsplit(" ", 1)[1])
            assert new != port and stack.metrics_urls["flaky"] == f"http://127.0.0.1:{new}/metrics"
            time.sleep(1.0)
            assert stack.procs["flaky"].poll() is None  # listening on the new port
            assert stack.supervise(now + 2.0) == []
        finally:
            stack.stop()


def test_big_logs_are_rotated(tmp_path):
    stack = Stack(StackSpec(parse_scenario(json.loads(json.dumps(SCENARIO)))), run_dir=tmp_path / "run")
    log = stack.log_path("manager")
    log.write_bytes(b"x" * 2000)
    assert stack.rotate_logs(max_bytes=1000) == [log]
    assert log.stat().st_size == 0 and log.with_name("manager.log.1").stat().st_size == 2000


def test_dqoes_up_restarts_a_killed_manager(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(tmp_path / "state")}
    env.pop("DQOES_NATS_URL", None)
    up = subprocess.Popen([sys.executable, "-m", "services.cli", "up", "--scenario", "paper-varied",
                           "--time-scale", "5", "--forever", "--no-dashboard", "--no-metrics",
                           "--run-dir", str(tmp_path / "data")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    try:
        def status_ok() -> bool:
            r = subprocess.run([sys.executable, "-m", "services.cli", "status", "--json"], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=30)
            return r.returncode == 0

        wait_for(status_ok, 60, 0.5)
        manager = _pid_of("services.manager", str(tmp_path / "data"))
        os.kill(manager, signal.SIGKILL)
        wait_for(lambda: _pid_of("services.manager", str(tmp_path / "data")) not in (None, manager), 30, 0.3)
        wait_for(status_ok, 30, 0.5)
        assert up.poll() is None  # the deployment stayed up
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert "supervisor: learned: manager exited with status -9" in out  # the stack of the default policy
    assert "manager restarted" in out
    assert f"data directory: {tmp_path / 'data'}" in out


def _pid_of(module: str, marker: str) -> int | None:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [c.decode(errors="replace") for c in cmd]
        if module in words and any(marker in w for w in words):
            return int(d.name)
    return None


TWO = {
    "name": "two", "duration_s": 10000, "noise_sigma": 0.0,
    "nodes": [{"name": "n1", "cores": 2}],
    "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
    "containers": [{"name": "lax", "model": "m", "objective_s": 100.0},
                   {"name": "strict", "model": "m", "objective_s": 2.0}],
}


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["keep", "restore", None])
async def test_on_stop_keeps_or_restores_the_limits(nats_url, tmp_path, mode, caplog):
    """None: the default, which gives the containers back what they had (a user who removes DQoES
    finds them as before); every limit change is one INFO line."""
    import logging

    from services.worker.app import WorkerConfig, build, serve
    from shared.schema import LatencyEvent

    caplog.set_level(logging.INFO, logger="services.worker.logic")
    f = tmp_path / "two.json"
    f.write_text(json.dumps(TWO))
    app = await build(WorkerConfig(node="n1", nats_url=nats_url, scenario=str(f), time_scale=5.0,
                                   state_interval_s=0.2, initial_interval_s=10.0, state_dir=str(tmp_path),
                                   **({} if mode is None else {"on_stop": mode})))
    task = asyncio.create_task(serve(app, handle_signals=False))
    bus = await Bus.connect(nats_url, "test")
    sim = app.runtime._sim
    try:
        for _ in range(200):
            if "lax" in app.worker.ctrl.containers:
                break
            await asyncio.sleep(0.05)
        originals = json.loads((tmp_path / "limits-n1.json").read_text())
        assert originals == {"lax": None, "strict": None}  # kept on disk: a crash does not lose them
        ev = LatencyEvent(container="lax", node="n1", latency_s=1.0, images=100, batch=99)
        for _ in range(200):
            await bus.publish(subjects.latency("n1", "lax"), ev)
            if sim.containers["lax"].limit is not None:
                break
            await asyncio.sleep(0.05)
        lax = sim.containers["lax"]  # the simulated container itself (closing the runtime forgets it)
        limited = lax.limit
        assert limited is not None and limited < 1.0
    finally:
        app.worker.stop()
        await task
        await bus.close()
    assert lax.limit == (limited if mode == "keep" else None)
    # keep: the limits in force are still this node's, so the true originals stay for a later restore
    assert (tmp_path / "limits-n1.json").exists() == (mode == "keep")
    changes = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and r.getMessage().startswith("limit of lax: ")]
    assert f"limit of lax: none -> {limited * 2:.2f} cores" in changes, changes
