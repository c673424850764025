"""`dqoes experiment real --from` reads back an earlier run: a file that is not one is a clear error (exit 2)
that measures nothing and writes nothing (the lab's own --from: tests/lab/test_lab_from_files.py)."""

from __future__ import annotations

import pytest

from services.cli.main import main

NOT_OURS = ["[]", "[1]", '{"real": 3}', '{"rows": [1], "machine": {}}', '{"raw": {"vae": 3}}', '{"runs": 3}',
            '{"machine": {}, "result": {"conditions": [1]}}']


@pytest.mark.parametrize("content", NOT_OURS)
def test_a_file_that_is_not_an_earlier_run_is_a_clear_error(tmp_path, capsys, content):
    src = tmp_path / "old.json"
    src.write_text(content)
    md = tmp_path / "results.md"
    md.write_text("# Results\n")
    assert main(["experiment", "real", "--from", str(src), "--update", str(md)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dqoes: error: --from") and "Traceback" not in err, err
    assert md.read_text() == "# Results\n"
