"""`dqoes submit` on a Docker worker: the job starts as a container of the workload image on that engine.

A manager and a worker of the Docker runtime (in this process, over a real
nats-server); the job is a real training container (`python -m
services.training` in dqoes-workload), labelled for the worker's node, that
publishes its losses and its completion and is removed when it exits. An
image the engine does not have is refused with `ok: false`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import orjson
import pytest

from services.manager.app import ManagerConfig
from services.manager.app import run as run_manager
from services.worker.app import WorkerConfig, build, serve
from shared import auth, subjects
from shared.bus import Bus
from shared.schema import JobDone, Progress, TrainingState


def test_submit_starts_a_training_container_on_the_chosen_engine(docker_client, workload_image, nats_url, nats_auth):
    import docker

    run_id = uuid.uuid4().hex[:6]
    node = f"dtrain-{run_id}"
    job = f"dtrain-{run_id}-mlp"

    async def go() -> None:
        started = asyncio.Event()
        mgr = asyncio.create_task(run_manager(ManagerConfig(nats_url=nats_url, bucket=f"dtrain_{run_id}"),
                                              started=started))
        await asyncio.wait_for(started.wait(), 10)
        # The session server has no inference identity for this node: the test user stands in for it.
        app = await build(WorkerConfig(node=node, nats_url=nats_url, runtime="docker", cores=1.0,
                                       require_node_label=True, initial_interval_s=1.0, state_interval_s=0.5,
                                       inference_creds=str(auth.creds_path(nats_auth, "test"))))
        serving = asyncio.create_task(serve(app, handle_signals=False))
        bus = await Bus.connect(nats_url, "test-docker-training")
        got: list = []
        states: list[TrainingState] = []
        await bus.subscribe(subjects.progress_of_node(node), lambda m, _: got.append(m), expect=(Progress, JobDone))
        await bus.subscribe(subjects.training(node), lambda m, _: states.append(m), expect=TrainingState)
        try:
            await asyncio.sleep(1.5)
            bad = orjson.loads(await bus.request(subjects.SUBMIT, orjson.dumps(
                {"model": "mlp", "image": f"no-such-image-{run_id}:1", "node": node}), timeout_s=30))
            assert bad["ok"] is False and "unknown image" in bad["error"], bad
            ok = orjson.loads(await bus.request(subjects.SUBMIT, orjson.dumps(
                {"model": "mlp", "name": job, "epochs": 3, "threads": 1, "image": workload_image, "node": node}),
                timeout_s=60))
            assert ok["ok"] and ok["node"] == node, ok
            labels = docker_client.containers.get(job).labels
            assert labels["dqoes.kind"] == "training" and labels["dqoes.node"] == node
            for _ in range(600):
                if any(isinstance(m, JobDone) for m in got):
                    break
                await asyncio.sleep(0.2)
            progress = [m for m in got if isinstance(m, Progress)]
            assert [p.epoch for p in progress] == [0, 1, 2]
            assert any(isinstance(m, JobDone) and m.ok for m in got)
            assert any(j.job == job for s in states for j in s.jobs)  # the worker governed it
            for _ in range(100):  # removed once it exited (auto-remove)
                try:
                    docker_client.containers.get(job)
                except docker.errors.NotFound:
                    break
                await asyncio.sleep(0.2)
            else:
                pytest.fail("the finished training container was not removed")
        finally:
            await bus.close()
            app.worker.stop()
            await asyncio.gather(serving, return_exceptions=True)
            mgr.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await mgr
            with contextlib.suppress(Exception):
                docker_client.containers.get(job).remove(force=True)

    asyncio.run(go())
