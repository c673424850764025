"""The oracle under noise: one batch's latency distribution, and the ceilings no allocation passes.

The chances are checked against the simulator itself (a container run for
many batches at a fixed limit under log-normal noise), so the ceiling a
policy is compared with describes the node the policy runs on.
"""

from __future__ import annotations

import math
import random

import pytest

from shared.core.measures import band_chances
from shared.core.oracle import OracleItem, _grid, _table, expected_plan, latency_cdf, plan_node
from shared.core.profiles import ModelProfile
from shared.sim.physics import SimNode

P = ModelProfile("m", work_cpu_s=10.0, threads=2, overhead_s=1.0)


@pytest.mark.parametrize(("limit", "sigma"), [(0.25, 0.1), (0.5, 0.15), (0.125, 0.05)])
def test_latency_distribution_matches_the_simulator(limit, sigma):
    cores = 4.0
    node = SimNode("n", cores)
    node.add("c", P, 0.0, random.Random(7), noise_sigma=sigma, limit=limit)
    lat = []
    t = 0.0
    while len(lat) < 2500:
        t += 50.0
        lat += [b.latency_s for b in node.advance(t) if b.batch > 0]
    median = P.latency_s(limit * cores, cores)
    for x in (median * 0.9, median, median * 1.1, median * 1.25):
        seen = sum(1 for v in lat if v <= x) / len(lat)
        assert seen == pytest.approx(latency_cdf(P, limit, cores, x, sigma), abs=0.03)


def test_latency_distribution_edges():
    assert latency_cdf(P, 0.5, 4.0, 0.5, 0.1) == 0.0  # under the overhead alone
    med = P.latency_s(2.0, 4.0)
    assert latency_cdf(P, 0.5, 4.0, med, 0.1) == pytest.approx(0.5)
    assert latency_cdf(P, 0.5, 4.0, med * 1.01, 0.0) == 1.0
    assert latency_cdf(P, 0.5, 4.0, med * 0.99, 0.0) == 0.0


def test_band_chances():
    met, band = band_chances(0.0, 0.1, math.log(1.1), math.log(0.9))
    assert met == pytest.approx(0.829, abs=1e-3) and band == pytest.approx(0.683, abs=2e-3)
    assert band_chances(0.0, 0.0, 0.1, -0.1) == (1.0, 1.0)
    assert band_chances(-0.2, 0.0, 0.1, -0.1) == (1.0, 0.0)
    assert band_chances(0.2, 0.0, 0.1, -0.1) == (0.0, 0.0)


def _items(rng, n):
    return [OracleItem(f"c{i}", rng.uniform(2, 60), 0.1,
                       ModelProfile(f"m{i}", work_cpu_s=rng.uniform(2, 20), threads=rng.choice([1, 2, 4])))
            for i in range(n)]


@pytest.mark.parametrize("seed", range(8))
def test_ceilings_bound_every_allocation(seed):
    rng = random.Random(seed)
    cores, sigma = rng.choice([2.0, 4.0, 8.0]), rng.choice([0.03, 0.08, 0.15])
    items = _items(rng, rng.randint(2, 8))
    ex = expected_plan(items, cores, sigma)
    assert ex.cpu_share <= 1.0 + 1e-9
    assert ex.met <= ex.met_ceiling + 1e-9 and ex.in_band <= ex.in_band_ceiling + 1e-9
    floor = 1 / (2 * len(items))
    grid = _grid(floor, 1.0)
    tables = [_table(it, grid, cores, sigma) for it in items]
    for _ in range(300):  # random allocations within the node: never above either ceiling
        picks = [rng.randrange(len(grid)) for _ in items]
        while sum(t[j][0] for t, j in zip(tables, picks, strict=True)) > 1.0:
            k = rng.randrange(len(items))
            picks[k] = max(0, picks[k] - 5)
        assert sum(t[j][1] for t, j in zip(tables, picks, strict=True)) <= ex.met_ceiling + 1e-9
        assert sum(t[j][2] for t, j in zip(tables, picks, strict=True)) <= ex.in_band_ceiling + 1e-9


def test_noise_wider_than_the_band_lowers_the_in_band_ceiling():
    rng = random.Random(3)
    items = _items(rng, 6)
    quiet, noisy = expected_plan(items, 8.0, 0.01), expected_plan(items, 8.0, 0.15)
    assert noisy.in_band_ceiling < quiet.in_band_ceiling
    # Almost noise-free, the expectation comes near the noise-free count.
    assert quiet.in_band_ceiling == pytest.approx(plan_node(items, 8.0).count, abs=1.0)
    # One batch in band is at most P(|z| < alpha / sigma)-likely per container, whatever its limit.
    assert noisy.in_band_ceiling <= len(items) * (2 * 0.5 * math.erfc(-(0.1 / 0.15) / math.sqrt(2)) - 1) + 0.1


def test_lower_median_count():
    from shared.core.measures import lower_median_count

    assert lower_median_count([]) == 0
    assert lower_median_count([1.0, 1.0, 0.0]) == 2
    assert lower_median_count([0.5]) == 0  # a tie counts against: the lower median
    assert lower_median_count([0.5, 0.5]) == 1
    # Thirty near-certain and a few coin flips: the median sits above the mean.
    ps = [0.97] * 30 + [0.3] * 4
    assert lower_median_count(ps) == 30 and sum(ps) < 30.3
    rng = random.Random(5)
    for _ in range(20):  # against sampling
        ps = [rng.random() for _ in range(rng.randint(1, 12))]
        draws = sorted(sum(rng.random() < p for p in ps) for _ in range(4001))
        assert abs(draws[2000] - lower_median_count(ps)) <= 1
