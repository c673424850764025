"""FlowCon's Algorithms 1-4 and the training tracker, with explicit times (no clock, no sleeps)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core import registry
from shared.core.flowcon import FlowConParams, FlowConPolicy, place, score, threshold, transition
from shared.core.training import (
    JobReport,
    JobView,
    Stage,
    TrainingTracker,
    TrainingView,
    WorkerReport,
    check_value,
    growth_efficiency,
    progress_per_s,
)
from shared.core.training_baseline import TrainingDefaultPolicy, spread

NL, WL, CL = Stage.NL, Stage.WL, Stage.CL


def job(name: str, growth: float | None, limit: float | None = 1.0, stale: bool = False,
        cpu: float = 1.0) -> JobView:
    """A job whose (relative) growth is `growth` at `cpu` cores: first value 1, so relative == raw."""
    return JobView(name=name, value=1.0, progress=None if growth is None else growth * cpu,
                   cpu_cores=cpu if growth is not None else None,
                   growth=growth, limit=limit, stale=stale, reports=3, first_value=1.0)


def view(t: float, jobs: list[JobView], cores: float = 4.0, arrived=(), departed=()) -> TrainingView:
    return TrainingView(node="w1", now_s=t, cores=cores, jobs=tuple(jobs), arrived=tuple(arrived),
                        departed=tuple(departed))


# --- Eq. 1 and 2, the tracker -------------------------------------------------------------------

def test_progress_and_growth_efficiency():
    assert progress_per_s(2.0, 1.5, 10.0) == pytest.approx(0.05)
    assert progress_per_s(1.5, 2.0, 10.0) == pytest.approx(0.05)  # |dE|: a rising accuracy counts too
    assert progress_per_s(1.0, 0.5, 0.0) is None
    assert growth_efficiency(0.05, 2.0) == pytest.approx(0.025)
    assert growth_efficiency(0.05, 0.0) is None  # no CPU: no G, never an infinite one
    assert growth_efficiency(None, 1.0) is None


@pytest.mark.parametrize("bad,why", [(float("nan"), "NaN"), (float("inf"), "infinite"), (-1.0, "negative"),
                                     (None, "no value"), ("0.3", "not a number"), (True, "not a number")])
def test_bad_values_are_refused_with_a_reason(bad, why):
    assert why in check_value(bad)
    tr = TrainingTracker("w1", 2.0)
    tr.start("j", 0.0)
    tr.record_value("j", 1.0, 0.0)
    msg = tr.record_value("j", bad, 5.0)
    assert msg is not None and why in msg
    v = tr.view(10.0, {"j": 0.0})
    assert v.jobs[0].value == 1.0  # the bad value changed nothing


def test_tracker_measures_progress_cpu_and_growth_between_rounds():
    tr = TrainingTracker("w1", 4.0)
    tr.start("j", 0.0)
    tr.record_value("j", 2.0, 0.0)
    v0 = tr.view(0.0, {"j": 0.0})
    assert v0.arrived == ("j",) and v0.jobs[0].progress is None and v0.jobs[0].cpu_cores is None
    tr.record_value("j", 1.8, 5.0)
    tr.record_value("j", 1.0, 10.0)
    v1 = tr.view(10.0, {"j": 20.0})
    j = v1.jobs[0]
    assert j.progress == pytest.approx(0.1)  # |1.0 - 2.0| / (10 - 0)
    assert j.cpu_cores == pytest.approx(2.0)  # 20 CPU-s over 10 s
    assert j.growth == pytest.approx(0.05)
    assert v1.arrived == ()
    v2 = tr.view(20.0, {"j": 30.0})  # no new value: not measured, not zero
    assert v2.jobs[0].progress is None and v2.jobs[0].growth is None and v2.jobs[0].cpu_cores == pytest.approx(1.0)


def test_tracker_arrivals_departures_and_stale_jobs():
    tr = TrainingTracker("w1", 4.0, stale_after_s=30.0)
    tr.start("a", 0.0)
    tr.record_value("a", 1.0, 0.0)
    tr.view(0.0, {})
    tr.start("b", 5.0)
    tr.stop("a")
    v = tr.view(10.0, {})
    assert v.arrived == ("b",) and v.departed == ("a",)
    tr.start("c", 11.0)
    tr.stop("c")  # came and went between two rounds: neither
    v = tr.view(12.0, {})
    assert v.arrived == () and v.departed == ()
    assert tr.newly_stale(35.0) == ()  # b started at 5 s: 30 s not yet exceeded
    assert tr.newly_stale(36.0) == ("b",)
    assert tr.newly_stale(50.0) == ()  # reported once
    assert tr.view(50.0, {}).jobs[0].stale
    tr.record_value("b", 0.5, 51.0)
    assert not tr.view(52.0, {}).jobs[0].stale


def test_a_value_from_an_unknown_job_starts_it():
    tr = TrainingTracker("w1", 2.0)
    assert tr.record_value("x", 0.7, 3.0) is None
    assert tr.view(4.0, {}).arrived == ("x",)


# --- Algorithm 1: each list transition ---------------------------------------------------------

@pytest.mark.parametrize("before,g,alpha,after", [
    (NL, 0.5, 1.0, WL), (WL, 0.5, 1.0, CL), (CL, 0.5, 1.0, CL),
    (NL, 1.0, 1.0, NL), (WL, 2.0, 1.0, NL), (CL, 1.5, 1.0, NL),
])
def test_transitions(before, g, alpha, after):
    assert transition(before, g, alpha) is after


def test_rounds_walk_a_job_down_the_lists_and_set_limits():
    p = FlowConPolicy(FlowConParams(initial_interval_s=10.0))
    d = p.decide(view(0.0, [job("a", None), job("b", None)], arrived=("a", "b")))
    assert d.stages() == {"a": "NL", "b": "NL"} and d.limits() == {"a": 1.0, "b": 1.0}
    # t=10: alpha = (mean NL G (1.0 + 0.2)/2 = 0.6 + 0) / 2 = 0.3: a stays NL, b drops to WL keeping limit 1
    d = p.decide(view(10.0, [job("a", 1.0), job("b", 0.2)]))
    assert d.alpha == pytest.approx(0.3)
    assert d.stages() == {"a": "NL", "b": "WL"} and d.limits() == {"a": 1.0, "b": 1.0}
    assert d.interval_s == 10.0
    # t=20: alpha = (1.0 + 0.1) / 2 = 0.55: b goes WL -> CL with max(G/sum G, one core of 4)
    d = p.decide(view(20.0, [job("a", 1.0), job("b", 0.1)]))
    assert d.stages() == {"a": "NL", "b": "CL"}
    assert d.limits()["b"] == pytest.approx(0.25)  # 0.1/1.1 = 0.09 < 1/4 core floor
    assert d.limits()["a"] == 1.0
    # t=30: b's growth rises above alpha: back to NL with the whole node
    d = p.decide(view(30.0, [job("a", 0.4), job("b", 0.5, limit=0.25)]))
    assert d.stages()["b"] == "NL" and d.limits()["b"] == 1.0


def test_cl_limit_is_its_share_of_growth_above_the_floor():
    p = FlowConPolicy(FlowConParams(cl_floor="per-container"))
    p.stages = {"a": NL, "b": WL, "c": CL}
    p.limits = {"a": 1.0, "b": 0.7, "c": 1.0}
    # alpha = (1.0 + 0.8)/2 = 0.9: a stays NL (1.0), b to CL (0.8 < 0.9), c stays CL
    d = p.decide(view(10.0, [job("a", 1.0), job("b", 0.8, limit=0.7), job("c", 0.6)], cores=4.0))
    assert d.stages() == {"a": "NL", "b": "CL", "c": "CL"}
    assert d.limits()["b"] == pytest.approx(0.8 / 2.4)
    assert d.limits()["c"] == pytest.approx(1 / 3)  # 0.6/2.4 = 0.25 < 1/|c| = 1/3


def test_wl_limit_is_left_unchanged():
    p = FlowConPolicy()
    p.stages = {"a": NL, "b": WL}
    p.limits = {"a": 1.0, "b": 0.4}
    d = p.decide(view(10.0, [job("a", 1.0), job("b", 0.5, limit=0.4)]))  # alpha (1 + .5)/2 = .75: b -> CL
    assert d.stages()["b"] == "CL"
    p2 = FlowConPolicy()
    p2.stages = {"a": NL, "b": NL}
    p2.limits = {"a": 1.0, "b": 0.6}
    d = p2.decide(view(10.0, [job("a", 1.0), job("b", 0.2, limit=0.6)]))  # b NL -> WL keeps 0.6
    assert d.stages()["b"] == "WL" and d.limits()["b"] == 0.6


# --- all CL: free competition, interval doubling; Algorithm 1 off while alpha is -1 -------------

def test_all_cl_free_competition_doubles_the_interval_up_to_the_cap():
    p = FlowConPolicy(FlowConParams(initial_interval_s=10.0, max_interval_s=50.0))
    p.stages = {"a": WL, "b": CL}
    p.limits = {"a": 1.0, "b": 0.25}
    # alpha from progress: WL alone, P_a = 0.2 -> alpha 0.1; G_a = 0.2 / 3 cores < 0.1: WL -> CL;
    # b (G 0.075 < 0.1) stays CL: everyone in CL
    d = p.decide(view(0.0, [job("a", 0.2 / 3, cpu=3.0), job("b", 0.075, limit=0.25, cpu=4.0)]))
    assert d.free_competition and d.limits() == {"a": 1.0, "b": 1.0}
    assert d.alpha == -1 and d.interval_s == 20.0
    # Algorithm 1 is off while alpha is -1: even a high G does not move a job back
    d = p.decide(view(20.0, [job("a", 5.0), job("b", 5.0)]))
    assert d.stages() == {"a": "CL", "b": "CL"} and d.interval_s == 40.0
    d = p.decide(view(60.0, [job("a", 5.0), job("b", 5.0)]))
    assert d.interval_s == 50.0  # capped


# --- Algorithm 2: arrivals and departures reset the interval -----------------------------------

def test_arrival_during_free_competition_resets_and_prioritises_the_newcomer():
    p = FlowConPolicy(FlowConParams(initial_interval_s=10.0))
    p.stages = {"a": CL, "b": CL}
    p.limits = {"a": 1.0, "b": 1.0}
    p.alpha, p.interval_s = -1.0, 80.0
    p.last_growth = {"a": 0.1, "b": 0.3}
    d = p.decide(view(100.0, [job("a", 0.1), job("b", 0.3), job("c", None, limit=None)], arrived=("c",)))
    assert d.interval_s == 10.0 and not d.free_competition
    assert d.stages() == {"a": "CL", "b": "CL", "c": "NL"}
    assert d.limits()["c"] == 1.0
    assert d.limits()["a"] == pytest.approx(0.25) and d.limits()["b"] == pytest.approx(0.75)


def test_departure_forgets_the_job_and_resets_the_interval():
    p = FlowConPolicy(FlowConParams(initial_interval_s=10.0))
    p.stages = {"a": CL, "b": NL}
    p.limits = {"a": 0.25, "b": 1.0}
    p.interval_s = 40.0
    d = p.decide(view(50.0, [job("a", None, limit=0.25)], departed=("b",)))
    assert "b" not in p.stages and "b" not in p.limits
    assert d.stages() == {"a": "CL"} and d.free_competition and d.limits() == {"a": 1.0}
    assert d.interval_s == 20.0  # reset to 10, then doubled by the all-CL round (Algorithm 2 runs Algorithm 1)


def test_stale_and_unmeasured_jobs_keep_their_list_and_limit():
    p = FlowConPolicy()
    p.stages = {"a": NL, "b": CL}
    p.limits = {"a": 1.0, "b": 0.4}
    d = p.decide(view(10.0, [job("a", 1.0), job("b", 0.001, limit=0.4, stale=True)]))
    assert d.stages()["b"] == "CL" and d.limits()["b"] == 0.4
    assert "stale" in {j.name: j.reason for j in d.jobs}["b"]


# --- Algorithm 3: the adaptive threshold -------------------------------------------------------

def test_threshold_from_growth_never_lets_the_last_growing_job_complete():
    """The note in docs/design/flowcon.md: averaging G, the last job outside CL is always >= alpha."""
    p = FlowConPolicy(FlowConParams(threshold_from="growth"))
    p.stages = {"a": WL, "b": CL}
    p.limits = {"a": 1.0, "b": 0.25}
    d = p.decide(view(0.0, [job("a", 0.2 / 3, cpu=3.0), job("b", 0.075, limit=0.25, cpu=4.0)]))
    assert d.stages()["a"] == "NL" and not d.free_competition


def test_threshold_cases():
    assert threshold({"a": CL, "b": CL}, {"a": 1.0}, {}, 0.0) == -1
    assert threshold({"a": NL}, {"a": 0.2}, {"a": 0.6}, 0.0) == pytest.approx(0.3)  # half the previous
    assert threshold({"a": NL}, {"a": 0.2}, {}, 0.05) == 0.05  # no previous: fallback
    assert threshold({"a": NL, "b": NL, "c": WL}, {"a": 1.0, "b": 3.0, "c": 1.0}, {}, 0.0) == pytest.approx(1.5)
    assert threshold({"a": NL, "b": CL}, {"a": 0.8, "b": 0.1}, {}, 0.0) == pytest.approx(0.4)  # NL alone: half
    assert threshold({"a": NL, "b": CL}, {"b": 0.1}, {}, 0.7) == 0.7  # nothing measured in NL/WL


def test_single_job_threshold_follows_its_own_previous_growth():
    p = FlowConPolicy()
    p.decide(view(0.0, [job("a", None)], arrived=("a",)))
    d = p.decide(view(10.0, [job("a", 1.0)]))  # no previous G: fallback 0 -> NL
    assert d.stages() == {"a": "NL"}
    d = p.decide(view(20.0, [job("a", 0.6)]))  # alpha 0.5: 0.6 stays NL
    assert d.alpha == pytest.approx(0.5) and d.stages() == {"a": "NL"}
    d = p.decide(view(30.0, [job("a", 0.2)]))  # alpha 0.3: -> WL
    assert d.stages() == {"a": "WL"} and d.limits() == {"a": 1.0}


def test_relative_progress_compares_jobs_on_different_scales():
    big = JobView("vae", 200.0, 2.0, 1.0, 2.0, 1.0, reports=3, first_value=250.0)
    small = JobView("cnn", 1.0, 0.1, 1.0, 0.1, 1.0, reports=3, first_value=2.3)
    rel = FlowConPolicy(FlowConParams(relative_progress=True))
    d = rel.decide(view(10.0, [big, small], arrived=("vae", "cnn")))
    g = {j.name: j.growth for j in d.jobs}
    assert g["vae"] == pytest.approx(2.0 / 250) and g["cnn"] == pytest.approx(0.1 / 2.3)
    raw = FlowConPolicy(FlowConParams(relative_progress=False))
    g = {j.name: j.growth for j in raw.decide(view(10.0, [big, small], arrived=("vae", "cnn"))).jobs}
    assert g == {"vae": 2.0, "cnn": 0.1}


def test_params_are_validated():
    for bad in ({"initial_interval_s": 0}, {"max_interval_s": 1.0}, {"initial_alpha": -1},
                {"initial_alpha": math.nan}, {"cl_floor": "none"}, {"relative_progress": "yes"}):
        with pytest.raises(ValueError):
            FlowConParams(**bad)


# --- Algorithm 4: placement, with stale reports -----------------------------------------------

def rep(node: str, *jobs: tuple[str, float | None]) -> WorkerReport:
    return WorkerReport(node, 0.0, 4.0, tuple(JobReport(f"{node}-{i}", s, g) for i, (s, g) in enumerate(jobs)))


def test_a_worker_whose_jobs_all_complete_wins_fewest_first():
    reports = {"w1": rep("w1", ("NL", 0.1)), "w2": rep("w2", ("CL", 0.5), ("CL", 0.5)), "w3": rep("w3", ("CL", 0.9))}
    assert place(reports)[0] == "w3"
    reports["w4"] = rep("w4")  # an idle worker: vacuously all CL, no jobs
    assert place(reports)[0] == "w4"


def test_score_formula_and_lowest_score_wins():
    r = rep("w1", ("NL", 0.2), ("NL", 0.3), ("WL", 0.1), ("CL", 0.05), ("CL", 0.05))
    assert score(r, 0, 1.0) == pytest.approx(3 * 0.5 + 1 * 0.1 + 2 * 0.1)
    reports = {"w1": r, "w2": rep("w2", ("NL", 0.9), ("CL", 0.1))}
    # w2: (1+1)*0.9 + 1*0.1 = 1.9 ; w1: 1.8
    node, why = place(reports)
    assert node == "w1" and "lowest score" in why


def test_stale_reports_count_the_jobs_placed_since_as_fast_growing():
    reports = {"w1": rep("w1", ("NL", 0.1)), "w2": rep("w2", ("NL", 0.15))}
    assert place(reports, {})[0] == "w1"
    # one job placed on w1 since its report: it counts as NL with the largest known G (0.15)
    assert score(reports["w1"], 1, 0.15) == pytest.approx(3 * 0.25)
    assert place(reports, {"w1": 1})[0] == "w2"
    # an all-CL worker that just received a job is no longer "all completing"
    reports = {"w1": rep("w1", ("CL", 0.1)), "w2": rep("w2", ("NL", 0.01))}
    assert place(reports, {})[0] == "w1"
    assert place(reports, {"w1": 1})[0] == "w2"


def test_no_workers_is_an_error():
    with pytest.raises(ValueError):
        place({})
    with pytest.raises(ValueError):
        spread({})


# --- the baseline and the registry ---------------------------------------------------------------

def test_default_never_limits_and_spreads():
    p = TrainingDefaultPolicy()
    d = p.decide(view(0.0, [job("a", 0.5, limit=None), job("b", 0.1, limit=None)], arrived=("a", "b")))
    assert d.limits() == {"a": None, "b": None} and not d.free_competition
    reports = {"w1": rep("w1", ("-", 1.0)), "w2": rep("w2", ("-", 0.1), ("-", 0.1))}
    assert spread(reports)[0] == "w1"
    assert spread(reports, {"w1": 2})[0] == "w2"


def test_registry_kinds():
    assert registry.names("training") == ("flowcon", "default")
    assert "flowcon" not in registry.names("inference")
    assert registry.training_spec("flowcon").kind == "training"
    assert isinstance(registry.build_training("flowcon", {"initial_interval_s": 5, "alpha": 0.3}), FlowConPolicy)
    with pytest.raises(ValueError, match="flowcon"):
        registry.training_spec("dqoes")
    with pytest.raises(ValueError):
        registry.build_training("flowcon", {"initial_interval_s": -1})


# --- properties -------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["NL", "WL", "CL"]), st.one_of(st.none(), st.floats(0, 10)),
                          st.floats(0.05, 1.0)), min_size=1, max_size=12),
       st.sampled_from(["one-core", "per-container"]), st.floats(1.0, 32.0))
def test_limits_stay_within_floor_and_node(spec, floor_mode, cores):
    p = FlowConPolicy(FlowConParams(cl_floor=floor_mode))
    names = [f"j{i}" for i in range(len(spec))]
    p.stages = {n: Stage(s) for n, (s, _, _) in zip(names, spec, strict=True)}
    p.limits = {n: lim for n, (_, _, lim) in zip(names, spec, strict=True)}
    d = p.decide(view(10.0, [job(n, g, limit=lim) for n, (_, g, lim) in zip(names, spec, strict=True)], cores=cores))
    floor = 1 / len(spec) if floor_mode == "per-container" else min(1.0, 1 / cores)
    for j in d.jobs:
        assert 0 < j.new_limit <= 1.0
        if j.stage == "NL" or d.free_competition:
            assert j.new_limit == 1.0
        if j.stage == "CL" and not d.free_competition and j.growth is not None:
            assert j.new_limit >= floor - 1e-12
    assert d.free_competition == all(j.stage == "CL" for j in d.jobs)
