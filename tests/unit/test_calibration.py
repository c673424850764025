"""Calibration without measuring: fitting profiles, the profiles file, and where profiles are used.

The measurements are made-up numbers shaped like real ones (CPU-seconds per
batch growing as the quota shrinks); the real measurement has its own test
in tests/workloads/test_calibrate_real.py.
"""

from __future__ import annotations

import json
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dashboard.render import save as render_save
from experiments import calibrate
from experiments.calibration import (
    LimitRun,
    ModelCalibration,
    calibrations_from_document,
    efficiency_curve,
    fit_profile,
    profiles_document,
    to_toml,
)
from experiments.common import ExperimentError
from services.cli.main import main
from shared.core.profiles import BUILTIN_PROFILES
from shared.scenarios.builtin import load
from shared.scenarios.spec import ScenarioError, load_profiles_file, parse_profiles
from shared.sim.engine import simulate


def run(limit, cpu, lat=None, warm_cpu=(), threads=1):
    lat = lat or [c / min(limit or threads, threads) for c in cpu]
    return LimitRun(limit, tuple(lat), tuple(cpu), warmup_cpu_s=tuple(warm_cpu), warmup_latency_s=tuple(warm_cpu),
                    threads=threads, loadavg_before=(1.0, 0.5, 0.2), loadavg_after=(1.2, 0.6, 0.3))


def resnet_cal() -> ModelCalibration:
    return ModelCalibration("resnet50", (
        run(None, [1.6, 1.7, 1.65], lat=[1.7, 1.8, 1.75], warm_cpu=[3.3, 2.0]),
        run(0.25, [4.0, 4.2, 4.1]),
        run(0.5, [2.0, 2.1, 2.05]),
        run(1.0, [1.7, 1.66, 1.68]),
        run(2.0, [1.6, 1.62, 1.64]),
    ), threads=1, batch_images=10, resolution_px=224)


def test_fit_takes_work_from_the_unthrottled_runs_and_the_curve_from_cpu_ratios():
    p = fit_profile(resnet_cal())
    assert p.work_cpu_s == pytest.approx(1.65)  # median of the unlimited, 1-core and 2-core batches
    assert p.threads == 1
    assert p.overhead_s == 0.0  # 1.75 s wall for 1.65 CPU-s is waiting for the CPU, not the model's cost
    assert p.warmup_factor == pytest.approx(2.65 / 1.65, rel=1e-3)  # median of the warm-up batches
    assert dict(p.efficiency) == pytest.approx({0.25: 4.1 / 1.65, 0.5: 2.05 / 1.65, 1.0: 1.0}, rel=1e-3)
    # The simulator then predicts what was measured: 4.1 CPU-s at 0.25 core is 16.4 s.
    assert p.latency_s(0.25, 2.0) == pytest.approx(4.1 / 0.25, rel=1e-3)
    assert p.latency_s(None, 2.0) == pytest.approx(1.65)
    assert (p.batch_images, p.resolution_px) == (10, 224)


def test_curve_is_non_increasing_floored_at_one_and_ends_at_the_thread_count():
    cal = ModelCalibration("m", (
        run(None, [2.0], threads=2),
        run(0.25, [5.0], threads=2),
        run(0.5, [6.0], threads=2),  # noisier than the smaller quota: must not make 0.25 look cheaper
        run(1.0, [1.5], threads=2),  # below the unlimited cost: floored at 1
        run(3.0, [2.0], threads=2),  # above the thread count: the quota does not bind, not in the curve
    ), threads=2)
    curve = efficiency_curve(cal, 2.0)
    assert curve == ((0.25, 3.0), (0.5, 3.0), (1.0, 1.0), (2.0, 1.0))
    fit_profile(cal)  # and ModelProfile accepts it


def test_work_pools_the_runs_a_quota_does_not_throttle():
    cal = ModelCalibration("m", (run(0.5, [3.0]), run(1.5, [1.5, 1.4]), run(1.0, [1.6])), threads=1)
    assert cal.baseline().limit_cores == 1.5
    assert fit_profile(cal).work_cpu_s == pytest.approx(1.5)  # median of 1.4, 1.5, 1.6
    two = ModelCalibration("m", (run(None, [2.0], threads=2), run(1.0, [9.0], threads=2)), threads=2)
    assert fit_profile(two).work_cpu_s == 2.0  # 1 core throttles two threads: not pooled
    with pytest.raises(ValueError, match="no unlimited run"):
        ModelCalibration("m", (run(0.5, [3.0]),), threads=1).baseline()


def test_a_run_needs_batches():
    with pytest.raises(ValueError):
        LimitRun(0.5, (), ())
    with pytest.raises(ValueError):
        LimitRun(-1.0, (1.0,), (1.0,))


def test_profiles_file_round_trips_through_toml(tmp_path: Path):
    cals = [resnet_cal()]
    profiles = calibrate.profiles_with_aliases(cals)
    doc = profiles_document(profiles, cals, {"cores": 2, "measured_at": "now", "command": 'dqoes "x"'})
    path = tmp_path / "profiles.toml"
    path.write_text(to_toml(doc, header="a header\nover two lines"))
    loaded = load_profiles_file(path)
    assert loaded["resnet50"] == profiles[0]
    assert tomllib.loads(path.read_text())["calibration"]["command"] == 'dqoes "x"'
    back = calibrations_from_document(tomllib.loads(path.read_text()))
    assert back[0].runs[0].limit_cores is None  # "no limit" survives TOML, which has no null
    assert [r.median_cpu_s for r in back[0].runs] == pytest.approx([r.median_cpu_s for r in cals[0].runs])
    # JSON works the same.
    jpath = tmp_path / "profiles.json"
    jpath.write_text(json.dumps(doc))
    assert load_profiles_file(jpath)["resnet50"] == profiles[0]


def test_mobilenetv2_also_gives_nasnetmobile_which_the_real_workload_serves_with_it():
    cal = ModelCalibration("mobilenetv2", (run(None, [0.6]), run(0.5, [0.9])), threads=1)
    names = {p.name: p for p in calibrate.profiles_with_aliases([cal])}
    assert set(names) == {"mobilenetv2", "nasnetmobile"}
    assert names["nasnetmobile"].work_cpu_s == names["mobilenetv2"].work_cpu_s
    assert "mobilenetv2" in names["nasnetmobile"].source


def test_profiles_file_errors_name_the_field(tmp_path: Path):
    bad = tmp_path / "p.toml"
    bad.write_text('[[models]]\nname = "x"\nwork_cpu_s = -1\n')
    with pytest.raises(ScenarioError, match=r"models\[0\]\.work_cpu_s: must be > 0"):
        load_profiles_file(bad)
    with pytest.raises(ScenarioError, match="non-empty list"):
        parse_profiles({"models": []})
    with pytest.raises(ScenarioError, match="unknown field"):
        parse_profiles({"models": [{"name": "x", "work_cpu_s": 1}], "nodes": []})


SCENARIO = """
name = "uses-calibration"
duration_s = 300
profiles = "cal/profiles.toml"
[[nodes]]
name = "n1"
cores = 2
[[containers]]
name = "a"
model = "resnet50"
objective_s = 5
[[containers]]
name = "b"
model = "mobilenetv2"
objective_s = 2
"""


def write_cal(tmp_path: Path) -> Path:
    cal = tmp_path / "cal" / "profiles.toml"
    cal.parent.mkdir()
    cal.write_text(to_toml(profiles_document(calibrate.profiles_with_aliases([resnet_cal()]))))
    return cal


def test_a_scenario_file_names_a_profiles_file_relative_to_itself(tmp_path: Path):
    write_cal(tmp_path)
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    sc = load(str(path), 1)
    assert sc.profiles["resnet50"].work_cpu_s == pytest.approx(1.65)
    assert sc.profiles["mobilenetv2"] == BUILTIN_PROFILES["mobilenetv2"]  # not calibrated: the built-in
    # The scenario's own [[models]] win over the profiles file.
    path.write_text(SCENARIO + '[[models]]\nname = "resnet50"\nwork_cpu_s = 9.0\n')
    assert load(str(path), 1).profiles["resnet50"].work_cpu_s == 9.0
    path.write_text(SCENARIO.replace("cal/profiles.toml", "missing.toml"))
    with pytest.raises(ScenarioError, match="profiles: .*missing.toml: cannot read"):
        load(str(path), 1)


def test_profiles_replace_the_built_ins_in_the_paper_scenarios():
    slow = fit_profile(ModelCalibration("resnet50", (run(None, [40.0]),), threads=1))
    base, over = load("paper-fixed-interval", 1), load("paper-fixed-interval", 1, {"resnet50": slow})
    assert over.profiles["resnet50"].work_cpu_s == 40.0
    assert over.profiles["vgg16"] == base.profiles["vgg16"]
    # Random objectives are drawn from the profiles in force, so they move with them.
    assert [c.objective_s for c in over.containers] != [c.objective_s for c in base.containers]
    assert simulate(over, "dqoes").final[0].latency_s != simulate(base, "dqoes").final[0].latency_s


def test_experiment_run_takes_profiles_from_the_flag_and_the_environment(tmp_path, capsys, monkeypatch):
    cal = write_cal(tmp_path)
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO.replace('profiles = "cal/profiles.toml"\n', ""))
    outs = []
    for extra in ([], ["--profiles", str(cal)]):
        assert main(["experiment", "run", str(path), "--json", "--verbose", *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    monkeypatch.setenv("DQOES_PROFILES", str(cal))
    assert main(["experiment", "run", str(path), "--json", "--verbose"]) == 0
    outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    lat = [o["final"][0]["latency_s"] for o in outs]
    assert lat[0] != lat[1]
    assert lat[1] == lat[2]


def test_calibrate_argument_checks():
    assert calibrate.parse_limits("2, 0.25,0.5,0.5") == [0.25, 0.5, 2.0]
    with pytest.raises(ExperimentError, match="must be > 0"):
        calibrate.parse_limits("0.5,-1")
    with pytest.raises(ExperimentError, match="unknown model 'resnet5O'"):
        calibrate.parse_models("resnet5O")
    assert calibrate.parse_models("nasnetmobile,resnet50,resnet50") == ["nasnetmobile", "resnet50"]


def test_calibrate_without_a_cgroup_tree_is_one_line(tmp_path, capsys):
    code = main(["calibrate", "--models", "mobilenetv2", "--cgroup-root", str(tmp_path / "nothing")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("dqoes: error: calibrate")


def test_calibrate_reports_from_a_saved_file(tmp_path, capsys):
    cals = [resnet_cal()]
    doc = profiles_document(calibrate.profiles_with_aliases(cals), cals,
                            {"cores": 2, "measured_at": "2026-01-01", "cpu_model": "cpu", "command": "dqoes calibrate"})
    src = tmp_path / "p.toml"
    src.write_text(to_toml(doc))
    md, svg = tmp_path / "cal.md", tmp_path / "fig" / "cal.svg"
    md.write_text("# Calibration\n\nintro\n")
    assert main(["calibrate", "--from", str(src), "--update", str(md), "--plot", str(svg), "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = out["table"]["resnet50"]
    assert [r["limit_cores"] for r in rows] == [None, 0.25, 0.5, 1.0, 2.0]
    assert rows[1]["cpu_s"] == pytest.approx(4.1) and rows[1]["multiplier"] == pytest.approx(2.48, abs=0.01)
    text = md.read_text()
    assert text.startswith("# Calibration\n\nintro\n")
    assert "| 0.25 | 16.400 | 4.100 | 2.48 | 16.400 |" in text
    assert "](fig/cal.svg)" in text
    ET.fromstring(svg.read_text())  # well-formed SVG
    # Regenerating replaces the section instead of appending another.
    assert main(["calibrate", "--from", str(src), "--update", str(md)]) == 0
    assert md.read_text().count(calibrate.BEGIN) == 1


def test_the_calibration_figure_is_the_dashboards_chart_with_every_point(tmp_path):
    cals = [resnet_cal()]
    profiles = calibrate.profiles_with_aliases(cals)
    rows = calibrate.calibration_frame(cals, profiles)
    limited = [r for r in cals[0].limited()]
    assert len(rows) == 2 * len(limited)
    measured = {r["limit_cores"]: r for r in rows if r["source"] == "measured"}
    assert measured[0.25]["cpu_s"] == pytest.approx(4.1) and measured[0.25]["latency_s"] == pytest.approx(16.4)
    spec = calibrate.calibration_figure(cals, profiles).to_dict()
    assert spec["hconcat"][0]["encoding"]["y"]["scale"]["type"] == "log"
    svg = tmp_path / "c.svg"
    render_save(calibrate.calibration_figure(cals, profiles), svg)
    root = ET.fromstring(svg.read_text())
    texts = {t.text for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert "CPU limit (cores)" in texts and any(t and t.startswith("resnet50") for t in texts)


def test_figures_are_svg_or_png_only(tmp_path):
    fig = calibrate.calibration_figure([resnet_cal()], calibrate.profiles_with_aliases([resnet_cal()]))
    png = render_save(fig, tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=".svg or .png"):
        render_save(fig, tmp_path / "c.pdf")


def test_a_run_keeps_the_allocator_it_ran_under_and_an_older_record_reads_without_one():
    from experiments.calibrate import allocator_of

    run = LimitRun(0.5, (1.0,), (0.5,), allocator="jemalloc")
    assert LimitRun.from_dict(run.to_dict()) == run
    older = {k: v for k, v in run.to_dict().items() if k != "allocator"}
    assert LimitRun.from_dict(older).allocator is None and "allocator" not in LimitRun(0.5, (1.0,), (0.5,)).to_dict()
    import os

    assert allocator_of(os.getpid()) in ("jemalloc", "default malloc")
    assert allocator_of(2**22 + 12345) == "unknown"  # no such process
