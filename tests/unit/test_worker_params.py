"""The worker's `--param`: a policy's parameters from the start (what `dqoes control` sets at runtime)."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.__main__ import parse
from services.worker.app import ConfigError, WorkerConfig, build, policy_settings
from shared.core import registry


def test_params_from_the_flag_or_the_environment_reach_the_policy(monkeypatch):
    cfg = parse(["--runtime", "docker", "--policy", "learned", "--param", "half_life_s=0, dead_band=0.1"])
    assert cfg.params == (("half_life_s", 0.0), ("dead_band", 0.1))
    params = registry.params_for("learned", policy_settings(cfg, None))
    assert params.half_life_s == 0.0 and params.dead_band == 0.1
    monkeypatch.setenv("DQOES_POLICY_PARAMS", "half_life_s=30")
    cfg = parse(["--runtime", "docker", "--policy", "learned", "--alpha", "0.2"])
    assert policy_settings(cfg, None) == {"alpha": 0.2, "half_life_s": 30.0}


@pytest.mark.parametrize(("text", "says"), [
    ("half_life_s", "expected NAME=VALUE, got 'half_life_s'"), ("=3", "expected NAME=VALUE, got '=3'"),
    ("half_life_s=", "half_life_s: expected a number, got ''"),
    ("half_life_s=fast", "half_life_s: expected a number, got 'fast'"),
    ("half_life_s=nan", "half_life_s: must be a finite number, got 'nan'")])
def test_a_malformed_param_is_a_usage_error(text, says, capsys):
    with pytest.raises(SystemExit) as e:
        parse(["--runtime", "docker", "--policy", "learned", "--param", text])
    assert e.value.code == 2
    assert f"--param: {says}" in capsys.readouterr().err


def test_an_unknown_name_or_a_bad_value_stops_the_worker_before_it_connects():
    # No NATS server at this URL: the configuration is refused before any connection is tried.
    url = "nats://127.0.0.1:9"
    with pytest.raises(ConfigError, match="--param: policy learned has no parameter half_life "):
        asyncio.run(build(WorkerConfig(node="n1", nats_url=url, policy="learned", runtime="docker",
                                       params=(("half_life", 60.0),))))
    with pytest.raises(ConfigError, match="half_life_s must be a number"):
        asyncio.run(build(WorkerConfig(node="n1", nats_url=url, policy="learned", runtime="docker",
                                       params=(("half_life_s", -1.0),))))
    with pytest.raises(ConfigError, match="dqoes has no parameter half_life_s"):
        asyncio.run(build(WorkerConfig(node="n1", nats_url=url, policy="dqoes", runtime="docker",
                                       params=(("half_life_s", 60.0),))))
