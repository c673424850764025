"""The need question (shared/core/learned/need.py): cores for an objective with a probability, and the
latency a limit gives, from a calibrated profile or a learned curve."""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from shared.core.learned import Curve
from shared.core.learned.need import Outlook, cores_needed, latency_at
from shared.core.profiles import ModelProfile

PROFILE = ModelProfile("m", 10.0, threads=4)
"""10 CPU-seconds a batch on up to 4 threads: 10 / cores seconds below 4 cores."""


def learned(noise: float = 0.0, steps: bool = False) -> Curve:
    c = Curve(steps=steps)
    for i in range(200):
        cores = (0.5, 1.0, 2.0, 3.0)[i % 4]
        c.add(math.log(cores), math.log(10.0 / cores) + (noise if i % 2 else -noise), 1.0, (1.0, 1.0))
    return c


def test_a_profile_needs_the_cores_that_bring_its_latency_to_the_objective():
    assert cores_needed(PROFILE, 5.0, 0.5, 8.0, noise_sd=0.0) == pytest.approx(2.0, rel=1e-6)
    # Nine batches in ten within 5 s under a noise of 0.1 (log sd): 2 exp(z_0.9 0.1) cores.
    z = NormalDist().inv_cdf(0.9)
    assert cores_needed(PROFILE, 5.0, 0.9, 8.0, noise_sd=0.1) == pytest.approx(2.0 * math.exp(z * 0.1), rel=1e-6)


def test_more_certainty_costs_more_cores():
    needs = [cores_needed(PROFILE, 5.0, p, 8.0, noise_sd=0.1) for p in (0.5, 0.8, 0.95, 0.99)]
    assert needs == sorted(needs) and needs[0] < needs[-1]


def test_no_limit_on_a_small_node_meets_it():
    assert cores_needed(PROFILE, 5.0, 0.5, 1.5) == math.inf
    # Nor past the profile's threads on a large one: 4 threads, 2.5 s at best.
    assert cores_needed(PROFILE, 2.0, 0.5, 16.0) == math.inf


def test_the_latency_a_limit_gives_and_its_spread():
    out = latency_at(PROFILE, 2.5, 8.0, noise_sd=0.1)
    assert out == Outlook(4.0, 0.1)
    assert out.mean_s == pytest.approx(4.0 * math.exp(0.005))
    assert out.chance_within(4.0) == pytest.approx(0.5)
    assert out.quantile_s(0.9) == pytest.approx(4.0 * math.exp(NormalDist().inv_cdf(0.9) * 0.1))
    assert latency_at(PROFILE, 20.0, 8.0, 0.0) == Outlook(2.5, 0.0)  # no more than the node, 4 threads


def test_a_learned_curve_answers_as_the_profile_it_learnt():
    c = learned()
    out = latency_at(c, 2.5, 8.0)
    assert out is not None and out.median_s == pytest.approx(4.0, rel=0.01)
    assert cores_needed(c, 5.0, 0.5, 8.0) == pytest.approx(2.0, rel=0.02)


def test_the_need_at_its_probability_is_where_the_outlook_reaches_it():
    c = learned(noise=0.08)
    need = cores_needed(c, 5.0, 0.8, 8.0)
    assert need is not None and math.isfinite(need)
    at = latency_at(c, need, 8.0)
    assert at is not None and at.chance_within(5.0) == pytest.approx(0.8, abs=1e-6)
    below = latency_at(c, need * 0.99, 8.0)
    assert below is not None and below.chance_within(5.0) < 0.8


def test_a_curve_whose_threads_follow_the_limit_needs_whole_cores():
    need = cores_needed(learned(steps=True), 4.0, 0.5, 8.0)
    assert need == 3.0  # 2.5 cores of need: its threads use 2 of a 2.5-core limit


def test_a_curve_that_has_seen_nothing_cannot_answer():
    assert latency_at(Curve(), 1.0, 4.0) is None and cores_needed(Curve(), 5.0, 0.5, 4.0) is None


@pytest.mark.parametrize(("args", "says"), [((5.0, 1.0, 8.0), "probability"), ((0.0, 0.5, 8.0), "objective_s"),
                                            ((5.0, 0.5, 0.0), "node_cores")])
def test_bad_questions_are_refused_with_the_name_of_what_is_wrong(args, says):
    with pytest.raises(ValueError, match=says):
        cores_needed(PROFILE, *args)
