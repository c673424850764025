"""The processes a worker starts connect as the node's inference identity, never as the worker (issue 62).

The worker's identity may move limits; an inference process holding it could. A real credentials
directory (`shared.auth.ensure`), the worker's own command-line parsing, and the command lines the
cgroup runtime would run.
"""

from __future__ import annotations

import json

import pytest

from services.worker.__main__ import parse
from services.worker.app import ConfigError, inference_identity, runtime_settings
from shared import auth
from shared.runtime.factory import inference_argv, node_containers
from shared.scenarios.builtin import load


@pytest.fixture(autouse=True)
def no_credentials_from_the_environment(monkeypatch):
    for name in (auth.CREDS_ENV, "DQOES_INFERENCE_CREDS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def scenario_file(tmp_path):
    f = tmp_path / "one.json"
    f.write_text(json.dumps({"name": "one", "duration_s": 100, "nodes": [{"name": "n1", "cores": 2}],
                             "containers": [{"name": "c1", "model": "resnet50", "objective_s": 5.0}]}))
    return str(f)


def worker(auth_dir, scenario_file, *extra):
    return parse(["--node", "n1", "--runtime", "cgroup", "--scenario", scenario_file, "--nats", "nats://127.0.0.1:4222",
                  "--creds", str(auth.creds_path(auth_dir, "worker-n1")), *extra])


def test_inference_processes_get_the_nodes_inference_identity(tmp_path, scenario_file):
    d = tmp_path / "auth"
    auth.ensure(d, ["n1"])
    cfg = worker(d, scenario_file)
    worker_file = str(auth.creds_path(d, "worker-n1"))
    assert auth.creds_of(cfg.nats_url) == worker_file  # the worker itself connects as worker-n1
    scenario = load(scenario_file)
    settings = runtime_settings(cfg, scenario)
    argv = inference_argv(node_containers(scenario, "n1")[0], settings)
    assert argv[argv.index("--creds") + 1] == str(auth.creds_path(d, "inference-n1"))
    assert argv[argv.index("--nats") + 1] == "nats://127.0.0.1:4222"
    assert not any(worker_file in a or "worker-n1" in a for a in argv)
    # Training jobs too: a file for a local process, the same identity in the URL for a container.
    url, creds = inference_identity(cfg)
    assert creds == str(auth.creds_path(d, "inference-n1")) and auth.creds_of(url) in (None, creds)


def test_an_explicit_inference_identity_wins(tmp_path, scenario_file):
    d = tmp_path / "auth"
    auth.ensure(d, ["n1"])
    other = tmp_path / "elsewhere.creds"
    other.write_text(auth.creds_path(d, "inference-n1").read_text())
    cfg = worker(d, scenario_file, "--inference-creds", str(other))
    assert inference_identity(cfg) == ("nats://127.0.0.1:4222", str(other))


def test_a_worker_without_an_inference_identity_refuses_to_start_processes(tmp_path, scenario_file):
    d = tmp_path / "auth"
    auth.ensure(d, ["n1"])
    auth.creds_path(d, "inference-n1").unlink()
    cfg = worker(d, scenario_file)
    with pytest.raises(ConfigError, match="inference-n1"):
        runtime_settings(cfg, load(scenario_file))
    # Nothing to start (no scenario, or a runtime that starts nothing): nothing to refuse.
    assert runtime_settings(cfg, None).nats_creds is None


def test_without_authentication_processes_get_the_plain_url(tmp_path, scenario_file):
    cfg = parse(["--node", "n1", "--runtime", "cgroup", "--scenario", scenario_file,
                 "--nats", "nats://127.0.0.1:4222"])
    argv = inference_argv(node_containers(load(scenario_file), "n1")[0], runtime_settings(cfg, load(scenario_file)))
    assert "--creds" not in argv and argv[argv.index("--nats") + 1] == "nats://127.0.0.1:4222"
