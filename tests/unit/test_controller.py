"""NodeController: CPU counters to shares, events to immediate rounds, with explicit times."""

from __future__ import annotations

import math

import pytest

from shared.core.baselines import DefaultPolicy
from shared.core.controller import NodeController
from shared.core.dqoes import DQoESParams, DQoESPolicy
from shared.core.types import Cls


def ctrl(cores=4.0, **params):
    return NodeController("n1", cores, DQoESPolicy(DQoESParams(**params)))


def test_cpu_counter_deltas_become_node_shares():
    c = ctrl(cores=4.0)
    c.add("a", 0.0, cpu_total_s=0.0, objective_s=40)
    c.run_round(0.0, {"a": 0.0})
    c.record_latency("a", 30.0)
    d = c.run_round(10.0, {"a": 8.0})  # 8 CPU-s in 10 s on 4 cores = 0.2 of the node
    assert d.containers[0].cpu_share == pytest.approx(0.2)


def test_same_instant_round_keeps_previous_share():
    c = ctrl()
    c.add("a", 0.0, cpu_total_s=0.0, objective_s=40)
    c.run_round(10.0, {"a": 8.0})
    c.set_objective("a", 30, 10.0)
    d = c.run_round(10.0, {"a": 8.0})
    assert d.containers[0].cpu_share == pytest.approx(0.2)


def test_events_make_a_round_due_at_once_and_reset_the_listener():
    c = ctrl()
    c.add("a", 0.0, cpu_total_s=0.0, objective_s=40)
    assert c.due(0.0)
    d = c.run_round(0.0, {"a": 0.0})
    assert d.event == "added" and c.next_round_at_s == 10.0
    assert not c.due(5.0)
    c.add("b", 5.0, cpu_total_s=0.0, objective_s=20)
    assert c.due(5.0)
    d = c.run_round(5.0, {"a": 2.0, "b": 0.0})
    assert d.event == "added" and d.listener == "reset: added"
    c.remove("b", 7.0)
    assert c.due(7.0)
    assert c.run_round(7.0, {"a": 3.0}).event == "removed"
    c.set_objective("a", 35, 8.0)
    assert c.run_round(8.0, {"a": 3.5}).event == "objective"


def test_unmanaged_containers_are_not_policy_business():
    c = ctrl()
    c.add("plain", 0.0, cpu_total_s=0.0)
    assert not c.due(-1.0) or c.managed == []
    d = c.run_round(0.0, {"plain": 0.0})
    assert d.containers == ()
    c.set_objective("plain", 40, 1.0)
    assert [t.name for t in c.managed] == ["plain"]


def test_dqoes_round_sets_and_remembers_limits():
    c = ctrl(cores=2.0)
    for n, o in (("fast", 60.0), ("slow", 10.0)):
        c.add(n, 0.0, cpu_total_s=0.0, objective_s=o)
    c.run_round(0.0, {"fast": 0.0, "slow": 0.0})
    c.record_latency("fast", 30.0)  # q = 30: G
    c.record_latency("slow", 20.0)  # q = -10: B
    d = c.run_round(10.0, {"fast": 10.0, "slow": 10.0})  # each used half the node
    by = {x.name: x for x in d.containers}
    assert by["fast"].cls is Cls.G and by["slow"].cls is Cls.B
    assert by["fast"].new_limit == pytest.approx(0.5 - 1.0 * 0.5 * 0.1)
    assert by["slow"].new_limit == pytest.approx(0.5 + 1.0 * 0.5 * 0.1)
    assert c.containers["fast"].limit == by["fast"].new_limit
    # Next round without new batches: classes carried, limits kept.
    d2 = c.run_round(20.0, {"fast": 19.5, "slow": 20.5})
    assert {x.name: x.new_limit for x in d2.containers} == {"fast": by["fast"].new_limit, "slow": by["slow"].new_limit}
    assert {x.name: x.cls for x in d2.containers} == {"fast": Cls.G, "slow": Cls.B}


def test_default_policy_never_sets_limits():
    c = NodeController("n1", 2.0, DefaultPolicy())
    c.add("a", 0.0, cpu_total_s=0.0, objective_s=10)
    c.record_latency("a", 30.0)
    d = c.run_round(10.0, {"a": 15.0})
    assert d.containers[0].new_limit is None and d.containers[0].cls is Cls.B


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "40", True])
def test_bad_objectives_are_refused_and_change_nothing(bad):
    c = ctrl()
    c.add("a", 0.0, objective_s=40)
    with pytest.raises(ValueError):
        c.set_objective("a", bad, 1.0)
    assert c.containers["a"].objective_s == 40


@pytest.mark.parametrize("bad", [0, 1, -0.1, math.nan, "0.1"])
def test_bad_alphas_are_refused(bad):
    c = ctrl()
    c.add("a", 0.0, objective_s=40)
    with pytest.raises(ValueError):
        c.set_objective("a", 30, 1.0, alpha=bad)
    assert (c.containers["a"].objective_s, c.containers["a"].alpha) == (40, None)


def test_unknown_container_objective_is_a_key_error():
    with pytest.raises(KeyError):
        ctrl().set_objective("ghost", 40, 0.0)


def test_nonsense_latencies_are_ignored():
    c = ctrl()
    c.add("a", 0.0, objective_s=40)
    for bad in (0.0, -1.0, math.nan, math.inf):
        assert not c.record_latency("a", bad)
    assert not c.record_latency("ghost", 3.0)
    assert c.containers["a"].new_latency_s is None


def test_per_container_alpha_overrides_the_default():
    c = ctrl()
    c.add("wide", 0.0, cpu_total_s=0.0, objective_s=40, alpha=0.5)
    c.record_latency("wide", 25.0)  # q = 15 < 0.5*40: satisfied with the wide band
    d = c.run_round(10.0, {"wide": 10.0})
    assert d.containers[0].cls is Cls.S


def backed_off_controller():
    """One satisfied container on a node whose listener has doubled its interval."""
    c = ctrl(initial_interval_s=10.0)
    c.add("a", 0.0, cpu_total_s=0.0, objective_s=40)
    t = 0.0
    for _ in range(5):
        t += 10.0
        c.record_latency("a", 40.0)
        d = c.run_round(t, {"a": t})
    assert d.interval_s == 20.0 and d.containers[0].cls is Cls.S
    return c, t


def test_two_out_of_band_batches_make_a_round_due_when_backed_off():
    c, t = backed_off_controller()
    assert not c.due(t + 1)
    c.record_latency("a", 60.0, now_s=t + 1)  # one noisy batch: wait for the round
    assert not c.due(t + 1)
    c.record_latency("a", 61.0, now_s=t + 2)  # confirmed: the stable state broke
    assert c.due(t + 2)
    d = c.run_round(t + 2, {"a": t + 2})
    assert d.event == "disturbance: a left S" and d.interval_s == 10.0


def test_an_in_band_batch_restarts_the_confirmation():
    c, t = backed_off_controller()
    for lat in (60.0, 40.0, 60.0):
        c.record_latency("a", lat, now_s=t + 1)
    assert not c.due(t + 1)


def test_no_early_round_at_the_initial_interval():
    c = ctrl(initial_interval_s=10.0)
    c.add("a", 0.0, cpu_total_s=0.0, objective_s=40)
    c.record_latency("a", 40.0)
    c.run_round(10.0, {"a": 10.0})
    for lat in (60.0, 61.0):
        c.record_latency("a", lat, now_s=11.0)
    assert not c.due(11.0) and c.due(20.0)


def test_a_batch_read_after_a_change_that_followed_its_end_ran_under_the_limit_before():
    # On a busy node the worker reads a batch after the round that follows its end; stamped when it
    # finished, it is attributed to the limit it ran under, whole (clean), not to the new one.
    c = NodeController("n1", 2.0, DefaultPolicy())
    c.add("a", 0.0, objective_s=4.0, limit=0.5)
    t = c.containers["a"]
    t.limit_changed(10.0, 0.5)
    t.limit = 0.3
    t.limit_changed(20.0, 0.3)
    t.limit = 0.2
    for finished_s, latency_s in ((25.0, 4.0), (19.99, 4.0), (19.99, 12.0), (9.0, 4.0)):
        c.record_latency("a", latency_s, finished_s)
    after, before, straddles, lost = t.recent
    assert (after.limit, after.clean, after.since_s, after.prev_limit) == (0.2, True, 20.0, 0.3)
    assert (before.limit, before.clean, before.since_s, before.prev_limit) == (0.3, True, 10.0, 0.5)
    # Began under 0.5, ended under 0.3 before the change to 0.2: a straddle of the change at 10 s.
    assert (straddles.limit, straddles.clean, straddles.since_s, straddles.prev_limit) == (0.3, False, 10.0, 0.5)
    # Ended before both changes kept: what it ran under is not known, never clean, no straddle to read.
    assert not lost.clean and lost.since_s == math.inf and lost.prev_limit is None


def test_a_batch_is_stamped_when_it_finished_unless_the_clocks_disagree():
    from shared.core.controller import READ_LAG_MAX_S, finished_on_clock

    assert finished_on_clock(100.0, 0.25) == 99.75
    assert finished_on_clock(100.0, 0.25, scale=10.0) == 97.5  # a simulated clock ten times wall time
    for lag_s in (None, 0.0, -0.5, READ_LAG_MAX_S + 1, math.nan, math.inf):
        assert finished_on_clock(100.0, lag_s) == 100.0


def test_a_window_is_clean_only_when_the_whole_window_ran_under_one_limit():
    """A polled window's percentile sums up `span_s` seconds: one that began before the limit
    changed mixes two limits, however short its requests; its rate rides into the view."""
    c = NodeController("n", 2.0, DefaultPolicy())
    c.add("s", 0.0, objective_s=0.1, limit=0.5)
    c.set_limit("s", 0.5)
    c.containers["s"].limit_since_s = 100.0
    assert c.record_latency("s", 0.05, 105.0, span_s=10.0, rate_per_s=12.5)
    assert c.record_latency("s", 0.05, 112.0, span_s=10.0, rate_per_s=13.0)
    assert c.record_latency("s", 0.05, 106.0)  # a batch of 50 ms: clean
    assert [b.clean for b in c.containers["s"].recent] == [False, True, True]
    assert [b.span_s for b in c.containers["s"].recent] == [10.0, 10.0, None]
    view = c.view(113.0, {})
    assert view.containers[0].request_rate_per_s == 13.0
