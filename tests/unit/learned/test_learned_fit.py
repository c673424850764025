"""The curve fit (shared/core/learned/fit.py, curve.py, observe.py) against known curves and noise."""

from __future__ import annotations

import math
import random

import pytest

from shared.core.learned import Curve, Fit
from shared.core.learned.fit import K_RANGE, NOISE_PRIOR, solve_sums
from shared.core.learned.observe import WARMUP_WEIGHT, observe
from shared.core.learned.settings import LearnedParams, Settings
from shared.core.types import BatchObs, ContainerView


def _curve_of(theta: float, k: float, noise_sd: float, n: int, seed: int = 1) -> Curve:
    """A curve that took n batches of log L = theta - k log c + N(0, noise_sd), at limits 0.5-4 cores."""
    rng = random.Random(seed)
    c = Curve()
    for i in range(n):
        x = math.log((0.5, 1.0, 2.0, 4.0)[i % 4])
        c.add(x, theta - k * x + rng.gauss(0.0, noise_sd), 1.0, (1.0, 1.0))
    return c


@pytest.mark.parametrize(("k", "noise_sd"), [(1.0, 0.05), (1.3, 0.1), (0.8, 0.2)])
def test_the_fit_finds_a_known_line_and_its_noise(k, noise_sd):
    fit = _curve_of(math.log(10.0), k, noise_sd, 400).solve()
    assert isinstance(fit, Fit)
    assert fit.k == pytest.approx(k, abs=0.05)
    assert fit.theta == pytest.approx(math.log(10.0), abs=0.03)
    assert fit.noise_sd == pytest.approx(noise_sd, rel=0.15)
    assert fit.var_k < 0.01 and fit.var_theta < 0.01


def test_few_batches_leave_the_fit_unsure_and_more_make_it_sure():
    few, many = (_curve_of(math.log(10.0), 1.0, 0.1, n).solve() for n in (4, 200))
    assert few is not None and many is not None
    assert few.var_k > 10 * many.var_k
    # What the fit does not know yet widens its prediction far from its data.
    assert few.mean_sd(math.log(16.0))[1] > few.mean_sd(math.log(1.0))[1]


def test_without_data_there_is_no_fit_but_a_height_alone_gives_one():
    empty = (0.0,) * 7
    assert solve_sums(empty, (1.0, 0.35)) is None
    fit = solve_sums(empty, (1.0, 0.35), height=(0.0, math.log(5.0), 0.01))
    assert fit is not None and fit.theta == pytest.approx(math.log(5.0)) and fit.k == pytest.approx(1.0)
    assert fit.noise_sd == NOISE_PRIOR


def test_a_slope_the_data_puts_out_of_range_is_clamped():
    fit = _curve_of(math.log(10.0), 5.0, 0.01, 40).solve()
    assert fit is not None and fit.k == K_RANGE[1]


def test_the_prediction_and_the_need_agree_with_the_line():
    c = _curve_of(math.log(10.0), 1.0, 0.01, 200)
    mean, _ = c.predict(2.0)
    assert math.exp(mean) == pytest.approx(5.0, rel=0.01)
    assert c.cores_for(5.0, 0.0) == pytest.approx(2.0, rel=0.01)
    c.sat_cores = 1.5  # a ceiling: no more than 1.5 cores helps
    assert math.exp(c.predict(2.0)[0]) == pytest.approx(10.0 / 1.5, rel=0.01)
    assert c.cores_for(5.0, 0.0) == math.inf


def _view(batches: tuple[BatchObs, ...], limit: float) -> ContainerView:
    return ContainerView(name="x", objective_s=10.0, alpha=0.1, latency_s=None, last_latency_s=None,
                         cpu_share=None, limit=limit, batches=batches)


def test_the_warm_up_batch_counts_little_and_a_binding_limit_is_read_as_the_cores():
    memory = Settings.of(LearnedParams()).memory
    c = Curve()
    # 4-core node, a limit of half the node (2 cores) used fully: read at 2 cores.
    first = BatchObs(latency_s=5.0, finished_at_s=5.0, limit=0.5, clean=True, index=0, cpu_s=10.0)
    observe(_view((first,), 0.5), c, 4.0, 0.5, memory, 5.0, None)
    assert c.sums.sw == pytest.approx(WARMUP_WEIGHT)
    assert math.exp(c.sums.sx / c.sums.sw) == pytest.approx(2.0)
    second = BatchObs(latency_s=5.0, finished_at_s=10.0, limit=0.5, clean=True, index=1, cpu_s=10.0)
    observe(_view((second,), 0.5), c, 4.0, 0.5, memory, 5.0, None)
    assert c.n == 2 and c.sums.sw == pytest.approx(WARMUP_WEIGHT * 0.5 ** (1 / 8) + 1.0)


def test_a_batch_that_left_its_limit_unused_on_an_idle_node_shows_a_ceiling():
    memory = Settings.of(LearnedParams()).memory
    c = Curve()
    batches = tuple(BatchObs(latency_s=10.0, finished_at_s=10.0 * (i + 1), limit=0.5, clean=True, index=i,
                             cpu_s=10.0) for i in range(3))  # 1 core used of a 2-core limit
    observe(_view(batches, 0.5), c, 4.0, 0.3, memory, 5.0, None)
    assert c.sat_cores == pytest.approx(1.05)
    # Read at the cores it used, not the limit.
    assert math.exp(c.sums.sx / c.sums.sw) == pytest.approx(1.0)
