"""A run's final allocation counted as chances (`next_batch_chances`, `expected_*_final`).

The plateau counts a few last batches, each a draw of the noise; the chances of each container's
next batch at the limits a policy ends with read the same allocation without that luck. They are
checked against the simulator's own batches (a node its limits overcommit, so CFS shares it), and
against the oracle policy's allocation, which the oracle under noise works out independently.
"""

from __future__ import annotations

import math
import random

import pytest

from shared.core.measures import normal_cdf
from shared.core.profiles import ModelProfile
from shared.scenarios.builtin import load
from shared.sim.engine import next_batch_chances, simulate
from shared.sim.physics import SimNode

P = ModelProfile("m", work_cpu_s=10.0, threads=2)


def test_chances_match_the_simulators_batches_on_a_shared_node():
    node = SimNode("n", 2.0)
    limits = {"a": 0.9, "b": 0.2, "c": None}  # 1.8, 0.4 and 2 cores wanted of 2: CFS shares the node
    objectives = {"a": 12.0, "b": 25.0, "c": 13.0}
    for i, (name, limit) in enumerate(limits.items()):
        node.add(name, P, 0.0, random.Random(i), noise_sigma=0.12, limit=limit)
    chances = next_batch_chances(node, objectives, dict.fromkeys(objectives, 0.1))
    lat: dict[str, list[float]] = {n: [] for n in limits}
    t = 0.0
    while min(len(v) for v in lat.values()) < 2500:
        t += 100.0
        for b in node.advance(t):
            if b.batch > 0:
                lat[b.container].append(b.latency_s)
    for name, seen in lat.items():
        slow, fast = 1.1 * objectives[name], 0.9 * objectives[name]
        met = sum(v <= slow for v in seen) / len(seen)
        band = sum(fast <= v <= slow for v in seen) / len(seen)
        assert chances[name][0] == pytest.approx(met, abs=0.03), name
        assert chances[name][1] == pytest.approx(band, abs=0.03), name
    # As CFS shares them: b keeps its 0.4 cores, a and c split the other 1.6.
    assert chances["b"][0] == pytest.approx(normal_cdf(math.log(1.1 * 25.0 / (10.0 / 0.4)) / 0.12), abs=1e-9)
    assert chances["c"][0] == pytest.approx(normal_cdf(math.log(1.1 * 13.0 / (10.0 / 0.8)) / 0.12), abs=1e-9)


def test_containers_without_an_objective_are_left_out():
    node = SimNode("n", 4.0)
    node.add("a", P, 0.0, random.Random(1), noise_sigma=0.1, limit=0.25)
    node.add("t", P, 0.0, random.Random(2), noise_sigma=0.1, limit=0.25)
    assert set(next_batch_chances(node, {"a": 10.0, "t": None}, {"a": 0.1, "t": 0.1})) == {"a"}


@pytest.mark.parametrize("seed", [3, 4])
def test_the_oracle_policy_ends_where_the_oracle_under_noise_works_it_out(seed):
    sc = load("random-cluster-40", seed)
    r = simulate(sc, "oracle", seed)
    assert r.expected_met_final == pytest.approx(r.oracle_noise_met, abs=1e-6)
    assert r.expected_in_band_final == pytest.approx(r.oracle_noise_in_band, abs=1e-6)
    learned = simulate(sc, "learned", seed)
    # No allocation expects more than the ceilings, and the per-container chances add up.
    assert learned.expected_met_final <= learned.ceiling_met + 1e-9
    assert learned.expected_in_band_final <= learned.ceiling_in_band + 1e-9
    assert learned.expected_in_band_final == pytest.approx(sum(f.chance_in_band for f in learned.final))
    out = learned.summary()
    assert out["expected_in_band_final"] == round(learned.expected_in_band_final, 3)
    assert all(0.0 <= f["chance_in_band"] <= f["chance_met"] <= 1.0 for f in out["final"])
