"""The host roles' configuration: TOML file < environment < flag, and one-line errors (hostconfig.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.cli import hostconfig
from services.cli.common import CliError

REPO = Path(__file__).resolve().parents[2]


def _parser(section: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    hostconfig.add_flags(p, section)
    return p


def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for s in hostconfig.SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    monkeypatch.delenv(hostconfig.CONFIG_ENV, raising=False)


def test_file_then_environment_then_flag(tmp_path, monkeypatch):
    _clean(monkeypatch)
    f = tmp_path / "dqoes.toml"
    f.write_text('state_dir = "/from/file"\n[node]\nruntime = "cgroup"\npolicy = "dqoes"\ncores = 3\n'
                 'name = "file-name"\n')
    args = _parser("node").parse_args(["--config", str(f)])
    cfg = hostconfig.resolve(args, "node")
    assert (cfg["runtime"], cfg["policy"], cfg["cores"], cfg["name"], cfg["state_dir"]) == (
        "cgroup", "dqoes", 3.0, "file-name", "/from/file")
    assert cfg["time_scale"] == 1.0  # not in the file: the default
    monkeypatch.setenv("DQOES_RUNTIME", "sim")
    monkeypatch.setenv("DQOES_CORES", "5")
    cfg = hostconfig.resolve(args, "node")
    assert (cfg["runtime"], cfg["cores"], cfg["policy"]) == ("sim", 5.0, "dqoes")
    args = _parser("node").parse_args(["--config", str(f), "--runtime", "docker", "--policy", "default"])
    cfg = hostconfig.resolve(args, "node")
    assert (cfg["runtime"], cfg["cores"], cfg["policy"]) == ("docker", 5.0, "default")


def test_config_from_the_environment_variable_and_booleans(tmp_path, monkeypatch):
    _clean(monkeypatch)
    f = tmp_path / "c.toml"
    f.write_text("[control_plane]\nport = 4333\naccept_joins = false\n")
    monkeypatch.setenv(hostconfig.CONFIG_ENV, str(f))
    cfg = hostconfig.resolve(_parser("control_plane").parse_args([]), "control_plane")
    assert (cfg["port"], cfg["accept_joins"], cfg["listen"]) == (4333, False, "127.0.0.1")
    cfg = hostconfig.resolve(_parser("control_plane").parse_args(["--accept-joins"]), "control_plane")
    assert cfg["accept_joins"] is True
    monkeypatch.setenv("DQOES_ACCEPT_JOINS", "maybe")
    with pytest.raises(CliError, match=r"\$DQOES_ACCEPT_JOINS: control_plane.accept_joins: expected bool"):
        hostconfig.resolve(_parser("control_plane").parse_args([]), "control_plane")


@pytest.mark.parametrize(("text", "message"), [
    ("[node]\nruntme = 'docker'\n", "unknown key node.runtme (known in [node]: name, control_plane"),
    ("colour = 'blue'\n", "unknown key colour"),
    ("[nodes]\nname = 'a'\n", "unknown table [nodes]"),
    ("[control_plane]\nport = 'many'\n", "control_plane.port: expected int, got 'many'"),
    ("[node]\nruntime = 'kubernetes'\n", "node.runtime: 'kubernetes' is not one of docker, cgroup, sim"),
    ("[node\n", "not valid TOML"),
])
def test_bad_files_are_one_line_naming_the_key(tmp_path, monkeypatch, text, message):
    _clean(monkeypatch)
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(CliError) as e:
        hostconfig.resolve(_parser("node").parse_args(["--config", str(f)]), "node")
    assert message in str(e.value) and str(f) in str(e.value)
    assert "\n" not in str(e.value)


def test_a_missing_config_file_is_an_error_when_named(tmp_path, monkeypatch):
    _clean(monkeypatch)
    with pytest.raises(CliError, match="No such file"):
        hostconfig.resolve(_parser("node").parse_args(["--config", str(tmp_path / "none.toml")]), "node")


def test_the_shipped_example_uses_only_known_keys():
    values = hostconfig.load_file(REPO / "packaging" / "systemd" / "dqoes.toml.example")
    assert values["control_plane.port"] == 4222 and values["node.runtime"] == "docker"


def test_the_install_guide_lists_every_key():
    text = (REPO / "docs" / "guide" / "install.md").read_text()
    for s in hostconfig.SETTINGS:
        assert f"`{s.name}`" in text and f"`{s.env}`" in text and f"`{s.flag}" in text, s.name


def test_the_control_plane_may_be_a_list_of_nats_urls(tmp_path, monkeypatch):
    _clean(monkeypatch)
    f = tmp_path / "dqoes.toml"
    f.write_text('[node]\ncontrol_plane = "nats://a:4222, nats://b:4222,nats://c:4222"\n')
    cfg = hostconfig.resolve(_parser("node").parse_args(["--config", str(f)]), "node")
    assert cfg["control_plane"] == "nats://a:4222,nats://b:4222,nats://c:4222"
    cfg = hostconfig.resolve(_parser("node").parse_args(["--config", str(f), "--control-plane", "tls://d:4222"]),
                             "node")
    assert cfg["control_plane"] == "tls://d:4222"


@pytest.mark.parametrize("value", ["a:4222", "nats://a:4222,http://b:80", "nats://", ","])
def test_a_control_plane_that_is_not_nats_urls_is_one_line(tmp_path, monkeypatch, value):
    _clean(monkeypatch)
    monkeypatch.setenv("DQOES_CONTROL_PLANE", value)
    with pytest.raises(CliError, match=r"^\$DQOES_CONTROL_PLANE: node.control_plane: .*(not a NATS URL|no NATS URL)"):
        hostconfig.resolve(_parser("node").parse_args([]), "node")


def test_a_node_keeps_its_limits_when_stopped_unless_told_to_restore(tmp_path, monkeypatch):
    _clean(monkeypatch)
    assert hostconfig.resolve(_parser("node").parse_args([]), "node")["on_stop"] == "keep"
    cfg = hostconfig.resolve(_parser("node").parse_args(["--on-stop", "restore"]), "node")
    assert cfg["on_stop"] == "restore"
    monkeypatch.setenv("DQOES_ON_STOP", "forget")
    with pytest.raises(CliError, match="'forget' is not one of keep, restore"):
        hostconfig.resolve(_parser("node").parse_args([]), "node")


@pytest.mark.parametrize("flags", [[], ["--on-stop", "restore", "--require-node-label"]])
def test_the_node_role_hands_its_worker_the_stop_mode_and_the_label_rule(tmp_path, monkeypatch, flags):
    from services.cli import serve
    from services.worker.__main__ import parse

    _clean(monkeypatch)
    cfg = hostconfig.resolve(_parser("node").parse_args(["--runtime", "docker", *flags]), "node")
    argv = serve._worker_args(tmp_path, "n1", "nats://a:4222,nats://b:4222", cfg)
    assert argv[:2] == ["-m", "services.worker"]
    worker = parse(argv[2:])
    assert (worker.on_stop, worker.require_node_label) == (("restore", True) if flags else ("keep", False))
    assert worker.nats_url == "nats://a:4222,nats://b:4222"


def test_routes_come_as_a_toml_list_or_comma_separated_and_carry_no_password(tmp_path, monkeypatch):
    _clean(monkeypatch)
    f = tmp_path / "dqoes.toml"
    f.write_text('[control_plane]\ncluster_listen = "0.0.0.0:6222"\n'
                 'routes = ["nats-route://host2:6222", "nats-route://host3:6222"]\n')
    cfg = hostconfig.resolve(_parser("control_plane").parse_args(["--config", str(f)]), "control_plane")
    assert cfg["routes"] == "nats-route://host2:6222,nats-route://host3:6222"
    assert hostconfig.route_list(cfg["routes"], "x") == ["host2:6222", "host3:6222"]
    for bad in ("nats://host2:6222", "nats-route://route:pw@host2:6222", "nats-route://host2"):
        with pytest.raises(CliError, match=r"^--routes: .*not a route URL"):
            hostconfig.resolve(_parser("control_plane").parse_args(["--config", str(f), "--routes", bad]),
                               "control_plane")
    monkeypatch.setenv("DQOES_CLUSTER_LISTEN", "6222")
    with pytest.raises(CliError, match=r"^\$DQOES_CLUSTER_LISTEN: control_plane.cluster_listen: .*HOST:PORT"):
        hostconfig.resolve(_parser("control_plane").parse_args([]), "control_plane")
