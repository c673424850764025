"""`dqoes experiment real` without Docker: the plan, the simulator's forecast, the rendering.

The real run itself needs Docker, root and ~25 minutes; it is a recorded
experiment (docs/results.md), not a test.
"""

from __future__ import annotations

import dataclasses
import json
import math
import xml.etree.ElementTree as ET

import pytest

from experiments import real as realexp
from experiments.calibration import LimitRun, ModelCalibration, fit_profile
from services.cli.main import main
from shared.core.profiles import BUILTIN_PROFILES, ModelProfile


def resnet_profile():
    runs = (LimitRun(None, (1.65,), (1.65,)), LimitRun(0.25, (16.4,), (4.1,)))
    return fit_profile(ModelCalibration("resnet50", runs, threads=1, batch_images=10, resolution_px=224))


def test_real_experiment_plan_and_forecast():
    profiles = {**BUILTIN_PROFILES, "resnet50": resnet_profile()}
    specs = realexp.plan_containers(5, ["resnet50", "mobilenetv2"], profiles, 2.0)
    assert [c.model for c in specs] == ["resnet50", "mobilenetv2"] * 2 + ["resnet50"]
    fastest = profiles["resnet50"].fastest_s(2.0)
    assert specs[0].objective_s == pytest.approx(round(fastest * realexp.FACTORS[0], 2))
    assert specs[0].objective_s < fastest  # the first is unachievable even alone
    sc = realexp.sim_scenario(specs, profiles, 2.0, 300)
    f = realexp.forecast(sc, "default")
    assert set(f["final"]) == {c.name for c in specs}
    # No limits: five one-thread containers share two cores.
    assert sum(v["cpu_cores"] for v in f["final"].values()) == pytest.approx(2.0, abs=0.05)
    assert f["satisfied_final"] <= f["oracle_satisfied"]
    assert realexp.plan_containers(3, ["resnet50"], profiles, 2.0, [4, 6])[2].objective_s == 4.0


def test_policies_may_name_one_policy_under_two_settings():
    runs = realexp.policy_runs("learned, learned:half_life_s=0:initial_interval_s=2,default")
    assert runs == {"learned": ("learned", {}),
                    "learned:half_life_s=0:initial_interval_s=2": ("learned", {"half_life_s": 0.0,
                                                                               "initial_interval_s": 2.0}),
                    "default": ("default", {})}
    # The label is the settings in name order, so the same run cannot be asked for twice.
    assert list(realexp.policy_runs("learned:initial_interval_s=2:half_life_s=0")) == [
        "learned:half_life_s=0:initial_interval_s=2"]
    # Settings that differ only past six digits are two runs, each labelled with all its digits.
    assert list(realexp.policy_runs("learned:half_life_s=0.1234567,learned:half_life_s=0.1234568")) == [
        "learned:half_life_s=0.1234567", "learned:half_life_s=0.1234568"]
    for bad, message in (("learned:half_life=0", "has no parameter half_life"),
                         ("learned:half_life_s=-1", "half_life_s must be"),
                         ("learned:half_life_s", "expected NAME=VALUE"),
                         ("learned:half_life_s=fast", "expected a number"),
                         ("oracle", "cannot run on real workloads"),
                         ("learned,learned", "named twice"),
                         ("learned:", "expected NAME=VALUE"),
                         (" , ", "at least one policy")):
        with pytest.raises(realexp.ExperimentError, match=message):
            realexp.policy_runs(bad)


def test_the_forecast_runs_each_policy_with_its_settings():
    specs = realexp.plan_containers(3, ["resnet50", "mobilenetv2"], BUILTIN_PROFILES, 2.0)
    sc = realexp.sim_scenario(specs, BUILTIN_PROFILES, 2.0, 300)
    (policy, settings), = realexp.policy_runs("dqoes:alpha=0.5").values()
    wide = realexp.forecast(realexp.dataclasses.replace(sc, settings={**sc.settings, **settings}), policy)
    assert wide != realexp.forecast(sc, policy)


def test_real_experiment_renders_a_summary(tmp_path, capsys):
    profiles = {**BUILTIN_PROFILES, "resnet50": resnet_profile()}
    specs = realexp.plan_containers(2, ["resnet50"], profiles, 2.0)
    sc = realexp.sim_scenario(specs, profiles, 2.0, 200)
    final = {c.name: {"latency_s": 3.0, "cls": "S", "limit": 0.25, "cpu_cores": 0.5} for c in specs}
    real = {p: {"satisfied_final": 1, "meets_final": 2, "final_window_s": 20.0, "series": [[10, 0], [50, 1]],
                "final": final, "loadavg_1m": {"min": 1, "median": 2, "max": 3}, "total_cpu_cores_final": 1.0}
            for p in ("dqoes", "default")}
    d = {"command": "dqoes experiment real", "started_at": "now", "image": "img", "cores": 2.0, "batch": 10,
         "resolution_px": 224, "duration_s": 200, "profiles": "p.toml",
         "containers": [{"name": c.name, "model": c.model, "objective_s": c.objective_s, "fastest_s": 1.0}
                        for c in specs],
         "real": real, "sim": {p: realexp.forecast(sc, p) for p in ("dqoes", "default")}}
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(d))
    md = tmp_path / "results.md"
    md.write_text("# Results\n")
    assert main(["experiment", "real", "--from", str(src), "--update", str(md), "--plot", str(tmp_path / "r.svg")]) == 0
    text = md.read_text()
    assert realexp.BEGIN in text and "| c01 | resnet50 |" in text
    # Met first, then in band; a record from before met had its name ("meets_final") reads the same.
    assert "| dqoes | 2 | 1 | 1.00 |" in text
    # Beside the plateau, each count averaged over the second half (100-200 s): in band 1 all along;
    # this record has no met series, so that mean is not made up.
    assert "| dqoes | 2 | 1 | 1.00 | - / 1.0 |" in text
    ET.fromstring((tmp_path / "r.svg").read_text())
    assert "do not hold on this machine" not in text
    # A run whose batches cost half again the profile's work: the section says the profile is off.
    work = profiles["resnet50"].work_cpu_s * 1.5
    heavier = {"resnet50": dataclasses.replace(profiles["resnet50"], work_cpu_s=work)}
    d["real"]["dqoes"]["oracle_measured_work"] = realexp.oracle_with_work(d, profiles, heavier, None)
    assert f"resnet50 measured {work:.3g} CPU-s a batch" in realexp.render_markdown(d, None)
    # A run with CPU weights from the limits says so (the command of one run with them by default does not).
    weights = "CPU weight from its limit as well as its quota"
    assert weights not in text
    assert weights in realexp.render_markdown(dict(d, cpu_weights=True), None)


def test_real_counts_come_from_each_samples_latest_batch_not_the_last_round():
    # The worker's class for c1 is from its last round (late then); its latest batch is in band now.
    state = {"t_s": 10.0, "satisfied": 0, "round": 3, "containers": {
        "c1": {"cls": "B", "latency_s": 1.0, "objective_s": 1.0, "limit": 0.5, "cpu_share": 0.5},
        "c2": {"cls": "S", "latency_s": 0.5, "objective_s": 1.0, "limit": 0.5, "cpu_share": 0.5, "alpha": 0.2},
        "c3": {"cls": None, "latency_s": None, "objective_s": 2.0, "limit": None, "cpu_share": None},
        "c4": {"cls": "S", "latency_s": 2.5, "objective_s": 2.0, "limit": 0.1, "cpu_share": 0.1}}}
    assert realexp.latest_counts(state, 0.1) == (2, 1)  # c1 met and in band, c2 met (faster), c4 late

    class Run:
        policy = label = "learned"
        settings: dict = {}
        specs = ()
        cpu_samples: list = []
        states = [dict(state, t_s=float(t)) for t in range(0, 100, 2)]

    s = realexp.summarize_real(Run(), 100.0)
    assert (s["met_final"], s["satisfied_final"]) == (2, 1)


def test_the_second_half_means_are_read_as_stored_and_derived_for_older_summaries():
    r = {"series": [[0, 0], [100, 2]], "met_series": [[0, 1], [100, 3]]}
    assert realexp._second_half(r, 200) == "3.0 / 2.0"
    stored = {**r, "met_mean_second_half": 2.5, "satisfied_mean_second_half": None}
    assert realexp._second_half(stored, 200) == "2.5 / -"


def _batch(t, name, latency, index=1):
    return {"kind": "batch", "t_s": t, "container": name, "latency_s": latency, "cpu_s": None, "batch": index}


def _decision(t, limits):
    return {"kind": "decision", "t_s": t, "containers": {n: {"new_limit": v} for n, v in limits.items()}}


def test_the_noise_a_run_saw_is_the_spread_at_one_unchanged_limit():
    rows = [_decision(0.0, {"c1": 0.5, "c2": 0.25}), _decision(50.0, {"c1": 0.25, "c2": 0.25}),
            # before the window, the warm-up, a stretch too short: none counts
            _batch(5.0, "c1", 9.0), _batch(21.0, "c2", 9.0, index=0), _batch(22.0, "c2", 1.0),
            _batch(30.0, "c2", 1.1)]
    # c1 under 0.5 cores, then a batch that straddles the change at 50 s (counted nowhere), then c1
    # under 0.25 at twice the latency: only the spread within each stretch counts, not the step.
    rows += [_batch(20.0 + 2 * i, "c1", v) for i, v in enumerate((1.0, 1.2, 0.9))]
    rows += [_batch(51.0, "c1", 30.0)]
    rows += [_batch(60.0 + 3 * i, "c1", v) for i, v in enumerate((2.0, 2.4, 1.8))]
    ys = [math.log(v) for v in (1.0, 1.2, 0.9)]
    mean = sum(ys) / 3
    want = math.sqrt(2 * sum((y - mean) ** 2 for y in ys) / 4)  # the same spread twice, 2 x 2 dof
    got = realexp.measured_noise(rows, 10.0)
    assert got == {"sd": round(want, 4), "batches": 6}
    assert realexp.measured_noise(rows, 70.0) is None  # nothing left with enough batches


def test_a_batch_received_after_a_change_that_followed_its_end_counts_under_the_limit_it_ran_under():
    rows = [_decision(0.0, {"c1": 0.5}), _decision(50.0, {"c1": 0.25})]
    rows += [_batch(44.0 + 2 * i, "c1", v) for i, v in enumerate((1.0, 1.2, 0.9))]
    rows += [dict(_batch(50.02, "c1", 1.1), finished_s=49.99)]  # received 20 ms after the change
    ys = [math.log(v) for v in (1.0, 1.2, 0.9, 1.1)]
    mean = sum(ys) / 4
    want = math.sqrt(sum((y - mean) ** 2 for y in ys) / 3)
    assert realexp.measured_noise(rows, 10.0) == {"sd": round(want, 4), "batches": 4}
    # By its receipt alone it would seem to straddle the change, and be left out.
    bare = [{k: v for k, v in r.items() if k != "finished_s"} for r in rows]
    assert realexp.measured_noise(bare, 10.0)["batches"] == 3


def test_the_noise_window_opens_on_when_batches_finished_as_the_per_batch_counts_do():
    rows = [_decision(0.0, {"c1": 0.5})]
    rows += [_batch(44.0 + 2 * i, "c1", v) for i, v in enumerate((1.0, 1.2, 0.9))]
    # Finished at 49.9 s, received at 50.1 s: before a window opening at 50 s, so left out.
    late = rows + [dict(_batch(50.1, "c1", 3.0), finished_s=49.9)]
    late += [dict(_batch(52.0 + 2 * i, "c1", v), finished_s=51.9 + 2 * i) for i, v in enumerate((1.1, 1.0, 1.3))]
    ys = [math.log(v) for v in (1.1, 1.0, 1.3)]
    mean = sum(ys) / 3
    want = math.sqrt(sum((y - mean) ** 2 for y in ys) / 2)
    assert realexp.measured_noise(late, 50.0) == {"sd": round(want, 4), "batches": 3}
    d = {"containers": [{"name": "c1", "objective_s": 1.0}]}
    assert realexp.batches_by_container(d, late, 50.0)["c1"]["batches"] == 3


def test_a_stamp_the_worker_would_not_believe_is_not_believed_here_either():
    # A stamp after its receipt, or one from a clock far apart, is read as received (as the worker does).
    rows = [_decision(0.0, {"c1": 0.5}), _decision(50.0, {"c1": 0.25})]
    rows += [_batch(44.0 + 2 * i, "c1", v) for i, v in enumerate((1.0, 1.2, 0.9))]
    # Stamped 30 s before its receipt just after the change: read at receipt, it straddles the change.
    far = rows + [dict(_batch(50.02, "c1", 1.1), finished_s=20.0)]
    assert realexp.measured_noise(far, 10.0)["batches"] == 3
    # Received before the change, stamped after it: read at receipt, it ran under the first limit.
    ahead = rows + [dict(_batch(49.9, "c1", 1.1), finished_s=51.5)]
    assert realexp.measured_noise(ahead, 10.0)["batches"] == 4


def test_the_oracle_under_noise_keeps_fewer_in_band_the_noisier_the_run():
    profiles = {**BUILTIN_PROFILES, "resnet50": resnet_profile()}
    specs = realexp.plan_containers(6, ["resnet50", "mobilenetv2"], profiles, 4.0)
    d = {"cores": 4.0, "duration_s": 200,
         "containers": [{"name": c.name, "model": c.model, "objective_s": c.objective_s} for c in specs]}
    quiet, noisy = (realexp.oracle_under_noise(d, profiles, sd) for sd in (0.01, 0.3))
    assert noisy["in_band"] < quiet["in_band"] <= 6
    assert noisy["in_band_expected"] < quiet["in_band_expected"]
    for o in (quiet, noisy):  # no allocation expects more than the ceilings, this one included
        assert o["in_band_expected"] <= o["in_band_ceiling"] + 1e-9 and o["met_expected"] <= o["met_ceiling"] + 1e-9
    assert noisy["in_band_ceiling"] < quiet["in_band_ceiling"]
    sc = realexp.sim_scenario(specs, profiles, 4.0, 200)
    assert quiet["in_band"] <= realexp.forecast(sc, "default")["oracle_satisfied"]


def _older_summary() -> dict:
    """A learned run's summary of two ResNet-50s on 2 cores (built-in profiles, at their 100 images a
    batch), from before a summary kept the noise and the oracles beside it."""
    specs = realexp.plan_containers(2, ["resnet50"], BUILTIN_PROFILES, 2.0)
    final = {c.name: {"latency_s": 3.0, "cls": "S", "limit": 0.25, "cpu_cores": 0.5} for c in specs}
    return {"command": "dqoes experiment real", "started_at": "now", "image": "img", "cores": 2.0, "batch": 100,
            "resolution_px": 224, "duration_s": 100, "profiles": "built-in",
            "containers": [{"name": c.name, "model": c.model, "objective_s": c.objective_s, "fastest_s": 1.0}
                           for c in specs],
            "real": {"learned": {"satisfied_final": 1, "met_final": 2, "final_window_s": 10.0, "series": [],
                                 "final": final, "loadavg_1m": None, "total_cpu_cores_final": 1.0}},
            "sim": {}}


def _completed_from_records(tmp_path, capsys, d: dict, rows: list) -> tuple:
    """`d` written as a summary and `rows` as its learned run's records; the learned run's summary as
    `--from ... --records ... --json` completes it: (summary path, records dir, that summary)."""
    src, rec = tmp_path / "summary.json", tmp_path / "run"
    src.write_text(json.dumps(d))
    rec.mkdir()
    (rec / "learned.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["experiment", "real", "--from", str(src), "--records", str(rec), "--json"]) == 0
    out = capsys.readouterr().out
    return src, rec, json.loads(out.strip().splitlines()[-1])["real"]["learned"]


def test_an_older_summary_gets_its_noise_from_the_records(tmp_path, capsys):
    d = _older_summary()
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(d))
    assert main(["experiment", "real", "--from", str(src)]) == 0
    assert "| learned | 2 | 1 | 1.00 | - / - | - / - | - / - | - |" in capsys.readouterr().out
    rec = tmp_path / "run"
    rec.mkdir()
    rows = [_decision(0.0, {"c01": 0.5})] + [_batch(60.0 + 3 * i, "c01", v) for i, v in enumerate((3.0, 3.3, 2.8))]
    (rec / "learned.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["experiment", "real", "--from", str(src), "--records", str(rec), "--json"]) == 0
    out = capsys.readouterr().out
    got = json.loads(out.strip().splitlines()[-1])["real"]["learned"]
    assert got["noise"] == realexp.measured_noise(rows, 50.0)
    # The summary names the built-in profiles: the oracle reads those.
    assert got["oracle_under_noise"] == realexp.oracle_under_noise(d, BUILTIN_PROFILES, got["noise"]["sd"])
    assert main(["experiment", "real", "--from", str(src), "--records", str(rec)]) == 0
    assert f"| - / - | - / - | 1 / 0 (σ {got['noise']['sd']:.2f}) | - |" in capsys.readouterr().out
    assert main(["experiment", "real", "--from", str(src), "--records", str(tmp_path / "nowhere")]) == 2
    assert "no record of learned there" in capsys.readouterr().err
    assert main(["experiment", "real", "--records", str(rec)]) == 2
    assert "only with --from" in capsys.readouterr().err
    assert json.loads(src.read_text()) == d  # reading back changes no file
    # A record cut short, or one not written by `--out`: a clear error, no traceback, nothing written.
    md = tmp_path / "r.md"
    for text, says in (('{"kind": "batch", "t_s": 1\n', "learned.jsonl:1: not a JSON record"),
                       ('{"kind": "batch", "t_s": 60}\n', "the record of learned is not as")):
        (rec / "learned.jsonl").write_text(text)
        assert main(["experiment", "real", "--from", str(src), "--records", str(rec), "--update", str(md)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and not md.exists()


def test_a_bad_record_is_named_when_only_the_measured_work_reads_it(tmp_path, capsys):
    # The summary has its noise already, so only the work per batch reads the decisions: a decision
    # without its new limit is an error that names the record, not the summary, and writes nothing.
    d = _older_summary()
    d["real"]["learned"]["noise"] = {"sd": 0.05, "batches": 3}
    src, rec, md = tmp_path / "summary.json", tmp_path / "run", tmp_path / "r.md"
    src.write_text(json.dumps(d))
    rec.mkdir()
    rows = [{"kind": "decision", "t_s": 0.0, "containers": {"c01": {}}}, dict(_batch(60.0, "c01", 3.0), cpu_s=1.0)]
    (rec / "learned.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["experiment", "real", "--from", str(src), "--records", str(rec), "--update", str(md)]) == 2
    err = capsys.readouterr().err
    assert "the record of learned is not as" in err and "Traceback" not in err and not md.exists()


def test_the_oracle_again_with_the_work_per_batch_each_run_measured(tmp_path, capsys):
    # The calibrated profiles can be off for the machine a run had (on the 16-core host a batch took
    # 10-35 % less CPU than calibrated): beside the profiles' oracle, the same oracle with each model's
    # work per batch as the run's own batches measured it (their median CPU-seconds).
    work = BUILTIN_PROFILES["resnet50"].work_cpu_s
    d = _older_summary()
    half = [0.45 * work, 0.5 * work, 0.55 * work]
    rows = [_decision(0.0, {"c01": 0.5, "c02": 0.5}),
            dict(_batch(40.0, "c01", 9.0, index=0), cpu_s=9.0 * work),  # the warm-up: left out
            dict(_batch(41.0, "c02", 3.0), cpu_s=None)]  # no CPU reading: left out
    rows += [dict(_batch(60.0 + 3 * i, "c01", 3.0 + 0.1 * i), cpu_s=v) for i, v in enumerate(half)]
    measured = realexp.measured_work(d, rows, BUILTIN_PROFILES)
    assert {m: f.work_cpu_s for m, f in measured.items()} == {"resnet50": round(0.5 * work, 4)}
    # c01 asks for 0.8 x its fastest batch under the profile: out of reach, until a batch costs half.
    def at(w):
        return {"resnet50": dataclasses.replace(BUILTIN_PROFILES["resnet50"], work_cpu_s=w)}

    calibrated = realexp.oracle_with_work(d, BUILTIN_PROFILES, at(work), None)
    halved = realexp.oracle_with_work(d, BUILTIN_PROFILES, at(0.5 * work), 0.05)
    assert (calibrated["met"], halved["met"]) == (1, 2)
    assert calibrated["under_noise"] is None and halved["under_noise"]["met_expected"] > 1.5
    src, rec, got = _completed_from_records(tmp_path, capsys, d, rows)
    assert got["oracle_measured_work"] == realexp.oracle_with_work(d, BUILTIN_PROFILES, measured, got["noise"]["sd"])
    assert got["oracle_measured_work"]["work_cpu_s"] == {"resnet50": round(0.5 * work, 4)}
    assert main(["experiment", "real", "--from", str(src), "--records", str(rec)]) == 0
    assert f"learned: resnet50 {0.5 * work:.3g} s (profile {work:.3g}); bound 2 / " in capsys.readouterr().out
    assert json.loads(src.read_text()) == d  # reading back changes no file


QUOTA_PROFILE = ModelProfile("resnet50", 1.0, threads=1, efficiency=((0.5, 1.4), (1.0, 1.0)), batch_images=100)
"""Work 1 CPU-s a batch under no quota, 1.4 under half a core (the 16-core host's profile said 1.38)."""


def _steady(name, at_s, cost_s, cores, n):
    """`n` back-to-back batches of `name` from `at_s`, each `cost_s` CPU-seconds under `cores`."""
    lat = cost_s / min(cores, 1.0)
    return [dict(_batch(at_s + lat * (i + 1), name, lat), cpu_s=cost_s) for i in range(n)]


def test_a_runs_work_counts_the_cost_of_its_quota_once():
    # c01 ran under half a core at 1.1 CPU-s a batch, c02 under no quota at 1.0. The profile says a half-core
    # quota costs 1.4 x: the run's batches say 1.1 x. Until 1 Dec the median of every batch (1.0) was taken
    # for the work before any quota and the profile's 1.4 applied on top: 1.4 CPU-s under half a core.
    d = _older_summary()
    rows = [_decision(0.0, {"c01": 0.25, "c02": None})]
    rows += _steady("c01", 1.0, 1.1, 0.5, 12) + _steady("c02", 1.0, 1.0, 2.0, 13)
    fitted = realexp.measured_work(d, rows, {"resnet50": QUOTA_PROFILE})["resnet50"]
    assert fitted.work_cpu_s == pytest.approx(1.0)
    assert fitted.work_cpu_s * fitted.cpu_multiplier(0.5) == pytest.approx(1.1)
    assert fitted.efficiency == ((0.5, 1.1), (1.0, 1.0))
    mw = realexp.oracle_with_work(d, {"resnet50": QUOTA_PROFILE}, {"resnet50": fitted}, None)
    assert mw["efficiency"] == {"resnet50": [[0.5, 1.1], [1.0, 1.0]]}
    assert mw["profile_efficiency"] == {"resnet50": [[0.5, 1.4], [1.0, 1.0]]}
    assert realexp._quota_cost(mw, "resnet50") == ", x1.1 under 0.5 cores (profile x1.4)"


def test_a_run_seen_only_under_a_quota_keeps_the_profiles_shape_and_its_own_cost_there():
    # Every batch under half a core (this machine's Docker node runs every limit under a core): what a
    # batch costs with no quota cannot be told apart from the quota's cost, so the profile's shape
    # stays and the run's cost under half a core is its median there. A batch whose limit changed
    # while it ran (a tenfold CPU reading here) and one before any decision count nowhere.
    d = _older_summary()
    rows = [dict(_batch(0.5, "c01", 0.4), cpu_s=9.0), _decision(1.0, {"c01": 0.25, "c02": 0.25})]
    rows += _steady("c01", 1.0, 1.1, 0.5, 4) + _steady("c02", 1.0, 1.2, 0.5, 4)
    rows += [_decision(60.0, {"c01": 0.3}), dict(_batch(60.5, "c01", 2.0), cpu_s=11.0)]
    for many in (False, True):  # too few batches for the point alone: every batch scales the profile
        fitted = realexp.measured_work(d, rows, {"resnet50": QUOTA_PROFILE})["resnet50"]
        assert fitted.efficiency == QUOTA_PROFILE.efficiency
        assert fitted.work_cpu_s * fitted.cpu_multiplier(0.5) == pytest.approx(1.15 if not many else 1.1, abs=1e-3)
        rows = rows[:2] + _steady("c01", 1.0, 1.1, 0.5, 11) + rows[2:]


def test_a_fitted_quota_curve_never_costs_less_under_a_smaller_quota():
    # Two threads: a one-core quota throttles too. Batches cost 1.0 under half a core and 1.2 under one:
    # read as they come, half a core would be the cheaper; the two points are pooled (ten batches each).
    p = ModelProfile("resnet50", 1.0, threads=2, efficiency=((0.5, 1.4), (1.0, 1.0)), batch_images=100)
    d = _older_summary()
    rows = [_decision(0.0, {"c01": 0.25, "c02": 0.5})]
    rows += _steady("c01", 1.0, 1.0, 0.5, 10) + _steady("c02", 1.0, 1.2, 1.0, 10)
    rows += [_decision(30.0, {"c02": None})] + _steady("c02", 30.0, 1.0, 2.0, 10)
    fitted = realexp.measured_work(d, rows, {"resnet50": p})["resnet50"]
    assert fitted.work_cpu_s == pytest.approx(1.0)
    assert fitted.efficiency == ((0.5, 1.1), (1.0, 1.1))


def test_a_few_dear_batches_under_a_larger_quota_do_not_set_the_work_of_many_cheap_ones():
    # 1 Dec, a fresh 2-core machine: a learned run's MobileNetV2s ran some 1,600 batches at 0.2-0.3 cores
    # for 0.16 CPU-s and eleven, early, near half a core for 0.21. Read apart, the eleven set the work
    # and the quota's cost at 0.25 cores was clamped up to it (1 x 0.21); pooled, the many decide.
    p = ModelProfile("resnet50", 1.0, threads=1, efficiency=((0.25, 1.4), (0.5, 1.2), (1.0, 1.0)), batch_images=100)
    d = _older_summary()
    rows = [_decision(0.0, {"c01": 0.125, "c02": 0.25})]
    rows += _steady("c02", 1.0, 1.2, 0.5, 11) + [_decision(30.0, {"c02": 0.125})]
    rows += _steady("c01", 1.0, 0.8, 0.25, 150) + _steady("c02", 31.0, 0.8, 0.25, 150)
    fitted = realexp.measured_work(d, rows, {"resnet50": p})["resnet50"]
    pooled = (300 * 0.8 + 11 * 1.2) / 311
    assert fitted.work_cpu_s * fitted.cpu_multiplier(0.25) == pytest.approx(pooled, abs=1e-3)
    assert fitted.work_cpu_s * fitted.cpu_multiplier(0.5) == pytest.approx(pooled, abs=1e-3)


def test_a_sigterm_dropped_while_a_process_starts_still_stops_the_run(tmp_path):
    """A SIGTERM's KeyboardInterrupt raised in a fork's hooks is printed and dropped; the flag it set
    stops the run right after the start, with the process recorded so that `stop` ends it."""
    from experiments.common import INTERRUPTED, PrivateNats

    run = realexp.RealRun("n1", "default", [], cores=1.0, image="", batch=1, resolution_px=32,
                          run_dir=tmp_path, runtime="cgroup")
    run.nats = PrivateNats(["n1"], tmp_path / "nats-server.out")  # its credentials; no server needed here
    private = run.nats.dir
    INTERRUPTED.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            run._spawn("manager", ["-c", "import time; time.sleep(60)"], "manager")
    finally:
        INTERRUPTED.clear()
    proc = run.procs["manager"]
    assert proc.poll() is None
    run.stop()
    assert proc.poll() is not None and "manager" not in run.procs
    assert not private.exists()


def test_profiles_are_scaled_to_the_batches_the_containers_run(tmp_path, capsys):
    # A profile calibrated at 10 images, containers that run 50: objectives, forecast and bounds are
    # worked out from five times its work per batch, and so is a summary read back with its records.
    ten = resnet_profile()
    fifty = realexp.batch_profiles({"resnet50": ten}, 50, 224)["resnet50"]
    assert fifty.work_cpu_s == pytest.approx(5 * ten.work_cpu_s) and fifty.batch_images == 50
    assert fifty.efficiency == ten.efficiency and fifty.overhead_s == ten.overhead_s
    specs = realexp.plan_containers(2, ["resnet50"], {"resnet50": fifty}, 2.0)
    assert specs[0].objective_s == pytest.approx(round(fifty.fastest_s(2.0) * realexp.FACTORS[0], 2))
    d = {**_older_summary(), "batch": 20}
    rows = [_decision(0.0, {"c01": 0.5})] + [_batch(60.0 + 3 * i, "c01", v) for i, v in enumerate((3.0, 3.3, 2.8))]
    _, _, got = _completed_from_records(tmp_path, capsys, d, rows)
    sd = got["noise"]["sd"]
    scaled = realexp.batch_profiles(BUILTIN_PROFILES, 20, 224)
    assert got["oracle_under_noise"] == realexp.oracle_under_noise(d, scaled, sd)
    assert got["oracle_under_noise"] != realexp.oracle_under_noise(d, BUILTIN_PROFILES, sd)


def test_a_profile_that_does_not_hold_on_this_machine_is_reported():
    """Work per batch measured 1.5x the profile's: the summary says so; within a quarter it does not."""
    def summary(*works):
        return {"real": {f"p{i}": {"oracle_measured_work": {"work_cpu_s": {"resnet50": w, "mobilenetv2": 0.21},
                                                             "profile_work_cpu_s": {"resnet50": 1.16,
                                                                                    "mobilenetv2": 0.201}}}
                         for i, w in enumerate(works)}}

    assert realexp.profiles_off(summary(1.2, 1.0)) == []
    assert realexp.profiles_off(summary(1.71, 1.77)) == [
        "resnet50 measured 1.71-1.77 CPU-s a batch, its profile 1.16"]
    assert realexp.profiles_off(summary(1.2, 0.8)) == ["resnet50 measured 0.8-1.2 CPU-s a batch, its profile 1.16"]
    assert realexp.profiles_off({"real": {"p": {}}}) == []


@pytest.mark.parametrize("content", ["[]", '{"real": 3}', '{"real": {}, "sim": {}}', '{"cores": "two"}'])
def test_a_file_that_is_not_a_summary_is_a_clear_error_and_writes_nothing(tmp_path, capsys, content):
    src = tmp_path / "summary.json"
    src.write_text(content)
    md = tmp_path / "results.md"
    md.write_text("# Results\n")
    plot = tmp_path / "r.svg"
    assert main(["experiment", "real", "--from", str(src), "--update", str(md), "--plot", str(plot)]) == 2
    assert "not a summary `dqoes experiment real` writes" in capsys.readouterr().err
    assert md.read_text() == "# Results\n" and not plot.exists()


def test_the_forecast_and_the_bounds_run_threads_as_the_workloads_do():
    """A ResNet-50 asked for 0.72 s where one thread takes 0.90 s: out of reach on one thread, met (faster
    than its band) on two whole cores. Runs since 26 Nov 2026 say their workloads follow their limits
    (`threads_follow`); summaries without it are read as one thread whatever the limit, as they were forecast."""
    from shared.core.oracle import plan_node
    from shared.core.profiles import ModelProfile

    profiles = {"resnet50": ModelProfile("resnet50", 0.9033, batch_images=10)}
    # Seven more asked for 1.6 s need 0.57 cores each: eight on 8 cores, the floor half a core.
    objectives = [0.72] + [1.6] * 7
    d = {"containers": [{"name": f"c{i + 1:02d}", "model": "resnet50", "objective_s": o} for i, o in enumerate(objectives)],
         "cores": 8.0, "duration_s": 200.0}
    old = plan_node(realexp._oracle_items(d, profiles, 0.1), 8.0)
    assert old.too_slow == ("c01",) and old.met_count == 7
    follow_items = realexp._oracle_items({**d, "threads_follow": True}, profiles, 0.1)
    new = plan_node(follow_items, 8.0, sharing=False)
    assert new.steps_over == ("c01",) and (new.met_count, new.count) == (8, 7)
    # The bound: sharing an over-subscribed node can hold its two threads at 1.25 cores, in band.
    bound = plan_node(follow_items, 8.0)
    assert (bound.met_count, bound.count) == (8, 8)
    assert old.count == 7
    specs = realexp.plan_containers(8, ["resnet50"], profiles, 8.0, objectives)
    follows = realexp.forecast(realexp.sim_scenario(specs, profiles, 8.0, 300, follows=True), "learned")
    assert follows["final"]["c01"]["limit"] * 8.0 == pytest.approx(2.0) and follows["met_final"] == 8
    assert realexp.forecast(realexp.sim_scenario(specs, profiles, 8.0, 300), "learned")["met_final"] == 7


def test_each_containers_second_half_batches_are_counted_one_by_one(tmp_path, capsys):
    # What a client of one container lived through: every batch of the second half, not only the
    # latest one the plateau counts. The warm-up and the first half are left out.
    d = _older_summary()
    c01, c02 = (c["name"] for c in d["containers"])
    o = next(c["objective_s"] for c in d["containers"] if c["name"] == c01)
    rows = [_decision(0.0, {c01: 0.5, c02: 0.5}),
            _batch(10.0, c01, 5.0 * o),  # first half (the run is 100 s)
            _batch(55.0, c02, 9.0 * o, index=0)]  # a warm-up
    # c01: in band, met but faster than its band, too slow, in band again.
    rows += [_batch(60.0 + 3 * i, c01, f * o) for i, f in enumerate((1.0, 0.8, 1.3, 1.05))]
    got = realexp.batches_by_container(d, rows, 50.0)
    assert got == {c01: {"batches": 4, "met": 0.75, "in_band": 0.5, "faster": 0.25, "median_to_objective": 1.025}}
    src, rec, completed = _completed_from_records(tmp_path, capsys, d, rows)
    assert completed["second_half_batches"] == got
    assert main(["experiment", "real", "--from", str(src), "--records", str(rec)]) == 0
    out = capsys.readouterr().out
    assert f"| {c01} | {o:g} | 75% / 50% / 25% / {1.025:.2f} (4) |" in out
    o2 = next(c["objective_s"] for c in d["containers"] if c["name"] == c02)
    assert f"| {c02} | {o2:g} | - |" in out  # no batch but its warm-up in the second half
    # Without records there is nothing to count: no table.
    assert main(["experiment", "real", "--from", str(src)]) == 0
    assert "Batch by batch" not in capsys.readouterr().out


def test_cpu_weights_reach_the_worker_and_the_command_line(tmp_path, monkeypatch):
    """CPU weights are on by default; `dqoes experiment real --no-cpu-weights` turns them off in its worker."""
    from services.worker.__main__ import parse
    from services.worker.app import runtime_settings

    monkeypatch.delenv("DQOES_CPU_WEIGHTS", raising=False)
    for weighted in (False, True):
        run = realexp.RealRun("n1", "learned", [], cores=2.0, image="", batch=1, resolution_px=32,
                              run_dir=tmp_path, settings={"half_life_s": 0.0}, cpu_weights=weighted)
        args = run.worker_args("nats://127.0.0.1:4222")
        assert ("--cpu-weights" if weighted else "--no-cpu-weights") in args
        cfg = parse([*args[2:], "--runtime", "docker"])
        assert runtime_settings(cfg, None).cpu_weights is weighted
        assert cfg.params == (("half_life_s", 0.0),)
        line = realexp.command_line(realexp.RealOptions(cpu_weights=weighted))
        assert line.endswith("--no-cpu-weights") is not weighted
    assert parse(["--runtime", "docker"]).cpu_weights is True  # the default
    monkeypatch.setenv("DQOES_CPU_WEIGHTS", "0")
    assert parse(["--runtime", "docker"]).cpu_weights is False
    assert parse(["--runtime", "docker", "--cpu-weights"]).cpu_weights is True


def test_docker_workloads_are_labelled_for_the_worker_and_their_threads_follow_their_limit(tmp_path, monkeypatch):
    # As under the cgroup runtime, and as the forecast and the bounds model them: no thread count is
    # pinned, so each workload runs max(1, floor(limit)) threads and its batches say so.
    from services.inference.__main__ import parse as parse_inference

    spec = realexp.plan_containers(1, ["resnet50"], BUILTIN_PROFILES, 2.0, [4.0])[0]
    run = realexp.RealRun("n1", "learned", [spec], cores=2.0, image="img:1", batch=10, resolution_px=224,
                          run_dir=tmp_path)
    args = run.docker_run_args(spec, "nats://127.0.0.1:4222", tmp_path / "c.creds")
    labels = {args[i + 1] for i, a in enumerate(args) if a == "--label"}
    assert {"dqoes.managed=true", "dqoes.node=n1", "dqoes.objective_s=4", "dqoes.model=resnet50"} <= labels
    env = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-e")
    assert "DQOES_THREADS" not in env and env["DQOES_BATCH"] == "10"
    assert args[-3:] == ["img:1", "-m", "services.inference"]
    monkeypatch.delenv("DQOES_THREADS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DQOES_NATS_CREDS")  # the file lies in the container
    _, cfg = parse_inference([])
    assert cfg.threads is None and cfg.batch == 10 and cfg.model == "resnet50"


def test_a_summary_of_a_calibrating_run_reads_back_with_the_profiles_it_measured(tmp_path, capsys):
    """`--calibrate` keeps the profiles it measured in the summary: read back anywhere (no profiles file
    beside it), its oracles come from them, and its section says where they came from."""
    measured = fit_profile(ModelCalibration("resnet50", (LimitRun(None, (40.0,), (40.0,)),), threads=1,
                                            batch_images=100, resolution_px=224))
    assert measured.work_cpu_s != BUILTIN_PROFILES["resnet50"].work_cpu_s
    from experiments.calibration import profile_to_dict

    d = {**_older_summary(), "profiles": "runs/gone/profiles.toml",
         "profiles_measured": [profile_to_dict(measured)], "calibration": {"measured_at": "2026-12-01 19:00 UTC"}}
    assert realexp.summary_profiles(d)["resnet50"] == measured
    assert realexp.summary_profiles(d)["mobilenetv2"] == BUILTIN_PROFILES["mobilenetv2"]
    rows = [_decision(0.0, {"c01": 0.5})] + [_batch(60.0 + 3 * i, "c01", v) for i, v in enumerate((3.0, 3.3, 2.8))]
    src, rec, got = _completed_from_records(tmp_path, capsys, d, rows)
    assert got["oracle_under_noise"] == realexp.oracle_under_noise(d, {"resnet50": measured}, got["noise"]["sd"])
    assert got["oracle_under_noise"] != realexp.oracle_under_noise(d, BUILTIN_PROFILES, got["noise"]["sd"])
    assert main(["experiment", "real", "--from", str(src)]) == 0
    out = capsys.readouterr().out
    assert "measured on this machine in the same call, before the runs (`dqoes calibrate`, 2026-12-01 19:00 UTC" in out
    assert "runs/gone/profiles.toml" not in out
    # Profiles that do not parse are a clear error, not a traceback.
    src.write_text(json.dumps({**d, "profiles_measured": [{"name": "resnet50", "work_cpu_s": -1}]}))
    assert main(["experiment", "real", "--from", str(src), "--records", str(rec)]) == 2
    err = capsys.readouterr().err
    assert "profiles_measured: " in err and "work_cpu_s" in err and "Traceback" not in err


def test_calibrate_is_refused_beside_a_profiles_file_or_a_read_back(tmp_path, capsys):
    src = tmp_path / "summary.json"
    src.write_text(json.dumps(_older_summary()))
    for args, says in ((["--calibrate", "--profiles", "p.toml"], "give it or --profiles, not both"),
                       (["--calibrate", "--from", str(src)], "--calibrate: only for a run")):
        assert main(["experiment", "real", *args]) == 2
        assert says in capsys.readouterr().err
    assert realexp.command_line(realexp.RealOptions(calibrate=True)).endswith(" --calibrate")
    assert "--calibrate" not in realexp.command_line(realexp.RealOptions())


def test_the_packaged_profiles_are_the_default_and_read_back_by_name_old_or_new(monkeypatch, tmp_path):
    monkeypatch.delenv("DQOES_PROFILES", raising=False)
    profiles, shown = realexp.load_profiles(None)
    assert shown == "experiments/profiles.toml" and realexp.DEFAULT_PROFILES.is_file()
    assert profiles["resnet50"] != BUILTIN_PROFILES["resnet50"]  # the calibrated one, not the built-in
    # A summary names them so on any install; one written when they lay in docs/ reads back the same.
    assert realexp.profiles_named(shown) == profiles == realexp.profiles_named("docs/calibration/profiles.toml")
    other = tmp_path / "p.toml"
    other.write_text(realexp.DEFAULT_PROFILES.read_text())
    assert realexp.load_profiles(str(other)) == (profiles, str(other))
