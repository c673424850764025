"""Reasons as data (shared/core/learned/reason.py): the kind and numbers a round gives each container,
and the text rendered from them, byte for byte what the learned policy's reasons have always read."""

from __future__ import annotations

import math
import random

import pytest

from shared.core.learned import Curve, FitFacts, LearnedPolicy, Plan, PlanKind, Reason, Solution
from shared.core.types import ContainerView, NodeView


def _curve(n: int, k: float, noise_sd: float, seed: int = 1) -> Curve:
    """A curve that took n batches of log L = log 10 - k log c + N(0, noise_sd) at limits 0.5-4 cores."""
    rng = random.Random(seed)
    c = Curve()
    for i in range(n):
        x = math.log((0.5, 1.0, 2.0, 4.0)[i % 4])
        c.add(x, math.log(10.0) - k * x + rng.gauss(0.0, noise_sd), 1.0, (1.0, 1.0))
    return c


# Reasons as numbers, and the text the policy gave for them before reasons were data.
RENDERED = [
    (Reason(PlanKind.IN_BAND), "learned: in band (no clean batch yet)"),
    (Reason(PlanKind.TOO_FAST, chance=True), "learned: too fast, given what is left for a chance (no clean batch yet)"),
    (Reason(PlanKind.NO_ROOM), "learned: no room (no clean batch yet)"),
    (Reason(PlanKind.UNACHIEVABLE, chance=True),
     "learned: unachievable, given what is left for a chance (no clean batch yet)"),
    (Reason(PlanKind.LEARNING), "learned: learning (no clean batch yet)"),
    (Reason(PlanKind.IN_BAND, fit=FitFacts(1.357837548625905, 0.0791902751243363, 12)),
     "learned: in band (k 1.36, noise 0.08, 12 batches)"),
    (Reason(PlanKind.NO_ROOM, chance=True, fit=FitFacts(1.357837548625905, 0.0791902751243363, 12)),
     "learned: no room, given what is left for a chance (k 1.36, noise 0.08, 12 batches)"),
    (Reason(PlanKind.IN_BAND, fit=FitFacts(0.8286565524727626, 0.08008439561041811, 40, replicas_sd=0.3)),
     "learned: in band (k 0.83, noise 0.08, 40 batches, its replicas' curve ±0.30)"),
    (Reason(PlanKind.NO_ROOM, chance=True, fit=FitFacts(0.8547302823914336, 0.0934637764393357, 7, steps=True)),
     "learned: no room, given what is left for a chance (k 0.85, noise 0.09, 7 batches, whole cores above one: "
     "its threads follow the limit)"),
    (Reason(PlanKind.UNACHIEVABLE, fit=FitFacts(0.8943648224227017, 0.17790681002066833, 20, replicas_sd=0.5,
                                                steps=True)),
     "learned: unachievable (k 0.89, noise 0.18, 20 batches, its replicas' curve ±0.50, whole cores above one: "
     "its threads follow the limit)"),
    (Reason(PlanKind.LEARNING, fit=FitFacts(1.0, 0.05, 0, replicas_sd=0.2, steps=True)),
     "learned: learning (k 1.00, noise 0.05, 0 batches, its replicas' curve ±0.20, whole cores above one: "
     "its threads follow the limit)"),
]


@pytest.mark.parametrize(("reason", "text"), RENDERED)
def test_a_reason_renders_the_text_it_always_had(reason, text):
    assert reason.text() == text


# A curve as the policy sees it, and the text the policy gave for it before reasons were data.
FROM_CURVES = [
    # (plan kind, chance, batches, replicas' variance, threads follow the limit, text)
    (PlanKind.IN_BAND, False, 0, None, False, "learned: in band (no clean batch yet)"),
    (PlanKind.TOO_FAST, False, 12, None, False, "learned: too fast (k 1.36, noise 0.08, 12 batches)"),
    (PlanKind.UNACHIEVABLE, True, 12, None, False,
     "learned: unachievable, given what is left for a chance (k 1.36, noise 0.08, 12 batches)"),
    (PlanKind.IN_BAND, False, 40, 0.09, False,
     "learned: in band (k 0.83, noise 0.08, 40 batches, its replicas' curve ±0.30)"),
    (PlanKind.NO_ROOM, True, 7, None, True,
     "learned: no room, given what is left for a chance (k 0.85, noise 0.09, 7 batches, whole cores above one: "
     "its threads follow the limit)"),
    (PlanKind.UNACHIEVABLE, False, 20, 0.25, True,
     "learned: unachievable (k 0.89, noise 0.18, 20 batches, its replicas' curve ±0.50, whole cores above one: "
     "its threads follow the limit)"),
    (PlanKind.TOO_FAST, False, 3, None, True,
     "learned: too fast (k 0.89, noise 0.05, 3 batches, whole cores above one: its threads follow the limit)"),
    (PlanKind.LEARNING, False, 0, 0.04, True,
     "learned: learning (k 1.00, noise 0.05, 0 batches, its replicas' curve ±0.20, whole cores above one: "
     "its threads follow the limit)"),
]


@pytest.mark.parametrize(("kind", "chance", "n", "replicas_var", "steps", "text"), FROM_CURVES)
def test_a_reason_taken_from_a_curve_carries_its_fit_and_renders_as_before(kind, chance, n, replicas_var, steps,
                                                                           text):
    c = _curve(n, k=1.3 if n == 12 else 0.8, noise_sd=0.2 if n == 20 else 0.1)
    if replicas_var is not None:
        c.node.height = (0.0, math.log(10.0), replicas_var)
    c.steps = steps
    reason = Reason.of(Plan(0.5, kind), c, chance)
    assert (reason.kind, reason.chance) == (kind, chance)
    fit = c.solve()
    if fit is None:
        assert reason.fit is None
    else:
        assert reason.fit == FitFacts(fit.k, fit.noise_sd, n,
                                      math.sqrt(replicas_var) if replicas_var is not None else None, steps)
    assert reason.text() == text


def test_every_kind_a_plan_can_end_with_has_its_own_words():
    returned = [k for k in PlanKind if k is not PlanKind.CANDIDATE]
    texts = {Reason(k).text() for k in returned}
    assert len(texts) == len(returned)
    assert all(str(k) in Reason(k).text() for k in returned)


def test_a_round_keeps_each_reason_as_data_and_the_decision_carries_its_text():
    plans = {"a": Plan(0.5, PlanKind.IN_BAND), "b": Plan(0.25, PlanKind.NO_ROOM), "c": Plan(0.25, PlanKind.LEARNING)}
    policy = LearnedPolicy(solver=lambda *_: Solution(dict(plans), {"a"}, {"b"}))
    views = tuple(ContainerView(name=n, objective_s=10.0, alpha=0.1, latency_s=None, last_latency_s=None,
                                cpu_share=None, limit=0.3, batches=()) for n in plans)
    d = policy.decide(NodeView(node="n1", cores=4.0, now_s=100.0, containers=views))
    assert {n: (r.kind, r.chance, r.fit) for n, r in policy.reasons.items()} == {
        "a": (PlanKind.IN_BAND, False, None), "b": (PlanKind.NO_ROOM, True, None),
        "c": (PlanKind.LEARNING, False, None)}
    assert {c.name: c.reason for c in d.containers} == {n: r.text() for n, r in policy.reasons.items()}
