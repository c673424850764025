"""A worker given no node name takes its engine's (`docker info` Name), as a worker in a container must.

Inside a container the hostname is the container's id; the engine reached
through the mounted socket knows its host's name, which is also the Swarm
node's hostname (tests/multihost runs the worker that way on three engines).
"""

from __future__ import annotations

from typing import Any

import pytest

from services.worker.__main__ import main, parse, with_node
from shared.runtime.base import RuntimeFailure
from shared.runtime.docker import engine_name


def test_engine_name_is_what_docker_info_calls_the_engine(docker_client: Any) -> None:
    assert engine_name() == docker_client.info()["Name"]


def test_an_unreachable_engine_is_a_one_line_runtime_failure(tmp_path: Any) -> None:
    with pytest.raises(RuntimeFailure, match="cannot ask the docker engine its name"):
        engine_name(f"unix://{tmp_path}/no-engine.sock", timeout_s=2.0)


def test_the_docker_worker_without_a_node_takes_the_engines_name(
    docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DQOES_NODE", raising=False)
    assert parse(["--runtime", "docker"]).node == ""  # parsing asks no engine
    assert with_node(parse(["--runtime", "docker"])).node == docker_client.info()["Name"]
    assert with_node(parse(["--runtime", "docker", "--node", "n7"])).node == "n7"


def test_without_an_engine_the_worker_asks_for_a_node(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DQOES_NODE", raising=False)
    assert main(["--runtime", "docker", "--docker-url", f"unix://{tmp_path}/no-engine.sock"]) == 2
    err = capsys.readouterr().err
    assert "cannot ask the docker engine its name" in err and "give --node" in err
