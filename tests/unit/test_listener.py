"""Algorithm 2, the adaptive listener, driven round by round with explicit values."""

from __future__ import annotations

import pytest

from shared.core.dqoes import DQoESParams, ListenerState, listener_step

P = DQoESParams(initial_interval_s=10.0, max_interval_s=80.0)


def run(rounds, params=P):
    """rounds: (Q_G, Q_B, |S|, event) tuples; returns the intervals and reasons after each."""
    st = ListenerState(params.initial_interval_s)
    out = []
    for q_g, q_b, s, ev in rounds:
        st, why = listener_step(st, q_g, q_b, s, params, ev)
        out.append((st.interval_s, why))
    return out


def test_doubles_after_exactly_three_converging_rounds():
    out = run([(50, -50, 0, None), (40, -40, 1, None), (30, -30, 2, None), (20, -20, 3, None)])
    assert [iv for iv, _ in out] == [10, 10, 10, 20]
    assert out[1][1] == "converging (1/3)"
    assert out[2][1] == "converging (2/3)"
    assert out[3][1].startswith("doubled")


def test_two_converging_rounds_then_a_bounce_do_not_double():
    out = run([(50, -50, 0, None), (40, -40, 0, None), (30, -30, 0, None), (35, -30, 0, None), (30, -25, 0, None)])
    assert [iv for iv, _ in out] == [10, 10, 10, 10, 10]
    assert out[3][1] == "kept"
    assert out[4][1] == "converging (1/3)"


def test_keeps_doubling_up_to_the_cap():
    rounds = [(100 - i, -100 + i, 0, None) for i in range(13)]
    ivs = [iv for iv, _ in run(rounds)]
    assert ivs == [10, 10, 10, 20, 20, 20, 40, 40, 40, 80, 80, 80, 80]


def test_resets_on_a_drop_in_satisfied():
    rounds = [(50, -50, 3, None), (40, -40, 3, None), (30, -30, 3, None), (20, -20, 3, None), (10, -10, 2, None)]
    out = run(rounds)
    assert out[3][0] == 20
    assert out[4] == (10, "reset: |S| dropped 3->2")


def test_drop_wins_over_convergence():
    # Q_G falls and Q_B rises, but |S| fell: the stable state is broken.
    out = run([(50, -50, 5, None), (40, -40, 4, None)])
    assert out[1][1].startswith("reset")


def test_halve_mode_of_the_arxiv_version():
    p = DQoESParams(initial_interval_s=10.0, max_interval_s=80.0, on_drop="halve")
    rounds = [(100 - i, -100 + i, 3, None) for i in range(7)] + [(50, -50, 1, None)]
    out = run(rounds, p)
    assert out[6][0] == 40
    assert out[7] == (20, "halve: |S| dropped 3->1")


def test_events_reset_at_once():
    rounds = [(50, -50, 3, None), (40, -40, 3, None), (30, -30, 3, None), (20, -20, 3, None)]
    for ev in ("added", "removed", "objective"):
        out = run(rounds + [(10, -10, 4, ev)])
        assert out[-1] == (10, f"reset: {ev}")


def test_all_satisfied_counts_as_converged():
    # Q_G = Q_B = 0 and staying there: nothing left to converge, so back off.
    out = run([(0, 0, 10, None)] * 4)
    assert [iv for iv, _ in out] == [10, 10, 10, 20]


def test_stuck_nonzero_q_is_not_convergence():
    out = run([(20, -20, 5, None)] * 5)
    assert {iv for iv, _ in out} == {10}
    assert [w for _, w in out][1:] == ["kept"] * 4


@pytest.mark.parametrize("bad", [{"alpha": 0}, {"alpha": 1}, {"beta": -0.1}, {"initial_interval_s": 0},
                                 {"max_interval_s": 5}, {"on_drop": "double"}, {"total_resource": 1.5}])
def test_params_are_validated(bad):
    with pytest.raises(ValueError):
        DQoESParams(**bad)
