"""On/off settings read from the environment (shared/settings.py `switch`): a value they cannot read is an error."""

from __future__ import annotations

import pytest

from services.worker.__main__ import parse


@pytest.mark.parametrize("raw, expected", [
    ("1", True), ("true", True), ("Yes", True), ("on", True),
    ("0", False), ("false", False), ("NO", False), ("off", False), ("", False),
])
def test_the_node_label_switch_reads_the_usual_words(monkeypatch, raw, expected):
    monkeypatch.setenv("DQOES_REQUIRE_NODE_LABEL", raw)
    assert parse(["--runtime", "docker"]).require_node_label is expected


@pytest.mark.parametrize("raw, expected", [("off", False), ("0", False), ("on", True), (" 1 ", True), ("", True)])
def test_the_weights_switch_keeps_its_default_on_when_unset(monkeypatch, raw, expected):
    monkeypatch.setenv("DQOES_CPU_WEIGHTS", raw)
    assert parse(["--runtime", "docker"]).cpu_weights is expected


def test_a_flag_beats_the_environment_both_ways(monkeypatch):
    monkeypatch.setenv("DQOES_REQUIRE_NODE_LABEL", "1")
    monkeypatch.setenv("DQOES_CPU_WEIGHTS", "0")
    cfg = parse(["--runtime", "docker", "--no-require-node-label", "--cpu-weights"])
    assert (cfg.require_node_label, cfg.cpu_weights) == (False, True)


@pytest.mark.parametrize("env", ["DQOES_REQUIRE_NODE_LABEL", "DQOES_CPU_WEIGHTS"])
def test_an_unreadable_value_is_a_clear_error_not_a_silent_default(monkeypatch, capsys, env):
    monkeypatch.setenv(env, "maybe")
    with pytest.raises(SystemExit) as e:
        parse(["--runtime", "docker"])
    assert e.value.code == 2
    assert f"${env}: 'maybe' is not one of 1, true, yes, on, 0, false, no, off" in capsys.readouterr().err
