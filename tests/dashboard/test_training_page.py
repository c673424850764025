"""The Training page: completion bars FlowCon vs default, G and CPU share, from real simulator timelines."""

from __future__ import annotations

import json
from pathlib import Path

from dash_helpers import app_test

from dashboard import config, training
from experiments import training as training_exp

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "dashboard" / "app.py")


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    training_exp.compare("flowcon-3jobs", 2, out=str(tmp_path))
    f = tmp_path / "flowcon-3jobs_flowcon_seed2.jsonl"
    d = tmp_path / "flowcon-3jobs_default_seed2.jsonl"
    assert f.exists() and d.exists()
    return f, d


def test_frames_and_figures_from_timelines(tmp_path):
    f, d = _pair(tmp_path)
    assert training.is_training_timeline(f) and not training.is_training_timeline(tmp_path / "missing.jsonl")
    rf, rd = training.load(f), training.load(d)
    assert rf.policy == "flowcon" and rd.policy == "default" and rf.scenario == "flowcon-3jobs"
    result = json.loads(f.read_text().splitlines()[-1])
    df = training.completion_frame([rf, rd])
    assert len(df) == 6
    got = df[df.policy == "flowcon"].set_index("job")["completion_s"].to_dict()
    assert got == result["completion_s"]
    assert not rf.jobs.empty and rf.jobs["cpu_share"].between(0, 1).all()
    assert set(rf.jobs["stage"]) <= {"NL", "WL", "CL"} and set(rd.jobs["stage"]) == {"-"}
    for chart in (training.completion_chart(df), training.growth_chart(rf), training.share_chart(rd)):
        assert chart.to_dict()["data"]
    assert training.counterpart(f, [d]) == d and training.counterpart(d, [f]) == f
    s = training.summary_sentence(rf, rd)
    assert "makespan" in s and "flowcon vs default" in s


def test_the_page_shows_both_runs(tmp_path, monkeypatch):
    _pair(tmp_path)
    monkeypatch.setenv(config.SOURCES_ENV, "")
    monkeypatch.setenv(config.RUNS_ENV, str(tmp_path))
    at = app_test(monkeypatch, APP)
    at.run()
    at.switch_page("app_pages/training.py")
    at.run()
    assert not at.exception, at.exception
    assert any("makespan" in m.value for m in at.markdown)
    assert len(at.get("vega_lite_chart")) == 5  # the bars, then G and share for each run


def test_the_page_says_what_to_do_without_timelines(tmp_path, monkeypatch):
    monkeypatch.setenv(config.SOURCES_ENV, "")
    monkeypatch.setenv(config.RUNS_ENV, str(tmp_path))
    at = app_test(monkeypatch, APP)
    at.run()
    at.switch_page("app_pages/training.py")
    at.run()
    assert not at.exception
    assert any("dqoes experiment compare flowcon" in i.value for i in at.info)


def _state(node: str, at: float, jobs: list[tuple[str, str, float | None, float | None]]):
    from shared.schema import TrainingJobState, TrainingState

    return TrainingState(node=node, policy="flowcon", cores=4.0, round=1, at=at, interval_s=10.0, training_share=1.0,
                         jobs=tuple(TrainingJobState(job=j, stage=st, growth=g, cpu_cores=c, limit=1.0)
                                    for j, st, g, c in jobs))


def test_live_training_rounds_become_the_pages_rows():
    from dashboard.live import History

    h = History("live")
    h.add_training_state(_state("w1", 1000.0, [("a", "NL", None, None), ("b", "CL", 0.01, 1.0)]))
    h.add_training_state(_state("w1", 1010.0, [("a", "NL", 0.2, 3.0), ("b", "CL", 0.005, 1.0)]))
    run = training.live_run("live", tuple(h.training_rows))
    assert run.policy == "flowcon" and len(run.jobs) == 4
    latest = training.latest_jobs(run).set_index("job")
    assert latest.loc["a", "growth"] == 0.2 and latest.loc["a", "cpu_share"] == 0.75
    assert latest.loc["b", "stage"] == "CL" and list(latest["t"]) == [10.0, 10.0]
    assert training.growth_chart(run).to_dict()["data"]


def test_the_collector_follows_training_states(nats_url):
    import asyncio
    import time

    from dashboard.live import Collector
    from shared import subjects
    from shared.bus import Bus

    coll = Collector([("dqoes", nats_url)], retry_s=0.5).start()
    try:
        assert coll.wait_first_attempt(5)

        async def publish() -> None:
            bus = await Bus.connect(nats_url, "test-training-states")
            await bus.publish(subjects.training("w9"), _state("w9", time.time(), [("j1", "WL", 0.1, 2.0)]))
            await bus.flush()
            await bus.close()

        for _ in range(50):
            asyncio.run(publish())
            rows = coll.snapshot().sources[0].training
            if rows:
                break
            time.sleep(0.1)
        assert rows and rows[-1]["job"] == "j1" and rows[-1]["node"] == "w9" and rows[-1]["cpu_share"] == 0.5
    finally:
        coll.stop()
