"""A non-Python client (nats.js) does the objective lifecycle through the public subjects only.

`public_client.mjs` knows nothing of this project but docs/reference/api.md: it lists
the containers (`dqoes.cluster.containers`), sets an objective for one it
found (`dqoes.targets`), reads it back (`.get`, `.list`), clears it
(`.clear`) and checks it is gone; then sets a service-level percentile objective (a label
selector), lists it, sees a bad percentile refused, and clears it. The deployment is a real one (`Stack`:
private nats-server, manager, a simulated worker). Needs node and the
`nats` npm package in tests/js/node_modules (`npm ci --prefix tests/js`);
without them the test is skipped with the reason, unless
DQOES_REQUIRE_NODE=1 (set by .ci/run), which makes it a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.scenarios.builtin import load

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
HERE = Path(__file__).resolve().parent


def need(reason: str) -> None:
    if os.environ.get("DQOES_REQUIRE_NODE") == "1":
        pytest.fail(f"{reason} (and DQOES_REQUIRE_NODE=1)")
    pytest.skip(f"{reason}; set DQOES_REQUIRE_NODE=1 to make this a failure")


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        need("no node on PATH (apt-get install -y nodejs npm)")
    if not (HERE / "node_modules" / "nats").is_dir():
        need("the nats npm package is not installed (npm ci --prefix tests/js)")
    return exe


def test_a_nats_js_client_lists_sets_reads_and_clears_an_objective(node, tmp_path):
    with Stack(StackSpec(load("paper-varied"), time_scale=10.0, start_delay_s=0.5, state_interval_s=0.3),
               run_dir=tmp_path / "run") as s:
        r = None
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:  # until the manager has heard the worker
            r = subprocess.run([node, str(HERE / "public_client.mjs"), s.url, "42"], capture_output=True,
                               text=True, timeout=30, cwd=HERE)
            if r.returncode == 0:
                break
            time.sleep(0.5)
        assert r is not None and r.returncode == 0, r.stderr
        seen = json.loads(r.stdout.strip().splitlines()[-1])
        assert seen["containers"] == 10
        name = seen["picked"]["container"]
        assert seen["picked"]["node"] == "worker-1" and seen["picked"]["model"] == "resnet50"
        assert seen["set"] == {"objective_s": 42, "node": "worker-1", "revision": seen["got"]["revision"]}
        assert seen["got"]["container"] == name and seen["got"]["running"] is True
        assert seen["after_clear"] == {"ok": False, "error": f"no objective stored for {name!r}"}
        service = seen["service"]
        assert service["listed"]["service"] == "dqoes.model=resnet50"
        assert (service["listed"]["percentile"], service["listed"]["window_s"]) == (95, 30)
        assert service["refused"].startswith("percentile: must be a percentile in (0, 100)")
        assert service["cleared"] == 42
        assert service["after_clear"] == {"ok": False,
                                          "error": "no objective stored for service 'dqoes.model=resnet50'"}

        # What the client did is what the store holds: nothing (checked from Python).
        import asyncio

        from shared.bus import Bus

        async def stored() -> dict:
            bus = await Bus.connect(s.url, "check")
            try:
                return orjson.loads(await bus.request(subjects.TARGETS_LIST, b"", timeout_s=3))
            finally:
                await bus.close()

        assert asyncio.run(stored()) == {"ok": True, "targets": []}
