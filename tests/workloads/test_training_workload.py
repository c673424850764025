"""The real training workloads: every task learns, and a job publishes its losses and completion on NATS."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from services.training.tasks import TASKS, TaskError, build  # noqa: E402
from shared import subjects  # noqa: E402
from shared.bus import Bus  # noqa: E402
from shared.schema import JobDone, Progress  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", TASKS)
def test_every_task_lowers_its_loss(name):
    torch.set_num_threads(1)
    task = build(name, seed=3, batch=64, steps_per_epoch=15)
    first = [task.step() for _ in range(task.steps_per_epoch)]
    for _ in range(3):
        later = [task.step() for _ in range(task.steps_per_epoch)]
    assert all(math.isfinite(x) and x >= 0 for x in first + later)
    assert sum(later) / len(later) < sum(first) / len(first)


def test_unknown_task_is_refused():
    with pytest.raises(TaskError, match="choose from"):
        build("resnet")


def test_a_job_publishes_each_epoch_and_its_completion(nats_url):
    async def go() -> tuple[list[Progress], list[JobDone], int]:
        bus = await Bus.connect(nats_url, "test-training")
        got: list = []
        await bus.subscribe(subjects.progress_of_node("n1"), lambda m, _: got.append(m), expect=(Progress, JobDone))
        await bus.flush()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.training", "--name", "j1", "--node", "n1", "--model", "mlp",
            "--epochs", "3", "--steps-per-epoch", "5", "--batch", "32", "--threads", "1", "--nats", nats_url,
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        for _ in range(50):
            if any(isinstance(m, JobDone) for m in got):
                break
            await asyncio.sleep(0.1)
        await bus.close()
        assert proc.returncode == 0, err.decode()[-2000:]
        return ([m for m in got if isinstance(m, Progress)], [m for m in got if isinstance(m, JobDone)],
                proc.returncode)

    progress, done, rc = asyncio.run(go())
    assert [p.epoch for p in progress] == [0, 1, 2]
    assert all(p.job == "j1" and p.node == "n1" and p.eval_fn == "cross entropy" for p in progress)
    assert len(done) == 1 and done[0].ok and done[0].epochs == 3 and done[0].value == progress[-1].value
