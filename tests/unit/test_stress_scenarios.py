"""The stress variants of the random clusters: the same draws as `random-cluster-40`, one departure each."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from shared.scenarios.builtin import BUILTINS, STRESS, load
from shared.scenarios.spec import ScenarioError, parse_scenario, scenario_to_dict
from shared.sim.engine import simulate

BASE = "random-cluster-40"


def test_random_cluster_40_itself_is_unchanged():
    # Drawn as before the variants existed: node sizes, noise and description of seed 7 as recorded.
    sc = load(BASE, 7)
    assert [n.cores for n in sc.nodes] == [6.0, 4.0, 2.0, 6.0]
    assert sc.noise_sigma == 0.093
    assert sc.controller.alpha == 0.1
    assert sc.description.endswith("[0, 300 s] submissions")


@pytest.mark.parametrize("seed", [1, 7, 1234])
def test_random_cluster_40_is_the_same_from_the_same_seed(seed):
    assert load(BASE, seed) == load(BASE, seed)


@pytest.mark.parametrize("name", list(STRESS))
@pytest.mark.parametrize("seed", [3, 1001])
def test_each_variant_departs_from_the_base_in_its_one_way(name, seed):
    base, var, stress = load(BASE, seed), load(name, seed), STRESS[name]
    assert name in BUILTINS and var.name == name
    assert var.containers == base.containers  # same models, objectives, submissions, changes
    assert [n.name for n in var.nodes] == [n.name for n in base.nodes][: stress.nodes]
    assert [n.cores for n in var.nodes] == [n.cores * stress.cores_scale for n in base.nodes][: stress.nodes]
    lo, hi = stress.noise
    assert lo <= var.noise_sigma <= hi
    if stress.noise == (0.02, 0.15):
        assert var.noise_sigma == base.noise_sigma
    assert var.controller.alpha == (stress.alpha if stress.alpha is not None else base.controller.alpha)
    assert var.noise_rho == stress.noise_rho and base.noise_rho == 0.0
    assert var.node_spells == stress.spells and base.node_spells is None
    assert stress.summary in var.description


def test_the_variants_are_what_their_names_say():
    assert STRESS["random-cluster-scarce"].cores_scale == 0.5
    assert STRESS["random-cluster-roomy"].cores_scale == 2.0
    assert STRESS["random-cluster-crowded"].nodes == 2
    assert STRESS["random-cluster-noisy"].noise == (0.15, 0.3)
    assert STRESS["random-cluster-tight"].alpha == 0.05
    assert STRESS["random-cluster-sticky"].noise_rho == 0.6
    assert STRESS["random-cluster-threads"].follows
    spells = STRESS["random-cluster-spells"].spells
    assert spells is not None and (spells.every_s, spells.duration_s, spells.factor) == (120.0, (5.0, 60.0), (1.2, 1.6))
    assert [name for name, st in STRESS.items() if st.spells] == ["random-cluster-spells"]
    assert [name for name, st in STRESS.items() if st.follows] == ["random-cluster-threads"]


def test_a_tight_band_is_what_every_measure_and_policy_uses():
    sc = load("random-cluster-tight", 5)
    assert sc.policy_settings()["alpha"] == 0.05
    r = simulate(dataclasses.replace(sc, duration_s=400), "dqoes", 5)
    assert {f.alpha for f in r.final} == {0.05}
    # Written to a file and read back, it is the same scenario (the band included).
    doc = orjson.loads(orjson.dumps(scenario_to_dict(sc)))
    assert parse_scenario(doc) == sc


def test_crowded_places_every_container_on_the_two_nodes():
    sc = load("random-cluster-crowded", 9)
    r = simulate(dataclasses.replace(sc, duration_s=400), "default", 9)
    assert {f.node for f in r.final} <= {"worker-1", "worker-2"}
    assert r.containers == 40 and r.nodes == 2


def test_noise_that_persists_is_written_to_a_file_and_read_back():
    sc = load("random-cluster-sticky", 5)
    doc = orjson.loads(orjson.dumps(scenario_to_dict(sc)))
    assert doc["noise_rho"] == 0.6
    assert parse_scenario(doc) == sc
    # A scenario with independent noise writes no noise_rho: its file is what it was before.
    assert "noise_rho" not in scenario_to_dict(load(BASE, 5))


@pytest.mark.parametrize("bad, why", [(1.0, "must be < 1"), (-0.2, "must be >= 0"), ("0.5", "must be a number")])
def test_a_bad_noise_rho_is_refused_with_a_reason(bad, why):
    doc = orjson.loads(orjson.dumps(scenario_to_dict(load(BASE, 5))))
    doc["noise_rho"] = bad
    with pytest.raises(ScenarioError, match=f"noise_rho: {why}"):
        parse_scenario(doc)


def test_a_sticky_run_differs_from_an_independent_one_only_in_its_noise():
    base, sticky = load(BASE, 4), load("random-cluster-sticky", 4)
    a = simulate(dataclasses.replace(base, duration_s=300), "default", 4)
    b = simulate(dataclasses.replace(sticky, duration_s=300), "default", 4)
    assert a.containers == b.containers and [f.name for f in a.final] == [f.name for f in b.final]
    assert [f.latency_s for f in a.final] != [f.latency_s for f in b.final]
