"""docs/results.md is exactly what `make results` renders from the summaries in docs/data, and the renderer
refuses a summary it cannot read with one line, writing nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from lab import results_page

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_what_make_results_renders(tmp_path):
    out = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "-m", "lab", "results", "render", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == (REPO / "docs" / "results.md").read_bytes()


def test_the_page_stays_short_and_every_table_names_its_source():
    page = results_page.render(results_page.DATA)
    assert page.count("\n") <= 400
    for name in results_page.FILES.values():
        assert f"docs/data/{name}" in page
    # The oracle bound is the ceiling row of every simulated and real table.
    assert page.count("| oracle bound (ceiling) |") >= 20


def test_check_says_when_the_page_is_stale(tmp_path):
    stale = tmp_path / "results.md"
    stale.write_text("# Results\n\nsomething typed in\n")
    assert results_page.main(["render", "--out", str(stale), "--check"]) == 1
    assert stale.read_text() == "# Results\n\nsomething typed in\n"


def test_means_carry_their_standard_error():
    assert results_page.mean_se([1, 2, 3]) == (2.0, pytest.approx(1 / 3 ** 0.5))
    assert results_page.pm(*results_page.mean_se([1, 2, 3])) == "2.0 ± 0.6"
    assert results_page.pm(4.0) == "4.0" and results_page.pm(None) == "-"


def test_a_missing_or_broken_summary_is_one_line_and_writes_nothing(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for name in results_page.FILES.values():
        (data / name).write_bytes((results_page.DATA / name).read_bytes())
    out = tmp_path / "results.md"
    (data / results_page.FILES["real"]).write_bytes(orjson.dumps({"runs": [{"policy": "learned"}]}))
    assert results_page.main(["--data", str(data), "render", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("results: error:") and "\n" not in err and not out.exists()
    (data / results_page.FILES["stress"]).unlink()
    assert results_page.main(["--data", str(data), "render", "--out", str(out)]) == 2
    assert "bench-stress.json: no such file" in capsys.readouterr().err and not out.exists()
    assert results_page.main(["simulate", "--seeds", "5-1"]) == 2
    assert "--seeds" in capsys.readouterr().err


def test_the_stored_simulations_are_what_the_code_gives_now():
    """`make results` simulates the paper's and the training scenarios again; one seed of one of each, run
    here, gives exactly what the stored summaries hold, so a policy change that moves them shows up."""
    from experiments import report, training

    paper = results_page.read(results_page.DATA, "paper")["paper-varied"]
    fresh = report.report_data(["paper-varied"], [paper["seeds"][0]])["paper-varied"]
    for pol, v in fresh["policies"].items():
        stored = paper["policies"][pol]
        assert (v["met"][0], v["in_band"][0], v["cpu_cores"][0]) == (
            stored["met"][0], stored["in_band"][0], stored["cpu_cores"][0]), pol
    assert fresh["oracle_bound"]["met"][0] == paper["oracle_bound"]["met"][0]
    jobs = results_page.read(results_page.DATA, "training")["flowcon-3jobs"]
    again = training.report_data(["flowcon-3jobs"], [jobs["seeds"][0]])["flowcon-3jobs"]
    for pol in ("flowcon", "default"):
        assert again["policies"][pol]["makespan_s"][0] == jobs["policies"][pol]["makespan_s"][0]


def test_real_runs_are_collected_added_and_replaced_by_name_and_rendered_per_node(tmp_path, capsys):
    from tests.lab.test_real_index import summary

    data = tmp_path / "data"
    first = tmp_path / "real-a.json"
    first.write_text(orjson.dumps(summary("2026-11-27 09:00", {"learned": {"met": 4, "band": 3, "cpu": 1.8},
                                                                "default": {"met": 2, "band": 0}})).decode())
    assert results_page.main(["--data", str(data), "real-runs", str(first)]) == 0
    again = tmp_path / "real-b.json"
    again.write_text(orjson.dumps(summary("2026-11-27 10:00", {"learned": {"met": 2, "band": 1, "cpu": 1.9}})).decode())
    first.write_text(orjson.dumps(summary("2026-11-27 09:00", {"learned": {"met": 3, "band": 3, "cpu": 1.8}})).decode())
    assert results_page.main(["--data", str(data), "real-runs", str(first), str(again)]) == 0
    runs = results_page.read(data, "real")["runs"]
    # real-a was replaced (its default run is gone), real-b added.
    assert sorted((r["run"], r["policy"], r["met"]) for r in runs) == [("real-a", "learned", 3), ("real-b", "learned", 2)]
    table = "\n".join(results_page.real_table(results_page.read(data, "real")))
    assert "| docker, 2 cores, 5 containers | learned | 2 | 2.5 ± 0.5 | 2.0 ± 1.0 | 1.85 ± 0.05 |" in table
    assert "| docker, 2 cores, 5 containers | oracle bound (ceiling) | 2 | 4.0 ± 0.0 | 4.0 ± 0.0 | - |" in table
    # A file that is not such a summary: one line, nothing written.
    before = (data / "real-runs.json").read_bytes()
    bad = tmp_path / "real-c.json"
    bad.write_text("{}")
    assert results_page.main(["--data", str(data), "real-runs", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("results: error:") and (data / "real-runs.json").read_bytes() == before
