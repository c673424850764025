"""The worker's training side without a bus: the CPU split and what it does with odd input (explicit times)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.worker.training import TrainingSide, is_training
from shared.core.flowcon import FlowConPolicy
from shared.runtime.base import KIND_LABEL, RuntimeContainer
from shared.runtime.cgroup import CgroupRuntime
from shared.schema import Progress


async def _nothing(subject, msg) -> None:
    return None


def side(split: str = "inference-first", cores: float = 4.0) -> TrainingSide:
    return TrainingSide("n1", CgroupRuntime("n1", cores=cores), FlowConPolicy(), _nothing, split=split)


def test_inference_first_gives_training_what_inference_leaves_at_least_one_core():
    s = side()
    assert s.share_for_training(0.0) == 1.0
    assert s.share_for_training(0.5) == pytest.approx(0.5)
    assert s.share_for_training(0.95) == pytest.approx(0.25)  # one core of four
    s.training_share = 0.5
    assert s.node_limit(1.0) == pytest.approx(0.5) and s.node_limit(0.25) == pytest.approx(0.125)
    assert s.node_limit(None) is None
    assert side("shared").share_for_training(0.9) == 1.0
    with pytest.raises(ValueError):
        side("half")


def test_training_containers_are_told_apart_by_their_label():
    t = RuntimeContainer("j", "id", "n1", labels={KIND_LABEL: "training"})
    assert is_training(t) and not is_training(RuntimeContainer("c", "id", "n1"))


def test_values_from_strangers_and_other_nodes_are_ignored_with_one_line(caplog):
    caplog.set_level(logging.WARNING)
    s = side()
    s.add(RuntimeContainer("j1", "id", "n1", labels={KIND_LABEL: "training"}, model="cnn"))
    s.on_progress(Progress(job="j1", node="n2", value=1.0, epoch=0))  # another node's: not ours
    for _ in range(5):
        s.on_progress(Progress(job="ghost", node="n1", value=1.0, epoch=0))
    assert caplog.text.count("ghost") == 1  # one line a minute per job, not one per message
    s.on_progress(Progress(job="j1", node="n1", value=2.0, epoch=0))
    assert s.values == {"j1": 2.0}
    assert s.remove("j1") and not s.remove("j1") and s.jobs == ()


def test_a_round_with_no_runtime_counters_still_decides():
    s = side()
    s.add(RuntimeContainer("j1", "id", "n1", labels={KIND_LABEL: "training"}))
    d = asyncio.run(s.step(0.0))  # the runtime was never started: no counters, one warning, still a round
    assert d is not None and d.stages() == {"j1": "NL"}
    assert s.state().jobs[0].job == "j1"
