"""The results page's serving section renders from a small `python -m lab serving-real` summary, and the
experiment's bookkeeping (windows met, plateau, worker/client agreement) is what the windows say."""

from __future__ import annotations

import pytest

from experiments.common import ExperimentError
from lab import results_page, serving_real, serving_table


def _server(name: str, client: list[float], worker: list[list[float]], objective_s: float) -> dict:
    return serving_real.summarize("x", {
        "windows": {name: [{"p95_s": p, "answered": 10, "errors": 0} for p in client]},
        "readings": {name: worker}, "limits": {name: [[1.0, None], [2.0, 0.4]]},
        "cpu_cores": {name: 0.5}, "wall_s": 60.0, "machine_busy_cores": 1.2,
    }, {name: objective_s}, {name: 5.0}, 60.0)["servers"][0]


def test_a_run_is_summed_up_window_by_window_and_at_the_plateau() -> None:
    s = _server("a", [0.3, 0.3, 0.1, 0.1, 0.12, 0.1], [[10.0, 0.3], [45.0, 0.11], [55.0, 0.1]], 0.11)
    assert s["windows_met"] == 3 and s["windows"] == 6
    assert s["plateau_client_p95_s"] == pytest.approx(0.11)  # median of the last third's windows
    assert s["plateau_met"] is True
    assert s["plateau_worker_p95_s"] == pytest.approx(0.105)  # readings at or after 2/3 of the run
    assert s["worker_over_client"] == pytest.approx(0.955, abs=1e-3)
    assert s["limit_end"] == 0.4
    missed = _server("b", [0.1, 0.2, 0.3], [], 0.2)
    assert missed["plateau_met"] is False and missed["plateau_worker_p95_s"] is None
    assert missed["worker_over_client"] is None


FIXTURE = {
    "command": "python -m lab serving-real --cores 1.5 --duration-s 60",
    "servers": [{"name": "s1-resnet50", "kind": "serve", "model": "resnet50", "resolution_px": 64},
                {"name": "s2-mobilenetv2", "kind": "mlserver", "model": "mobilenetv2", "resolution_px": 64}],
    "machine": {"cpus": 2, "cpu": "x"}, "cores": 1.5, "duration_s": 60, "window_s": 10, "calibrate_s": 30, "shares": [0.4, 0.25], "tight": 0.7, "loose": 2.0,
    "calibration": {"rates_rps": {"s1-resnet50": 18.0, "s2-mobilenetv2": 20.0},
                    "objectives_s": {"s1-resnet50": 0.07, "s2-mobilenetv2": 0.2}},
    "runs": [
        {"policy": "default", "met_plateau": 1, "windows_met": 7, "windows": 12, "cpu_cores": 1.31, "machine_busy_cores": 1.9,
         "servers": [{"plateau_client_p95_s": 0.09, "plateau_worker_p95_s": 0.1, "worker_over_client": 1.111,
                      "plateau_met": False},
                     {"plateau_client_p95_s": 0.05, "plateau_worker_p95_s": 0.051, "worker_over_client": 1.02,
                      "plateau_met": True}]},
        {"policy": "learned", "met_plateau": 2, "windows_met": 10, "windows": 12, "cpu_cores": 1.29, "machine_busy_cores": 1.8,
         "servers": [{"plateau_client_p95_s": 0.06, "plateau_worker_p95_s": None, "worker_over_client": None,
                      "plateau_met": True},
                     {"plateau_client_p95_s": 0.15, "plateau_worker_p95_s": 0.15, "worker_over_client": 1.0,
                      "plateau_met": True}]},
    ],
}


def test_the_section_renders_from_a_small_summary() -> None:
    lines = serving_table.section_table(FIXTURE)
    assert lines[0] == ("| policy | met (plateau) | windows met | CPU (cores) | machine busy (cores) | s1-resnet50 client / worker p95 (ms) | "
                        "s2-mobilenetv2 client / worker p95 (ms) |")
    assert lines[2] == "| default | 1/2 | 7/12 | 1.31 | 1.90 | 90 / 100 (+11 %), missed | 50 / 51 ✓, met |"
    assert lines[3] == "| learned | 2/2 | 10/12 | 1.29 | 1.80 | 60 / -, met | 150 / 150 ✓, met |"
    text = serving_table.intro(FIXTURE, results_page.FILES["serving_real"])
    assert "2-core machine shared with other work" in text and "docs/data/serving-real.json" in text
    assert "s1-resnet50 70 ms at 18 requests/s" in text and "MLServer, mobilenetv2 at 64 px" in text


def test_servers_are_checked_with_one_line() -> None:
    assert [s.kind for s in serving_real.parse_servers(serving_real.SERVERS)] == ["serve", "serve", "mlserver"]
    for bad in ("serve:resnet50", "triton:resnet50:64,serve:a:1,serve:b:2", "serve:a:1,serve:b:2"):
        with pytest.raises(ExperimentError, match="--servers"):
            serving_real.parse_servers(bad)


def test_met_within_the_band_is_counted_beside_met_under_the_objective() -> None:
    # 0.115 is over the objective 0.11 but within (1 + 0.1) x it: within the band, not met.
    s = _server("a", [0.3, 0.115, 0.115, 0.2, 0.115, 0.115], [], 0.11)
    assert (s["windows_met"], s["windows_met_alpha"]) == (0, 4)
    assert s["plateau_met"] is False and s["plateau_met_alpha"] is True
    d = {**FIXTURE, "runs": [{**r, "met_plateau_alpha": r["met_plateau"] + 1, "windows_met_alpha": 11,
                              "servers": [{**x, "plateau_met_alpha": True} for x in r["servers"]]}
                             for r in FIXTURE["runs"][:1]]}
    lines = serving_table.section_table(d)
    assert lines[0].startswith("| policy | met (plateau) | windows met | met within the band (plateau) | "
                               "windows met within the band | CPU (cores) |")
    assert lines[2] == ("| default | 1/2 | 7/12 | 2/2 | 11/12 | 1.31 | 1.90 | 90 / 100 (+11 %), within the band "
                        "| 50 / 51 ✓, met |")
