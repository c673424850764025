"""A governed container's process in the multi-host test: pure-Python CPU work, each "batch" published.

Why: the torch inference image is too large to load into three engines in a
CI run, and a limit change is what the test looks at, not the model. The
control-plane image has the project's package, so this publishes through
the same `LatencyPublisher` (dqoes.latency.<node>.<container>) as
services.inference, as the node's inference identity, under the container's
hostname (Docker's short id, which the worker maps to the container) or
$DQOES_CONTAINER_NAME where set (a task on the host's network, whose hostname
is the host's).
A pure-Python loop's seconds a batch follow its CPU limit; a pause after each
batch keeps three engines' loads from saturating a small machine.
Delivered to the tasks as a Swarm config (tests/multihost/load.yml).
"""

import asyncio
import os
import signal
import socket
import time

from shared import auth
from shared.bus import Bus, BusError
from shared.publisher import LatencyPublisher

WORK = int(os.environ.get("DQOES_LOAD_WORK", "200000"))
"""Loop iterations a batch: tens of milliseconds unlimited."""
PAUSE_S = float(os.environ.get("DQOES_LOAD_PAUSE_S", "0.25"))
"""Idle time after each batch, so that three engines' loads leave a small machine's cores usable."""


def batch() -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    x = 0
    for i in range(WORK):
        x += i * i % 7
    return time.perf_counter() - t0, time.process_time() - c0


async def main() -> None:
    url = auth.resolve(os.environ["DQOES_NATS_URL"], os.environ.get("DQOES_NATS_CREDS"))
    node = os.environ["DQOES_NODE"]
    name = os.environ.get("DQOES_CONTAINER_NAME") or socket.gethostname()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    while True:
        try:
            bus = await Bus.connect(url, f"load-{name}", connect_timeout_s=3.0)
            break
        except BusError:
            await asyncio.sleep(1.0)
    pub = LatencyPublisher(bus, node)
    n = 0
    while not stop.is_set():
        latency_s, cpu_s = batch()
        n += 1
        await pub.publish(pub.event(name, latency_s, 1, n, cpu_s=cpu_s, model="busy"))
        await asyncio.sleep(PAUSE_S)


asyncio.run(main())
