"""A service's text log keeps one record to a line whatever a message carries (shared/settings.py)."""

from __future__ import annotations

import logging

import pytest

from shared.settings import one_line, setup_logging


@pytest.fixture
def root_restored():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_name_with_a_newline_cannot_forge_a_record(capsys, root_restored):
    setup_logging("info", "text", name="worker")
    logging.getLogger("t").warning("refused: %s", "x\n00:00:00 worker INFO t: all is well\x1b[2J")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("t").exception("with a traceback")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0].endswith(r"refused: x\n00:00:00 worker INFO t: all is well\x1b[2J")
    assert not any(line.startswith("00:00:00") for line in lines)
    assert "Traceback (most recent call last):" in lines  # a traceback keeps its own lines


def test_printable_text_is_left_as_it_is():
    assert one_line("objective for c1 set to 4 s (é, ü)") == "objective for c1 set to 4 s (é, ü)"
    assert one_line("a\tb\r\n") == r"a\tb\r\n"
