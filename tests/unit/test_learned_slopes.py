"""Slopes shared on a node (`pool_slopes`): a container seen at one limit borrows the slope its
neighbours have shown, as much as they agree, and never its own.

Curves are fed directly: batches of a model whose latency is W / cores**k, with a small
deterministic wobble so that every fit has some noise to measure.
"""

from __future__ import annotations

import math

import pytest

from shared.core.learned import K_PRIOR_SD, K_RANGE, POOL_MIN, Curve, LearnedParams, LearnedPolicy
from shared.core.learned.pooling import between_variance, pool_slopes
from shared.core.types import BatchObs, ContainerView, NodeView

DECAY = (0.5 ** (1 / 8), 0.5 ** (1 / 8))


def seen(k: float, limits_cores: tuple[float, ...], work: float = 10.0, rounds: int = 4) -> Curve:
    """A curve fed `rounds` batches at each limit of a container whose latency is work / cores**k."""
    c = Curve()
    i = 0
    for _ in range(rounds):
        for cores in limits_cores:
            wobble = 0.03 * (1 if i % 2 else -1)
            c.add(math.log(cores), math.log(work) - k * math.log(cores) + wobble, 1.0, DECAY)
            i += 1
    return c


def pooled(slopes: list[tuple[float, float]], tau2: float) -> tuple[float, float]:
    """The random-effects mean and predictive sd, written out: what `_pool_slopes` must give."""
    w = [1.0 / (v + tau2) for _, v in slopes]
    mean = sum(wi * k for wi, (k, _) in zip(w, slopes, strict=True)) / sum(w)
    return mean, math.sqrt(tau2 + 1.0 / sum(w))


def own_slope(c: Curve) -> tuple[float, float]:
    f = c.solve_memory(c.switch.long_active, own=True)
    assert f is not None
    return f.k, f.var_k


def test_slopes_that_agree_have_no_spread_and_those_that_disagree_have_theirs():
    assert between_variance([[(1.0, 0.01)] * 4]) == 0.0
    slopes = [(0.7, 0.001), (1.0, 0.001), (1.3, 0.001), (1.6, 0.001)]
    spread2 = sum((k - 1.15) ** 2 for k, _ in slopes) / 3
    # What the estimates spread beyond their own variance.
    assert between_variance([slopes]) == pytest.approx(spread2 - 0.001, rel=1e-6)


def test_each_prior_is_the_pool_of_the_others_with_everyones_spread():
    curves = {f"n{i}": seen(k, (0.5, 1.0, 2.0)) for i, k in enumerate((0.9, 1.0, 1.1, 1.3))}
    curves["new"] = seen(1.0, (1.0,), rounds=2)
    pool_slopes(curves)
    pinned = {n: own_slope(curves[n]) for n in curves if n != "new"}
    tau2 = between_variance([list(pinned.values())])
    assert tau2 > 0
    assert curves["new"].node.k == pytest.approx(pooled(list(pinned.values()), tau2), rel=1e-9)
    for name in pinned:
        others = [kv for n, kv in pinned.items() if n != name]
        assert curves[name].node.k == pytest.approx(pooled(others, tau2), rel=1e-9)


def test_a_container_seen_at_one_limit_borrows_its_neighbours_slope():
    curves = {f"n{i}": seen(1.0, (0.5, 1.0, 2.0)) for i in range(4)}
    curves["new"] = seen(1.0, (1.0,), rounds=3)
    alone = Curve(sums=curves["new"].sums.copy())
    pool_slopes(curves)
    prior = curves["new"].node.k
    assert prior is not None and prior[0] == pytest.approx(1.0, abs=0.02) and prior[1] < K_PRIOR_SD / 3
    # Far from where it was seen, what it foresees is much surer than on its own.
    far_pooled, far_alone = curves["new"].predict(3.0), alone.predict(3.0)
    assert far_pooled is not None and far_alone is not None
    assert far_pooled[1] < far_alone[1] / 2
    # One limit says little of a slope: the newcomer's does not join the pool of the others.
    without = {n: seen(1.0, (0.5, 1.0, 2.0)) for n in curves if n != "new"}
    pool_slopes(without)
    assert all(without[n].node.k == curves[n].node.k for n in without)


def test_a_slope_never_informs_its_own_prior():
    # POOL_MIN pinned slopes: each has only POOL_MIN - 1 others, so none gets a node prior; a newcomer,
    # which sees all of them, does.
    curves = {f"n{i}": seen(1.0, (0.5, 1.0, 2.0)) for i in range(POOL_MIN)}
    curves["new"] = seen(1.0, (1.0,), rounds=2)
    pool_slopes(curves)
    assert all(curves[f"n{i}"].node.k is None for i in range(POOL_MIN))
    assert curves["new"].node.k is not None


def test_a_neighbour_with_another_slope_is_learnt_from_its_own_batches():
    # Three containers with k = 1 and one with k = 1.6, all seen at three limits: the odd one's fit
    # stays near its own slope (the spread it adds widens its prior, and its data outweigh it).
    curves = {f"n{i}": seen(1.0, (0.5, 1.0, 2.0)) for i in range(3)}
    curves["odd"] = seen(1.6, (0.5, 1.0, 2.0))
    curves["new"] = seen(1.0, (1.0,), rounds=2)
    pool_slopes(curves)
    fit = curves["odd"].solve()
    assert fit is not None and fit.k == pytest.approx(1.6, abs=0.1)
    # The newcomer's prior is not narrower than the slopes it comes from disagree.
    prior = curves["new"].node.k
    assert prior is not None and prior[1] >= 0.2


def _view(name: str, limit: float, latency_s: float) -> ContainerView:
    b = BatchObs(latency_s=latency_s, finished_at_s=100.0, limit=limit, clean=True, index=3,
                 cpu_s=latency_s * limit * 4.0)
    return ContainerView(name=name, objective_s=12.0, alpha=0.1, latency_s=latency_s, last_latency_s=latency_s,
                         cpu_share=limit, limit=limit, batches=(b,))


@pytest.mark.parametrize("pool", [0.0, 1.0])
def test_the_pool_is_a_setting_and_off_leaves_every_curve_its_own_prior(pool):
    policy = LearnedPolicy(LearnedParams(pool_slopes=pool))
    for i in range(4):
        policy.curves[f"n{i}"] = seen(1.0, (0.5, 1.0, 2.0))
    policy.curves["new"] = seen(1.0, (1.0,), rounds=2)
    views = tuple(_view(n, 0.2, 10.0 / 0.8) for n in policy.curves)
    policy.decide(NodeView(node="n1", cores=4.0, now_s=100.0, containers=views))
    prior = policy.curves["new"].node.k
    assert (prior is not None) == (pool == 1.0)
    with pytest.raises(ValueError, match="pool_slopes must be a number in"):
        LearnedParams(pool_slopes=2.0)


def test_turned_off_at_runtime_no_curve_keeps_the_node_prior_it_had():
    policy = LearnedPolicy(LearnedParams())
    for i in range(4):
        policy.curves[f"n{i}"] = seen(1.0, (0.5, 1.0, 2.0))
    policy.curves["new"] = seen(1.0, (1.0,), rounds=2)
    views = tuple(_view(n, 0.2, 10.0 / 0.8) for n in policy.curves)
    policy.decide(NodeView(node="n1", cores=4.0, now_s=100.0, containers=views))
    assert policy.curves["new"].node.k is not None
    policy.set_params(LearnedParams(pool_slopes=0.0))
    policy.decide(NodeView(node="n1", cores=4.0, now_s=105.0, containers=views))
    assert all(c.node.k is None for c in policy.curves.values())


def test_a_slope_past_the_range_is_clamped_and_the_line_still_runs_through_the_data():
    # Latency falling as cores**-5: past K_RANGE, so k is kept at its top. theta must be the one
    # for that k; theta of k = 5 with k = 3 would put the curve 2 x mean(log cores) off its data.
    c = seen(5.0, (1.0, 2.0, 3.0), rounds=6)
    fit = c.solve()
    assert fit is not None and fit.k == K_RANGE[1]
    mean_x, mean_y = c.sums.sx / c.sums.sw, c.sums.sy / c.sums.sw
    pred = c.predict(math.exp(mean_x))
    assert pred is not None and pred[0] == pytest.approx(mean_y, abs=0.02)
