"""The manager's placement bookkeeping with explicit times: stale reports, pending jobs, refusals.

The launch function stands in for the worker's reply on `dqoes.launch.<node>`
(the real path over NATS is tests/integration/test_training_live.py).
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from services.manager.placement import PENDING_FOR_S, Placer
from shared.schema import Launch, LaunchReply, TrainingJobState, TrainingState


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def state(node: str, at: float, *jobs: tuple[str, str, float | None]) -> TrainingState:
    return TrainingState(node=node, policy="flowcon", cores=4.0, round=1, at=at, interval_s=10.0, training_share=1.0,
                         jobs=tuple(TrainingJobState(job=j, stage=s, growth=g) for j, s, g in jobs))


def submit(p: Placer, body: dict | bytes, refuse: str | None = None) -> dict:
    sent: list[tuple[str, Launch]] = []

    async def launch(node: str, msg: Launch) -> LaunchReply:
        sent.append((node, msg))
        if refuse == "timeout":
            raise TimeoutError("no reply")
        return LaunchReply(ok=refuse is None, node=node, job=msg.job, error=refuse or "")

    data = body if isinstance(body, bytes) else orjson.dumps(body)
    reply = orjson.loads(asyncio.run(p.submit(data, launch)))
    reply["_sent"] = sent
    return reply


def test_flowcon_places_with_pending_jobs_counted_until_the_next_report():
    clock = Clock()
    p = Placer("flowcon", wall=clock)
    p.on_training_state(state("w1", clock.t, ("a", "NL", 0.10)))
    p.on_training_state(state("w2", clock.t, ("b", "NL", 0.15)))
    r1 = submit(p, {"model": "cnn"})
    assert r1["ok"] and r1["node"] == "w1" and r1["job"] == "cnn-001" and "lowest score" in r1["why"]
    # w1's report is stale now: its pending job counts as NL with the largest known G, so w2 wins
    r2 = submit(p, {"model": "cnn"})
    assert r2["node"] == "w2"
    # a new report from w1 that lists the job clears it from pending
    clock.t += 10
    p.on_training_state(state("w1", clock.t, ("a", "CL", 0.01), ("cnn-001", "NL", None)))
    assert p.workers["w1"].pending == {}
    assert p.workers["w2"].pending and "cnn-002" in p.workers["w2"].pending


def test_default_spreads_by_jobs_reported_plus_placed():
    clock = Clock()
    p = Placer("default", wall=clock)
    p.on_node_alive("w1", 4.0)
    p.on_node_alive("w2", 4.0)
    nodes = [submit(p, {"model": "mlp"})["node"] for _ in range(4)]
    assert nodes == ["w1", "w2", "w1", "w2"]


def test_a_pending_job_is_forgotten_after_a_while_and_silent_workers_are_dropped():
    clock = Clock()
    p = Placer("default", stale_after_s=15.0, wall=clock)
    p.on_node_alive("w1", 4.0)
    p.on_node_alive("w2", 4.0)
    assert submit(p, {"model": "mlp"})["node"] == "w1"
    clock.t += PENDING_FOR_S + 1
    p.on_node_alive("w1", 4.0)
    p.on_node_alive("w2", 4.0)
    assert submit(p, {"model": "mlp"})["node"] == "w1"  # the first job never showed up: not counted
    clock.t += 16
    p.on_node_alive("w2", 4.0)  # only w2 still speaks
    assert submit(p, {"model": "mlp"})["node"] == "w2"


@pytest.mark.parametrize("body,refuse,why", [
    ({"model": "resnet"}, None, "unknown model"),
    ({"model": "mlp", "node": "ghost"}, None, "is not there"),
    ({"model": "mlp", "epochs": -1}, None, "epochs"),
    (b"\xff\x00", None, "neither JSON"),
    ({"model": "mlp", "image": "x:1"}, "unknown image 'x:1' on node w1", "unknown image"),
    ({"model": "mlp"}, "timeout", "did not answer"),
])
def test_refusals_name_the_problem_and_place_nothing(body, refuse, why):
    clock = Clock()
    p = Placer("flowcon", wall=clock)
    p.on_node_alive("w1", 4.0)
    r = submit(p, body, refuse)
    assert r["ok"] is False and why in r["error"]
    assert p.workers["w1"].pending == {} and p.rejected == 1


def test_no_worker_and_duplicate_names():
    clock = Clock()
    p = Placer("flowcon", wall=clock)
    r = submit(p, {"model": "mlp"})
    assert r["ok"] is False and "no worker" in r["error"] and r["_sent"] == []
    p.on_training_state(state("w1", clock.t, ("j", "NL", 0.1)))
    assert "already running" in submit(p, {"model": "mlp", "name": "j"})["error"]
    assert submit(p, {"model": "mlp", "node": "w1"})["why"] == "asked for"
