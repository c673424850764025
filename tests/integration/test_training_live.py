"""FlowCon live: a manager and two workers over real NATS place and run real training processes in cgroups.

`dqoes.submit` -> the manager's placement -> `dqoes.launch.<node>` -> the
worker starts `python -m services.training` in a cgroup -> its losses on
`dqoes.progress.<node>.<job>` -> FlowCon's rounds and `dqoes.training.<node>`.
Bad input (a NaN value, a value from an unknown job, bad submit requests)
gets a refusal or one log line and the worker goes on. Needs root, a cgroup
cpu controller and torch; skipped without them unless DQOES_REQUIRE_CGROUP=1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgpack
import orjson
import pytest

from services.manager.app import ManagerConfig
from services.manager.app import run as run_manager
from services.worker.app import WorkerConfig, build, serve
from shared import auth, schema, subjects
from shared.bus import Bus
from shared.schema import JobDone, Progress, TrainingState

pytestmark = pytest.mark.integration


async def _submit(bus: Bus, body: dict | bytes) -> dict:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return orjson.loads(await bus.request(subjects.SUBMIT, data, timeout_s=30.0))


def test_submit_places_runs_and_survives_bad_input(nats_url, nats_auth, cgroup_root, caplog):
    caplog.set_level(logging.INFO)

    async def go() -> None:
        stop_mgr = asyncio.Event()
        started = asyncio.Event()
        mgr = asyncio.create_task(run_manager(ManagerConfig(nats_url=nats_url, bucket="training_test",
                                                            placement="flowcon"), started=started))
        await asyncio.wait_for(started.wait(), 10)
        # The session server has no inference identity for w1 and w2: the test user stands in for it.
        jobs_creds = str(auth.creds_path(nats_auth, "test"))
        apps = [await build(WorkerConfig(node=n, nats_url=nats_url, runtime="cgroup", cores=1.0,
                                         initial_interval_s=1.0, state_interval_s=0.5, training_stale_s=3.0,
                                         inference_creds=jobs_creds))
                for n in ("w1", "w2")]
        serving = [asyncio.create_task(serve(a, handle_signals=False)) for a in apps]
        bus = await Bus.connect(nats_url, "test-client")
        states: list[TrainingState] = []
        done: list[JobDone] = []
        await bus.subscribe(subjects.TRAINING_ALL, lambda m, _: states.append(m), expect=TrainingState)
        await bus.subscribe(subjects.PROGRESS_ALL, lambda m, _: done.append(m) if isinstance(m, JobDone) else None,
                            expect=(Progress, JobDone))
        try:
            await asyncio.sleep(1.5)  # both workers' node states reach the manager
            # refusals: each names the problem, nothing starts
            for body, why in [({"model": "resnet"}, "unknown model"), ({"model": "mlp", "node": "ghost"}, "not there"),
                              ({"model": "mlp", "image": "nope:1"}, "unknown image"), (b"{not json", "neither JSON"),
                              ({"model": "mlp", "epochs": 0}, "epochs")]:
                r = await _submit(bus, body)
                assert r["ok"] is False and why in r["error"], (body, r)
            r1 = await _submit(bus, {"model": "mlp", "epochs": 25, "name": "job-a", "threads": 1})
            assert r1["ok"] and r1["node"] in ("w1", "w2") and r1["job"] == "job-a" and r1["policy"] == "flowcon"
            # the second job goes to the other, empty worker (all-CL rule: an idle worker, fewest jobs)
            r2 = await _submit(bus, {"model": "lstm", "epochs": 15, "name": "job-b", "threads": 1})
            assert r2["ok"] and r2["node"] != r1["node"], (r1, r2)
            dup = await _submit(bus, {"model": "mlp", "name": "job-a"})
            assert dup["ok"] is False and "already" in dup["error"]
            node = r1["node"]
            # bad values on the job's own subject: a NaN (raw bytes), a value from a job that is not there
            good = msgpack.unpackb(schema.encode(Progress(job="job-a", node=node, value=1.0, epoch=0), "t"), raw=False)
            good["value"] = float("nan")
            await bus.publish_raw(subjects.progress(node, "job-a"), msgpack.packb(good))
            await bus.publish(subjects.progress(node, "ghost"), Progress(job="ghost", node=node, value=1.0, epoch=0))
            deadline = asyncio.get_running_loop().time() + 60
            while asyncio.get_running_loop().time() < deadline:
                seen = [s for s in states if s.node == node and any(j.job == "job-a" and j.growth is not None
                                                                    for j in s.jobs)]
                if seen:
                    break
                await asyncio.sleep(0.2)
            assert seen, "FlowCon never measured the job's growth efficiency"
            job = next(j for j in seen[-1].jobs if j.job == "job-a")
            assert job.stage in ("NL", "WL", "CL") and job.value is not None and job.limit is not None
            # Both jobs run to completion (a loaded machine may take minutes: this waits, never races).
            deadline = asyncio.get_running_loop().time() + 180
            while asyncio.get_running_loop().time() < deadline and len({d.job for d in done}) < 2:
                await asyncio.sleep(0.2)
            assert {d.job for d in done} == {"job-a", "job-b"} and all(d.ok for d in done)
            for a in apps:  # both workers are still serving
                assert not serving[apps.index(a)].done()
        finally:
            await bus.close()
            for a in apps:
                a.worker.stop()
            await asyncio.gather(*serving, return_exceptions=True)
            mgr.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await mgr
            stop_mgr.set()

    asyncio.run(go())
    text = caplog.text
    assert "ghost, which is not a training job on this node" in text
    assert "undecodable message(s) on dqoes.progress." in text and "progress.value" in text
