"""The `nats` latency source's public form: a JSON object published with plain nats-py, as in
docs/reference/api.md, reaches the worker like a msgpack LatencyEvent; a bad one is refused.

Real nats-server, a real worker on the cgroup runtime governing an idle process. Needs root and a
cgroup cpu controller; skipped without them unless DQOES_REQUIRE_CGROUP=1.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import nats
import pytest

from services.worker.app import WorkerConfig, build, serve
from shared.runtime import cgroupfs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_a_json_latency_event_is_taken_like_msgpack(nats_url, nats_server, nats_auth) -> None:
    if os.geteuid() != 0:
        if os.environ.get("DQOES_REQUIRE_CGROUP") == "1":
            pytest.fail("not root (and DQOES_REQUIRE_CGROUP=1)")
        pytest.skip("not root: cannot create cgroups")
    cgroupfs.detect_layout(cgroupfs.DEFAULT_ROOT)

    async def go() -> None:
        app = await build(WorkerConfig(node="n1", nats_url=nats_url, runtime="cgroup", cores=1.0, policy="dqoes",
                                       initial_interval_s=1.0, training_policy="none"))
        serving = asyncio.create_task(serve(app, handle_signals=False))
        worker = app.worker
        # as the node's inference identity, the way docs/reference/api.md shows (plain nats-py)
        creds = json.loads((nats_auth / "inference-n1.creds").read_text())
        nc = await nats.connect(nats_server.plain_url, nkeys_seed_str=creds["seed"],
                                inbox_prefix=creds["inbox_prefix"])
        try:
            await app.runtime.spawn("json-1", [sys.executable, "-c", "import time; time.sleep(60)"],  # type: ignore[attr-defined]
                                    objective_s=1.0)
            for _ in range(50):
                await asyncio.sleep(0.05)
                if "json-1" in worker.ctrl.containers:
                    break
            # the documented client: one JSON object per finished batch on dqoes.latency.<node>.<container>
            event = {"container": "json-1", "node": "n1", "latency_s": 0.8, "images": 10, "batch": 1,
                     "finished_at": time.time()}
            await nc.publish("dqoes.latency.n1.json-1", json.dumps(event).encode())
            await nc.publish("dqoes.latency.n1.json-1", b'{"container": "json-1", "container": "x"}')
            await nc.publish("dqoes.latency.n1.json-1", json.dumps({**event, "latency_s": -1}).encode())
            await nc.flush()
            for _ in range(50):
                await asyncio.sleep(0.05)
                if worker.latencies:
                    break
            assert worker.latencies == 1
            t = worker.ctrl.containers["json-1"]
            assert 0.8 in (t.new_latency_s, t.last_latency_s)
            assert app.bus.dropped == 2  # the key named twice and the negative latency
        finally:
            await nc.close()
            worker.stop()
            await asyncio.wait_for(serving, 30)

    asyncio.run(go())
