"""Slow spells a node's containers share, in the simulator: the physics, the schedule drawn from the
seed, the `random-cluster-spells` variant and the scenario file's `node_spells`."""

from __future__ import annotations

import dataclasses
import random

import orjson
import pytest

from shared.core.profiles import ModelProfile
from shared.scenarios.builtin import load
from shared.scenarios.spec import NodeSpells, ScenarioError, parse_scenario, scenario_to_dict
from shared.sim.engine import simulate
from shared.sim.physics import SimNode

# -- physics ------------------------------------------------------------------------------------------


def _one_thread_node(spells) -> SimNode:
    node = SimNode("n", 2.0, spells=spells)
    node.add("c", ModelProfile("m", work_cpu_s=10.0, threads=1), 0.0, random.Random(1), noise_sigma=0.0)
    return node


def test_a_batch_progresses_slower_during_a_spell_at_the_same_cpu():
    # 10 CPU-seconds on one core: 5 s of work before the spell, 2.5 in its 5 s at half pace, the
    # last 2.5 after it. The batch used a core all along: 12.5 CPU-seconds.
    done = _one_thread_node([(5.0, 10.0, 2.0)]).advance(30.0)
    assert done[0].latency_s == pytest.approx(12.5)
    assert done[0].cpu_s == pytest.approx(12.5)
    # The next batch runs at full pace: 10 s.
    assert done[1].latency_s == pytest.approx(10.0)


def test_a_spell_edge_between_two_advances_is_kept():
    node = _one_thread_node([(5.0, 10.0, 2.0)])
    assert node.advance(7.0) == []
    assert node.slow == 2.0
    done = node.advance(12.5)
    assert [b.latency_s for b in done] == [pytest.approx(12.5)] and node.slow == 1.0


def test_no_spell_is_the_physics_as_before():
    assert [b.latency_s for b in _one_thread_node(()).advance(30.0)] == [pytest.approx(10.0)] * 3


@pytest.mark.parametrize("spells", [[(0.0, 10.0, 1.5), (5.0, 20.0, 1.5)], [(10.0, 5.0, 1.5)], [(0.0, 5.0, 0.0)]])
def test_overlapping_backwards_or_zero_spells_are_refused(spells):
    with pytest.raises(ValueError):
        SimNode("n", 2.0, spells=spells)


def test_a_schedule_comes_from_the_seed_and_node_alone_and_never_overlaps():
    sp = NodeSpells(120.0, (5.0, 60.0), (1.2, 1.6))
    a = sp.schedule(7, "worker-1", 1500.0)
    assert a == sp.schedule(7, "worker-1", 1500.0)
    assert a != sp.schedule(7, "worker-2", 1500.0) and a != sp.schedule(8, "worker-1", 1500.0)
    assert len(a) >= 3
    for (s0, e0, f0), (s1, _, _) in zip(a, a[1:], strict=False):
        assert 5.0 <= e0 - s0 <= 60.0 and 1.2 <= f0 <= 1.6 and e0 <= s1
    assert all(s < 1500.0 for s, _, _ in a)


def test_the_spells_variant_runs_spells_and_the_base_none():
    sc = load("random-cluster-spells", 3)
    assert all(sc.spells_of(n.name, 3) for n in sc.nodes)
    assert all(load("random-cluster-40", 3).spells_of(n.name, 3) == () for n in sc.nodes)
    a = simulate(dataclasses.replace(load("random-cluster-40", 3), duration_s=300), "default", 3)
    b = simulate(dataclasses.replace(sc, duration_s=300), "default", 3)
    assert a.containers == b.containers
    # Under default (no limits move) the same containers finish fewer batches: they ran slower.
    assert sum(f.batches for f in b.final) < sum(f.batches for f in a.final)


# -- file form -----------------------------------------------------------------------------------------


def test_node_spells_are_written_to_a_file_and_read_back():
    sc = load("random-cluster-spells", 5)
    doc = orjson.loads(orjson.dumps(scenario_to_dict(sc)))
    assert doc["node_spells"] == {"every_s": 120.0, "duration_s": [5.0, 60.0], "factor": [1.2, 1.6]}
    assert parse_scenario(doc) == sc
    assert "node_spells" not in scenario_to_dict(load("random-cluster-40", 5))


@pytest.mark.parametrize("bad, why", [
    ({"every_s": 100, "duration_s": [5, 10], "factor": [0.5, 2]}, "factor: must be"),
    ({"every_s": 100, "duration_s": [10, 5], "factor": [1.2, 2]}, "duration_s: must be"),
    ({"every_s": 0, "duration_s": [5, 10], "factor": [1.2, 2]}, "every_s"),
    ({"duration_s": [5, 10], "factor": [1.2, 2]}, "every_s"),
    ({"every_s": 100, "duration_s": 5, "factor": [1.2, 2]}, "duration_s: must be"),
    ({"every_s": 100, "duration_s": [5, 10], "factor": [1.2, 2], "when": 1}, "when"),
    ("often", "node_spells: must be a table"),
])
def test_bad_node_spells_are_refused_with_a_reason(bad, why):
    doc = orjson.loads(orjson.dumps(scenario_to_dict(load("random-cluster-40", 5))))
    doc["node_spells"] = bad
    with pytest.raises(ScenarioError, match=why):
        parse_scenario(doc)
