"""The control plane on a 3-server NATS cluster: losing any one server loses nothing.

Real processes throughout: three clustered nats-servers (shared/natscluster.py)
with the project's authentication, the manager and a worker (simulated
containers) given the list of the three URLs. Each server in turn is killed
with SIGKILL and, once the figures are taken with it down, started again
(its copy of the objectives caught up) before the next is killed
(bench/bench_failover.py drives it; `python -m bench failover` prints the
time figures against their goal).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.bench_failover import failover
from shared import auth, subjects
from shared.bus import Bus, BusError
from shared.natscluster import NatsCluster, server_config
from shared.natsd import NatsServer

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]


def test_losing_any_one_server_loses_no_objective_and_the_loop_resumes(tmp_path):
    r = failover(tmp_path / "run")
    for loss in r.losses:
        print(f"lost {loss.server}: first control round after {loss.first_round_s:.2f} s, objective set after "
              f"the loss in force after {loss.new_objective_s:.2f} s")
    assert [loss.server for loss in r.losses] == ["nats-1", "nats-2", "nats-3"]
    assert all(loss.lost == [] for loss in r.losses), r.losses
    assert len(r.stored) >= 5  # c1, c2 and one new c2 revision per loss, every one read back
    assert r.limits_moved
    assert r.dead == {}
    # Each service was on some server that was killed, and came back by itself, as often as it lost one.
    for name in ("manager", "worker-n1"):
        assert r.disconnects[name] >= 1 and r.reconnects[name] >= r.disconnects[name], (name, r.disconnects,
                                                                                          r.reconnects)
    assert r.worst_first_round_s > 0
    assert r.worst_first_round_s <= 5.0, f"first control round {r.worst_first_round_s:.2f} s after the loss"


def test_a_member_config_names_itself_routes_to_the_others_and_includes_the_auth_block(tmp_path):
    text = server_config("nats-2", auth_config=tmp_path / "auth" / "nats-server.conf", config_dir=tmp_path / "run",
                         secret="s3cret", listen="127.0.0.1:-1", advertise="127.0.0.1:4001",
                         routes=["127.0.0.1:4000", "127.0.0.1:4002"])
    assert 'server_name: "nats-2"' in text
    assert 'include "../auth/nats-server.conf"' in text
    assert re.findall(r"nats-route://route:s3cret@127\.0\.0\.1:(\d+)", text) == ["4000", "4002"]
    assert 'advertise: "127.0.0.1:4001"' in text and "no_advertise: true" in text


def test_a_route_without_the_password_is_refused(tmp_path):
    """A server that dials a member's route front with a wrong password does not join."""
    auth.ensure(tmp_path / "auth", ["n1"])
    with NatsCluster(tmp_path / "auth", tmp_path / "run") as cluster:
        rogue_conf = tmp_path / "rogue.conf"
        rogue_conf.write_text('server_name: "rogue"\ncluster { name: "dqoes", listen: "127.0.0.1:-1", '
                              f'routes: ["nats-route://route:wrong@127.0.0.1:{cluster.route_fronts[0].port}"] }}\n')
        with NatsServer(jetstream=False, config_file=rogue_conf) as rogue:
            end = time.monotonic() + 30
            while time.monotonic() < end and "Authorization Violation" not in rogue.log_text():
                time.sleep(0.1)
            assert "Authorization Violation" in rogue.log_text()  # the member refused it
            assert "rogue" not in cluster.servers[0].log_text()  # and never took it as a route


def test_a_client_given_the_list_reconnects_to_a_survivor(tmp_path):
    auth.ensure(tmp_path / "auth", ["n1"])
    with NatsCluster(tmp_path / "auth", tmp_path / "run") as cluster:
        url = auth.with_credentials(cluster.url, auth.load(auth.creds_path(tmp_path / "auth", "client")))
        assert url.count("?creds=") == 3 and auth.creds_of(url) is not None

        async def go() -> tuple[str | None, str | None]:
            bus = await Bus.connect(url, "t")
            try:
                first = bus.server
                assert first is not None
                cluster.kill(cluster.urls.index(next(u for u in cluster.urls if u.endswith(first.split(":")[1]))))
                for _ in range(100):
                    await asyncio.sleep(0.05)
                    if bus.is_connected and bus.server != first:
                        break
                return first, bus.server
            finally:
                await bus.close()

        first, then = asyncio.run(go())
        assert then is not None and then != first


def test_urls_of_a_cluster_keep_their_credentials_file(tmp_path):
    auth.ensure(tmp_path / "auth", ["n1"])
    creds = auth.load(auth.creds_path(tmp_path / "auth", "client"))
    url = auth.with_credentials("nats://a:1, nats://b:2", creds)
    servers, named = auth.split_url(url)
    assert servers == "nats://a:1,nats://b:2" and named == str(creds.path)
    assert auth.redact(url) == "nats://a:1,nats://b:2" == auth.without_credentials(url)
    with pytest.raises(auth.AuthError):
        auth.split_url("nats://a:1?creds=/x,nats://b:2?creds=/y")
    with pytest.raises(BusError):
        asyncio.run(Bus.connect("nats://a:1?creds=/x,nats://b:2?creds=/y", "t"))
    assert json.dumps(auth.server_list("nats://a:1")) == '["nats://a:1"]'


def test_dqoes_up_runs_the_control_plane_on_three_servers_and_restarts_a_lost_one(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(tmp_path / "state")}
    env.pop("DQOES_NATS_URL", None)
    run = tmp_path / "run"
    up = subprocess.Popen([sys.executable, "-m", "services.cli", "up", "--nats-servers", "3", "--scenario",
                           "paper-varied", "--time-scale", "20", "--forever", "--no-dashboard", "--run-dir",
                           str(run)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        for line in up.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        nats_line = next(line for line in lines if " NATS " in line)
        urls = nats_line.split(" NATS ")[1].split()[0].split(",")
        assert len(urls) == 3 and all(u.startswith("nats://127.0.0.1:") for u in urls)

        def status() -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "services.cli", "status", "--json"], capture_output=True,
                                  text=True, cwd=REPO, env=env, timeout=60)

        end = time.monotonic() + 60
        while status().returncode != 0:
            assert time.monotonic() < end, status().stderr
            time.sleep(0.5)
        pid = int((run / "learned" / "nats-2.out").read_text().split("]", 1)[0].lstrip("["))
        os.kill(pid, signal.SIGKILL)
        for line in up.stdout:  # type: ignore[union-attr]
            if line.startswith("supervisor:") and "nats-2" in line:
                assert "restarted" in line, line
                break
        assert status().returncode == 0
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
    assert up.returncode == 0
    for log in (run / "learned").glob("*.log"):
        assert "Traceback" not in log.read_text(), log


def test_the_dashboard_gets_a_cluster_as_one_source():
    from dashboard import config

    env = {config.SOURCES_ENV: config.sources_env([("learned", "nats://a:1,nats://b:2,nats://c:3")])}
    assert [(s[0], s[1]) for s in config.parse([], env).sources] == [("learned", "nats://a:1,nats://b:2,nats://c:3")]


def test_processes_a_worker_starts_get_the_whole_list(tmp_path):
    from shared.runtime.base import LaunchSpec
    from shared.runtime.factory import strip_credentials

    auth.ensure(tmp_path / "auth", ["n1"])
    creds = auth.creds_path(tmp_path / "auth", "inference-n1")
    url = auth.with_credentials("nats://a:1,nats://b:2,nats://c:3", auth.load(creds))
    assert strip_credentials(url) == "nats://a:1,nats://b:2,nats://c:3"
    argv = LaunchSpec("job1", "m", url).argv("n1")
    assert argv[argv.index("--nats") + 1] == "nats://a:1,nats://b:2,nats://c:3"
    assert argv[argv.index("--creds") + 1] == str(creds.resolve())


def test_the_manager_makes_the_bucket_with_three_copies_when_asked(tmp_path):
    auth.ensure(tmp_path / "auth", ["n1"])
    log = tmp_path / "manager.log"
    with NatsCluster(tmp_path / "auth", tmp_path / "run") as cluster, log.open("wb") as out:
        manager = subprocess.Popen(
            [sys.executable, "-m", "services.manager", "--nats", cluster.url, "--creds",
             str(auth.creds_path(tmp_path / "auth", "manager")), "--store-creds",
             str(auth.creds_path(tmp_path / "auth", "store")), "--bucket-replicas", "3"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + 60
            while "objective(s) stored in bucket" not in log.read_text() and manager.poll() is None:
                assert time.monotonic() < end, log.read_text()[-2000:]
                time.sleep(0.2)
            assert manager.poll() is None, log.read_text()[-2000:]
            store_url = auth.with_credentials(cluster.url, auth.load(auth.creds_path(tmp_path / "auth", "store")))

            async def copies() -> dict[str, bool]:
                async with await Bus.connect(store_url, "t") as bus:  # the bucket exists: used as it is
                    return await (await bus.kv(subjects.KV_OBJECTIVES)).copies()

            assert sorted(asyncio.run(copies())) == ["nats-1", "nats-2", "nats-3"]
        finally:
            manager.terminate()
            manager.wait(20)
