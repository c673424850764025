"""Pointers to running deployments and the data directory lock (services/cli/deployments.py)."""

from __future__ import annotations

import os

import orjson
import pytest

from services.cli import deployments


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("DQOES_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_a_pointer_counts_only_while_its_process_holds_the_data_directory(state, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    deployments.write_pointer(data, [{"name": "dqoes", "nats_url": "nats://127.0.0.1:1", "auth_dir": None}])
    # Our PID is alive, but nobody holds the lock: a reused PID, not a deployment.
    assert deployments.running() == []
    assert not list((state / "deployments").iterdir())
    fd = deployments.lock_data_dir(data)
    try:
        deployments.write_pointer(data, [{"name": "dqoes", "nats_url": "nats://127.0.0.1:1", "auth_dir": None}])
        [info] = deployments.running()
        assert info["pid"] == os.getpid() and info["data_dir"] == str(data)
        assert deployments.choose(str(os.getpid())) == info == deployments.choose(str(data))
        with pytest.raises(deployments.DeploymentError, match="no such deployment running"):
            deployments.choose("1")
        with pytest.raises(deployments.DeploymentError, match=f"in use by another `dqoes up` \\(PID {os.getpid()}\\)"):
            deployments.lock_data_dir(data)
    finally:
        os.close(fd)
    assert deployments.choose(None) is None  # the lock went with the descriptor


def test_another_users_or_a_malformed_pointer_is_ignored(state, tmp_path):
    d = deployments.pointers_dir()
    (d / "123.json").write_bytes(b"not json")
    (d / "456.json").write_bytes(orjson.dumps({"pid": "x"}))
    assert deployments.running() == []
    if os.geteuid() == 0:
        data = tmp_path / "data"
        data.mkdir()
        fd = deployments.lock_data_dir(data)
        try:
            p = deployments.write_pointer(data, [])
            os.chown(p, 65534, 65534)  # as if nobody had written it
            assert deployments.running() == []
        finally:
            os.close(fd)
