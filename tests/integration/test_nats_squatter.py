"""A stranger that takes the supervised nats-server's port while it is down receives nothing.

The attack (issue 62, item 3): kill the supervised nats-server and bind its port from another local
process at once; before, the restarted services sent their CONNECT (with their passwords) to it and
the real server stayed down while the port was taken. Played for real here: a stack with its own
authenticated server, a squatter process that takes the server's port the moment it dies (and tries
the port the services were given), answers like a NATS server (an INFO line, so a client would
CONNECT) and records every byte it receives. The services must connect to nothing but their own
server, which must come back (on another private port, behind the same URL).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.bus import Bus
from shared.natsfront import owned_listener
from shared.scenarios.spec import parse_scenario
from shared.schema import NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCENARIO = {
    "name": "squat", "duration_s": 100000, "noise_sigma": 0.0,
    "nodes": [{"name": "n1", "cores": 2}],
    "models": [{"name": "m", "work_cpu_s": 2.0, "threads": 1}],
    "containers": [{"name": "c1", "model": "m", "objective_s": 100.0},
                   {"name": "c2", "model": "m", "objective_s": 50.0}],
}

SQUATTER = r"""
import json, socket, sys, threading
private, public, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
report = {"public_bind": None, "connections": 0, "received": ""}
p = socket.socket()
p.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as an attacker would: past TIME_WAIT
try:
    p.bind(("127.0.0.1", public)); report["public_bind"] = "bound"
except OSError as e:
    report["public_bind"] = e.strerror
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", private)); s.listen(16)
print("ready", flush=True)
lock = threading.Lock()
def serve(c):
    c.sendall(b'INFO {"server_id":"squatter","version":"2.10.0","proto":1,"auth_required":true,'
              b'"max_payload":1048576,"host":"127.0.0.1","port":%d}\r\n' % private)
    c.settimeout(5)
    try:
        while data := c.recv(65536):
            with lock:
                report["received"] += data.decode(errors="replace")
                json.dump(report, open(out, "w"))
    except OSError:
        pass
def watch():
    sys.stdin.read()
    with lock:
        json.dump(report, open(out, "w"))
    import os; os._exit(0)
threading.Thread(target=watch, daemon=True).start()
json.dump(report, open(out, "w"))
while True:
    c, _ = s.accept()
    with lock:
        report["connections"] += 1
        json.dump(report, open(out, "w"))
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


async def a_state(url: str, timeout_s: float) -> NodeState:
    bus = await Bus.connect(url, "squat-test", connect_timeout_s=timeout_s)
    got: asyncio.Queue[NodeState] = asyncio.Queue()
    try:
        await bus.subscribe(subjects.STATE_ALL, lambda m, _: got.put_nowait(m), expect=NodeState)
        return await asyncio.wait_for(got.get(), timeout_s)
    finally:
        await bus.close()


def wait_for_lines(stack: Stack, text: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(text in stack.log_path(p).read_text() for p in ("manager", "worker-n1")):
        assert time.monotonic() < deadline, stack.logs()[-3000:]
        time.sleep(0.2)


def test_no_service_connects_to_a_process_that_took_the_dead_servers_port(tmp_path):
    stack = Stack(StackSpec(parse_scenario(json.loads(json.dumps(SCENARIO))), time_scale=5.0, start_delay_s=0.3,
                            state_interval_s=0.3), run_dir=tmp_path / "run")
    squatter: subprocess.Popen[str] | None = None
    try:
        stack.start()
        assert stack.nats is not None and stack.front is not None
        assert asyncio.run(a_state(stack.client_url, 20.0)).node == "n1"
        wait_for_lines(stack, "connected to NATS")  # every service, before its server dies
        private, public = stack.nats.port, stack.front.port
        assert owned_listener(private, stack.nats.pid or 0) is not None
        stack.nats.kill()
        squatter = subprocess.Popen([sys.executable, "-c", SQUATTER, str(private), str(public),
                                     str(tmp_path / "squatter.json")], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "ready"
        time.sleep(3.0)  # the services retry every 0.5 s meanwhile
        lines = stack.supervise()
        assert any("nats-server exited" in line and "restarted on " + stack.plain_url in line
                   and f"another process listens on its old private port {private}" in line for line in lines), lines
        assert stack.nats.port != private  # the squatter holds the old one
        # The real server is back behind the same URL, and every service with it.
        assert asyncio.run(a_state(stack.client_url, 20.0)).node == "n1"
        wait_for_lines(stack, "reconnected to NATS")
        time.sleep(1.0)
    finally:
        if squatter is not None:
            squatter.communicate("", timeout=10)
        stack.stop()
    report = json.loads((tmp_path / "squatter.json").read_text())
    assert report["public_bind"] == "Address already in use", report  # the front holds it
    assert report["connections"] == 0 and "CONNECT" not in report["received"], report
    assert not stack.dead()
