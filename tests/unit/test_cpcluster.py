"""A control-plane member's NATS config and shared route secret (services/cli/cpcluster.py)."""

from __future__ import annotations

import re
import stat

import pytest

from services.cli import cpcluster
from services.cli.common import CliError


def _cfg(secret, **extra):
    return {"cluster_listen": "0.0.0.0:6222", "routes": "nats-route://host2:6222,nats-route://host3:6222",
            "cluster_secret_file": str(secret), "server_name": None, **extra}


def _member(tmp_path):
    """A shared route secret private to this user, and a member's private state directory."""
    secret = tmp_path / "cluster.secret"
    secret.write_text("a-shared-route-password\n")
    secret.chmod(0o600)
    root = tmp_path / "control-plane"
    root.mkdir(mode=0o700)
    return secret, root


def test_a_member_config_routes_to_the_others_with_the_shared_secret_and_is_private(tmp_path):
    secret, root = _member(tmp_path)
    path = cpcluster.write_member_config(root, _cfg(secret, server_name="cp1"))
    text = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert 'server_name: "cp1"' in text and 'listen: "0.0.0.0:6222"' in text
    assert re.findall(r"nats-route://route:a-shared-route-password@([\w.:]+)", text) == ["host2:6222", "host3:6222"]
    assert 'include "auth/nats-server.conf"' in text
    assert cpcluster.server_name(_cfg(secret)).endswith("-6222")


@pytest.mark.parametrize("mode,text,message", [(0o644, "a-shared-route-password", "readable by others"),
                                               (0o600, "short", "shorter than 16")])
def test_a_shared_secret_others_can_read_or_too_short_is_refused(tmp_path, mode, text, message):
    secret = tmp_path / "cluster.secret"
    secret.write_text(text)
    secret.chmod(mode)
    root = tmp_path / "control-plane"
    root.mkdir(mode=0o700)
    with pytest.raises(CliError, match=message):
        cpcluster.write_member_config(root, _cfg(secret))


def test_routes_need_a_cluster_listen_address(tmp_path):
    with pytest.raises(CliError, match="cluster_listen"):
        cpcluster.write_member_config(tmp_path, _cfg(tmp_path / "s", cluster_listen=None))
    assert not cpcluster.clustered({"routes": None}) and cpcluster.clustered({"routes": "nats-route://h:1"})


def test_route_tls_needs_all_three_files_and_a_private_key(tmp_path):
    secret, root = _member(tmp_path)
    files = {k: tmp_path / f"{k}.pem" for k in ("cert", "key", "ca")}
    for f in files.values():
        f.write_text("PEM\n")
    files["key"].chmod(0o600)
    tls = {"cluster_tls_cert": str(files["cert"]), "cluster_tls_key": str(files["key"]),
           "cluster_tls_ca": str(files["ca"])}
    text = cpcluster.write_member_config(root, _cfg(secret, **tls)).read_text()
    assert f'tls {{ cert_file: "{files["cert"]}", key_file: "{files["key"]}", ca_file: "{files["ca"]}", ' \
           "verify: true" in text
    with pytest.raises(CliError, match="needs all of"):
        cpcluster.write_member_config(root, _cfg(secret, cluster_tls_cert=str(files["cert"])))
    files["key"].chmod(0o644)
    with pytest.raises(CliError, match="readable by others"):
        cpcluster.write_member_config(root, _cfg(secret, **tls))
    assert "tls {" not in cpcluster.write_member_config(root, _cfg(secret)).read_text()
