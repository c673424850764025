"""Every lab `--from` that reads back an earlier run: a file that is not one is a clear error (exit 2) that
measures nothing and writes nothing, where it was a traceback or, for calibrate-training, a new
measurement of its own; the same for a replay of a directory that is not a run."""

from __future__ import annotations

import pytest

from lab.cli import main

NOT_OURS = ["[]", "[1]", '{"real": 3}', '{"rows": [1], "machine": {}}', '{"raw": {"vae": 3}}', '{"runs": 3}',
            '{"machine": {}, "result": {"conditions": [1]}}']


@pytest.mark.parametrize("content", NOT_OURS)
@pytest.mark.parametrize("command", [
    ["calibrate-training", "--models", "vae"],
    ["training-real"],
    ["threads"],
    ["weights"],
])
def test_a_file_that_is_not_an_earlier_run_is_a_clear_error(tmp_path, capsys, monkeypatch, command, content):
    import lab.training_calibrate as tc

    def no_measuring(*a, **k):
        raise AssertionError("--from measured")

    monkeypatch.setattr(tc, "measure", no_measuring)
    src = tmp_path / "old.json"
    src.write_text(content)
    md = tmp_path / "results.md"
    md.write_text("# Results\n")
    update = ["--update", str(md)] if command[0] != "calibrate-training" else []
    assert main([*command, "--from", str(src), *update]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lab: error: --from") and "Traceback" not in err, err
    assert md.read_text() == "# Results\n"


@pytest.mark.parametrize("summary, record", [
    ("{}", '{"kind": "decision", "t_s": 1, "containers": {}}'),
    ("[1, 2]", '{"kind": "decision", "t_s": 1, "containers": {}}'),
    ('{"cores": -1}', '{"kind": "decision", "t_s": 1, "containers": {}}'),
    ('{"cores": "two"}', '{"kind": "decision", "t_s": 1, "containers": {}}'),
    ('{"cores": 2}', '{"kind": "decision", "t_s": 1, "containers": 5}'),
    ('{"cores": 2}', '{"kind": "batch", "container": "c01", "latency_s": 1}'),
])
def test_replay_of_a_directory_that_is_not_a_run_is_a_clear_error(tmp_path, capsys, summary, record):
    (tmp_path / "summary.json").write_text(summary)
    (tmp_path / "learned.jsonl").write_text(record + "\n")
    assert main(["replay", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lab: error:") and "Traceback" not in err, err
