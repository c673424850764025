"""`python -m lab real-index`: the table of every stored real run, and the goals counted from it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from experiments.common import ExperimentError
from lab import real_index
from lab.cli import main


def summary(started: str, runs: dict[str, dict], bound=(4, 4), cores=2.0, runtime="docker", n=5) -> dict:
    real = {}
    for p, r in runs.items():
        real[p] = {"met_final": r["met"], "satisfied_final": r["band"], "total_cpu_cores_final": r.get("cpu", 1.9)}
        if "half" in r:
            real[p]["met_mean_second_half"], real[p]["satisfied_mean_second_half"] = r["half"]
        if "expected" in r:
            real[p]["oracle_under_noise"] = {"met_expected": r["expected"][0], "in_band_expected": r["expected"][1]}
            if "count" in r:  # the oracle's lower median in band under the noise
                real[p]["oracle_under_noise"]["in_band"] = r["count"]
    return {"started_at": f"{started} UTC", "runtime": runtime, "cores": cores,
            "containers": [{"name": f"c{i:02d}"} for i in range(n)], "real": real,
            "sim": {p: {"oracle_met": bound[0], "oracle_satisfied": bound[1]} for p in runs}}


def test_each_run_is_checked_against_default_in_the_same_run_and_against_its_bound():
    d = summary("2026-11-27 09:00", {"learned": {"met": 3, "band": 3}, "default": {"met": 4, "band": 1}})
    rows = {r["policy"]: r for r in real_index.run_rows("real-a", d)}
    assert rows["learned"]["met_not_below_default"] is False  # 3 met where default met 4
    assert rows["learned"]["in_band_within_one_of_bound"] is True  # 3 >= 4 - 1
    assert rows["default"]["met_not_below_default"] is None  # default is not measured against itself
    assert rows["default"]["in_band_within_one_of_bound"] is False
    alone = summary("2026-11-27 10:00", {"learned": {"met": 4, "band": 2}})
    (row,) = real_index.run_rows("real-b", alone)
    assert row["met_not_below_default"] is None and row["default_met"] is None  # no default beside it
    assert row["in_band_within_one_of_bound"] is False


def test_the_oracle_with_the_measured_work_is_preferred_where_the_summary_has_it():
    d = summary("2026-11-27 09:00", {"learned": {"met": 3, "band": 2, "half": (3.0, 1.5), "expected": (3.5, 2.0)}})
    d["real"]["learned"]["oracle_measured_work"] = {"under_noise": {"met_expected": 3.0, "in_band_expected": 1.5}}
    (row,) = real_index.run_rows("real-a", d)
    assert (row["expected_met"], row["expected_in_band"]) == (3.0, 1.5)


def test_the_summary_counts_the_learned_runs_per_kind_of_node_and_not_its_variants(tmp_path):
    files = []
    for name, d in {
        "real-a": summary("2026-11-27 09:00", {"learned": {"met": 4, "band": 3, "half": (3.0, 2.0), "expected": (3.0, 2.5)},
                                               "default": {"met": 3, "band": 1}}),
        "real-b": summary("2026-11-26 09:00", {"learned": {"met": 2, "band": 1, "half": (2.0, 1.0), "expected": (4.0, 2.0)},
                                               "learned:pool_work=0": {"met": 5, "band": 5}}),
        "real-host": summary("2026-11-27 11:00", {"learned": {"met": 13, "band": 5}, "default": {"met": 14, "band": 3}},
                             bound=(15, 10), cores=8.0, runtime="cgroup", n=16),
    }.items():
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(d))
    rows = real_index.read_runs(real_index.summary_files([str(tmp_path)]))
    assert [r["run"] for r in rows][:2] == ["real-b", "real-b"]  # oldest first
    kinds = {s["node"]: s for s in real_index.summarise(rows)}
    docker = kinds["docker, 2 cores, 5 containers"]
    assert docker["runs"] == 2  # learned:pool_work=0 is listed, not counted
    assert (docker["met_not_below_default"], docker["beside_default"]) == (1, 1)
    assert (docker["in_band_within_one_of_bound"], docker["with_bound"]) == (1, 2)
    assert docker["in_band_over_expected_median"] == pytest.approx((0.8 + 0.5) / 2)
    assert docker["in_band_over_expected_range"] == pytest.approx([0.5, 0.8])
    assert docker["met_over_expected_range"] == pytest.approx([0.5, 1.0])
    host = kinds["cgroup, 8 cores, 16 containers"]
    assert (host["met_not_below_default"], host["beside_default"]) == (0, 1)
    assert host["in_band_over_expected_median"] is None  # no second-half means in that summary
    points = real_index.figure_rows(rows)
    # Only runs with both a second-half mean and the oracle's expectation are drawn, met and in band each.
    assert sorted((p["run"], p["count"], p["got"], p["expected"]) for p in points) == [
        ("real-a", "in band", 2.0, 2.5), ("real-a", "met", 3.0, 3.0),
        ("real-b", "in band", 1.0, 2.0), ("real-b", "met", 2.0, 4.0)]
    md = real_index.render_markdown(rows, real_index.summarise(rows), "data")
    assert "| docker, 2 cores, 5 containers | 2 | 1 of 1 | 1 of 2 | 0 of 0 | 0.65 (0.50-0.80; 2 runs) |" in md
    assert "| [real-host](data/real-host.json) | 2026-11-27 11:00 | cgroup, 8 cores, 16 containers | learned | 13 / 5 |" in md


def test_in_band_is_also_checked_against_the_oracles_count_under_the_runs_noise():
    # A noisy draw: the noise-free bound is 4, the oracle under the run's noise keeps 2 in band (lower median).
    noisy = summary("2026-11-27 09:00", {"learned": {"met": 4, "band": 1, "expected": (3.9, 2.3), "count": 2},
                                         "default": {"met": 2, "band": 0, "expected": (3.0, 1.2), "count": 3}})
    rows = {r["policy"]: r for r in real_index.run_rows("real-a", noisy)}
    assert rows["learned"]["in_band_within_one_of_bound"] is False  # 1 < 4 - 1
    assert rows["learned"]["in_band_within_one_of_expected"] is True  # 1 >= 2 - 1
    assert rows["default"]["in_band_within_one_of_expected"] is False  # 0 < 3 - 1
    # Measured work is preferred here too; a summary without the count is not counted either way.
    noisy["real"]["learned"]["oracle_measured_work"] = {"under_noise": {"met_expected": 3.9, "in_band_expected": 3.1,
                                                                        "in_band": 3}}
    assert real_index.run_rows("real-a", noisy)[0]["in_band_within_one_of_expected"] is False  # 1 < 3 - 1
    older = summary("2026-11-26 09:00", {"learned": {"met": 4, "band": 3, "expected": (3.9, 2.3)}})
    (old,) = real_index.run_rows("real-b", older)
    assert old["in_band_within_one_of_expected"] is None and old["expected_in_band_count"] is None
    both = real_index.run_rows("real-a", summary("2026-11-27 09:00", {"learned": {"met": 4, "band": 1,
                                                                                   "expected": (3.9, 2.3), "count": 2}}))
    (kind,) = real_index.summarise(both + [old])
    assert (kind["in_band_within_one_of_expected"], kind["with_expected_count"]) == (1, 1)
    assert (kind["in_band_within_one_of_bound"], kind["with_bound"]) == (1, 2)
    md = real_index.render_markdown(both + [old], [kind], "data")
    assert "| docker, 2 cores, 5 containers | 2 | 0 of 0 | 1 of 2 | 1 of 1 |" in md
    assert "| 3.90 / 2.30 (2) | - | no | yes |" in md
    assert "| 3.90 / 2.30 | - | yes | - |" in md


def test_runs_with_cpu_weights_count_as_a_kind_of_node_of_their_own():
    plain = summary("2026-11-28 09:00", {"learned": {"met": 5, "band": 4}}, bound=(5, 5), n=8)
    weighted = dict(summary("2026-11-28 12:00", {"learned": {"met": 6, "band": 5}}, bound=(5, 5), n=8),
                    cpu_weights=True)
    rows = real_index.run_rows("real-plain", plain) + real_index.run_rows("real-weighted", weighted)
    kinds = {s["node"]: s["runs"] for s in real_index.summarise(rows)}
    assert kinds == {"docker, 2 cores, 8 containers": 1, "docker, 2 cores, 8 containers, CPU weights": 1}


def test_one_run_is_one_run():
    one = summary("2026-11-27 09:00", {"learned": {"met": 4, "band": 3, "half": (3.0, 2.0), "expected": (3.0, 2.5)}})
    rows = real_index.run_rows("real-a", one)
    md = real_index.render_markdown(rows, real_index.summarise(rows), "data")
    assert "| 0.80 (0.80-0.80; 1 run) | 1.00 (1.00-1.00; 1 run) |" in md


def test_the_command_writes_its_section_and_json_and_refuses_what_is_not_a_summary(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "real-a.json").write_text(json.dumps(
        summary("2026-11-27 09:00", {"learned": {"met": 4, "band": 3}, "default": {"met": 3, "band": 1}})))
    md = tmp_path / "results.md"
    md.write_text(f"# Results\n\n{real_index.BEGIN}\nstale table\n{real_index.END}\n\nafter\n")
    svg = tmp_path / "img" / "index.svg"
    svg.parent.mkdir()
    assert main(["real-index", str(data), "--update", str(md), "--plot", str(svg), "--json"]) == 0
    ET.fromstring(svg.read_text())
    text = md.read_text()
    assert "](img/index.svg)" in text
    assert "stale table" not in text and text.endswith("after\n")
    assert "| [real-a](data/real-a.json) |" in text
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["summary"][0]["met_not_below_default"] == 1 and len(out["runs"]) == 2
    (data / "real-bad.json").write_text(json.dumps({"real": {}}))
    before = md.read_text()
    assert main(["real-index", str(data), "--update", str(md)]) == 2
    assert "real-bad.json: not a summary" in capsys.readouterr().err
    assert md.read_text() == before  # nothing written
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ExperimentError, match="no summaries"):
        real_index.summary_files([str(empty)])
    with pytest.raises(ExperimentError, match="no such file"):
        real_index.summary_files([str(tmp_path / "missing")])
