"""What a container reports cannot buy it more CPU than its measured use justifies (issue 62).

Properties of the guard alone, then of every registered policy driven through `NodeController`
with a container that claims slow batches while it stays idle.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core import registry
from shared.core.controller import NodeController
from shared.core.guard import THROTTLED_MIN, USE_MIN, Measured, cap_raises, is_raise, may_raise
from shared.core.policy import PolicyContext
from shared.core.types import Cls, ContainerDecision, Decision

limits = st.one_of(st.none(), st.floats(0.01, 1.0))
shares = st.one_of(st.none(), st.floats(0.0, 1.0))
ratios = st.one_of(st.none(), st.floats(0.0, 1.0))


@st.composite
def decisions(draw):
    n = draw(st.integers(1, 12))
    containers, measured = [], {}
    for i in range(n):
        name = f"c{i}"
        old, new = draw(limits), draw(limits)
        containers.append(ContainerDecision(name, draw(st.sampled_from([None, Cls.G, Cls.S, Cls.B])), None,
                                            None, None, old, new, "policy", draw(limits)))
        if draw(st.booleans()):
            measured[name] = Measured(draw(shares), draw(ratios))
    d = Decision("n1", 0.0, "any", tuple(containers), 0.0, 0.0, 0, 10.0)
    return d, measured, draw(st.one_of(st.none(), st.floats(0.0, 1.0)))


@given(decisions())
@settings(max_examples=400)
def test_an_idle_container_never_gets_a_raise_and_every_other_decision_stands(case):
    d, measured, spare = case
    out = cap_raises(d, measured, spare)
    assert len(out.containers) == len(d.containers)
    for before, after in zip(d.containers, out.containers, strict=True):
        m = measured.get(before.name)
        idle = (before.old_limit is not None and m is not None and m.cpu_share is not None
                and spare is not None and (m.throttled_ratio is None or m.throttled_ratio < THROTTLED_MIN)
                and spare >= USE_MIN * before.old_limit - m.cpu_share > 0.0)
        if idle and is_raise(before.old_limit, before.new_limit):
            # Neither throttled nor using most of its limit, with the CPU there to use: held.
            assert after.new_limit == before.old_limit and after.plan == before.old_limit
            assert after.reason.startswith("raise held")
        else:
            assert after == before
        assert not is_raise(before.new_limit, after.new_limit)  # the guard only ever takes back


@given(st.floats(0.01, 1.0), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_what_is_not_measured_never_blocks(limit, share, spare):
    assert may_raise(limit, None, spare)
    assert may_raise(limit, Measured(None, 0.0), spare)
    assert may_raise(limit, Measured(share, None), None)
    assert may_raise(None, Measured(share, 0.0), spare)


@given(st.floats(0.01, 1.0), st.floats(0.0, 1.0), st.floats(THROTTLED_MIN, 1.0))
def test_a_throttled_container_may_always_be_raised(limit, share, throttled):
    assert may_raise(limit, Measured(share, throttled), 1.0)


@given(st.floats(0.01, 1.0), st.floats(0.0, 1.0))
def test_a_container_held_back_by_its_busy_siblings_may_be_raised(limit, share):
    # No spare CPU on the node: contention, not its limit or its will, keeps its use down.
    assert may_raise(limit, Measured(share * limit * USE_MIN * 0.999, 0.0), 0.0)


POLICIES = tuple(n for n in registry.names() if n != "oracle")  # the oracle knows the true curves
"""Policies that read what containers report (the oracle, given no curves, reads nothing)."""


@st.composite
def liar_nodes(draw):
    return dict(
        policy=draw(st.sampled_from(POLICIES)),
        cores=draw(st.sampled_from([2.0, 4.0, 8.0])),
        siblings=[(draw(st.floats(1.0, 30.0)), draw(st.floats(0.3, 3.0))) for _ in range(draw(st.integers(1, 5)))],
        liar_objective_s=draw(st.floats(1.0, 30.0)),
        claims=draw(st.lists(st.floats(1.5, 50.0), min_size=3, max_size=25)),
        liar_cores=draw(st.sampled_from([0.0, 0.001, 0.01])),
        throttling=draw(st.booleans()),
    )


def busy_shares(limits: dict[str, float | None], cores: float, taken: float) -> dict[str, float]:
    """Node shares busy containers get: each up to its limit, the rest of the node shared fairly."""
    left, out = max(0.0, 1.0 - taken), {}
    pending = sorted(limits, key=lambda n: math.inf if limits[n] is None else limits[n])
    while pending:
        fair = left / len(pending)
        name = pending.pop(0)
        cap = limits[name]
        out[name] = fair if cap is None else min(cap, fair)
        left -= out[name]
    return out


@given(liar_nodes())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_no_policy_raises_a_container_that_claims_slow_batches_while_idle(case):
    """The liar reports batches 1.5-50x its objective and uses (almost) no CPU; its siblings are busy up
    to their limits. Whenever the node had the CPU for the liar to use its limit, it is not raised."""
    cores = case["cores"]
    ctrl = NodeController("n1", cores, registry.build(case["policy"], {}, PolicyContext()))
    sibs = {f"s{i}": s for i, s in enumerate(case["siblings"])}
    for name, (objective_s, _) in sibs.items():
        ctrl.add(name, 0.0, cpu_total_s=0.0, objective_s=objective_s)
    ctrl.add("liar", 0.0, cpu_total_s=0.0, objective_s=case["liar_objective_s"])
    totals = dict.fromkeys([*sibs, "liar"], 0.0)
    periods = dict.fromkeys(totals, 0)
    throttled = dict.fromkeys(totals, 0)
    now_s, raises_seen = 0.0, 0
    for claim in case["claims"]:
        before = {n: t.limit for n, t in ctrl.containers.items()}
        interval_s = max(1.0, ctrl.next_round_at_s - now_s)
        liar_share = min(case["liar_cores"] / cores, before["liar"] or 1.0)
        used = busy_shares({n: before[n] for n in sibs}, cores, liar_share)
        for name, share in used.items():
            totals[name] += share * cores * interval_s
            periods[name] += int(interval_s * 10)
            if before[name] is not None and share >= before[name] * 0.999:
                throttled[name] += int(interval_s * 10)  # busy at its quota: the kernel holds it
        totals["liar"] += liar_share * cores * interval_s
        periods["liar"] += int(interval_s * 10)
        now_s += interval_s
        for name, (objective_s, ratio) in sibs.items():
            ctrl.record_latency(name, objective_s * ratio, now_s)
        ctrl.record_latency("liar", case["liar_objective_s"] * claim, now_s)
        spare = 1.0 - sum(used.values()) - liar_share
        d = ctrl.run_round(now_s, totals, {n: (periods[n], throttled[n]) for n in totals}
                           if case["throttling"] else None)
        liar = next(c for c in d.containers if c.name == "liar")
        old = before["liar"]
        if old is not None and spare >= USE_MIN * old - liar_share + 1e-9:
            assert not is_raise(old, liar.new_limit), (case["policy"], liar)
        raises_seen += is_raise(old, liar.new_limit)
    if case["policy"] != "dqoes":
        # The policies that share the node out leave the CPU they took from the liar's siblings spare.
        assert raises_seen == 0, case["policy"]


def test_the_kernels_throttling_counters_tell_a_held_back_container_from_an_idle_one():
    """Same claims, same CPU use (a fifth of its limit, the node half idle); only the counters differ."""

    def second_round(counters):
        ctrl = NodeController("n1", 4.0, registry.build("dqoes", {}, PolicyContext()))
        for name, objective_s in (("slow", 10.0), ("fast", 100.0)):
            ctrl.add(name, 0.0, cpu_total_s=0.0, objective_s=objective_s, limit=0.5)
        ctrl.run_round(0.0, {"slow": 0.0, "fast": 0.0}, counters(0))
        ctrl.record_latency("slow", 20.0, 10.0)  # in B: twice its objective
        ctrl.record_latency("fast", 10.0, 10.0)  # in G: R_G > 0, so DQoES raises the slow one
        d = ctrl.run_round(10.0, {"slow": 4.0, "fast": 16.0}, counters(100))  # 0.1 and 0.4 of the node
        return next(c for c in d.containers if c.name == "slow")

    idle = second_round(lambda periods: {"slow": (periods, 0), "fast": (periods, periods)})
    assert idle.old_limit == idle.new_limit == 0.5 and idle.reason.startswith("raise held")
    throttled = second_round(lambda periods: {"slow": (periods, periods // 2), "fast": (periods, periods)})
    assert throttled.new_limit > 0.5 and throttled.reason == "B: grow"
    unmeasured = second_round(lambda periods: None)
    assert unmeasured.new_limit == 0.5  # no counters: judged on its use, a fifth of its limit
