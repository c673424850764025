"""The compose demo and the Swarm stack on the real engine: files valid, a short real bring-up.

Each bring-up runs its own project (or stack) with its own node names and
NATS port, so it never mixes with a demo running on the same machine, and
tears everything down whatever happens. They need the demo's images
(dqoes:latest, dqoes-workload:latest; `make images`): without them, or
without docker-compose, they are skipped with the reason (failures with
DQOES_REQUIRE_DOCKER=1). The Swarm test is marked `swarm`
(`pytest -m swarm`); it initialises a single-node swarm when none is active
and leaves it again afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared import auth, subjects
from shared.bus import Bus
from shared.ports import free_port
from shared.schema import NodeState

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
STACK_FILE = REPO / "compose" / "stack.yml"
IMAGES = ("dqoes:latest", "dqoes-workload:latest")
PERIOD_US = 100_000

pytestmark = pytest.mark.timeout(300)


def need(reason: str) -> None:
    """Skip with the reason, or fail when DQOES_REQUIRE_DOCKER=1 (as tests/docker/conftest.py does)."""
    if os.environ.get("DQOES_REQUIRE_DOCKER") == "1":
        pytest.fail(f"{reason} (and DQOES_REQUIRE_DOCKER=1)")
    pytest.skip(f"{reason}; set DQOES_REQUIRE_DOCKER=1 to make this a failure")


AUTH_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / f"dqoes-test-auth-{os.getpid()}"
"""Credentials of the deployments these tests bring up (the compose files mount from it)."""


def credentials(*nodes: str) -> None:
    auth.ensure(AUTH_DIR, nodes)


def client_url(url: str) -> str:
    return auth.with_credentials(url, auth.load(auth.creds_path(AUTH_DIR, "client")))


def run(cmd: list[str], *, env: dict | None = None, timeout: float = 120, check: bool = False,
        input: str | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, input=input,
                       env={**os.environ, "DQOES_AUTH_DIR": str(AUTH_DIR), **(env or {})})
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    return r


def engine_or_skip() -> None:
    if shutil.which("docker") is None or run(["docker", "info"], timeout=30).returncode != 0:
        need("no Docker engine; run .ci/install-docker.sh")


def compose_v1() -> list[str]:
    engine_or_skip()
    if shutil.which("docker-compose") is None:
        need("docker-compose (v1) is not installed (Debian: apt-get install -y docker-compose)")
    return ["docker-compose"]


def compose_v2() -> list[str] | None:
    engine_or_skip()
    return ["docker", "compose"] if run(["docker", "compose", "version"]).returncode == 0 else None


def images_or_skip() -> None:
    missing = [i for i in IMAGES if run(["docker", "image", "inspect", i]).returncode != 0]
    if missing:
        need(f"image(s) {', '.join(missing)} missing; build them with `make images`")


def dqoes(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "services.cli", *args], timeout=timeout,
               env={"PYTHONPATH": str(REPO), auth.CREDS_ENV: str(auth.creds_path(AUTH_DIR, "client"))})


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def inspect(name: str) -> dict:
    return json.loads(run(["docker", "inspect", name], check=True).stdout)[0]


def wait(what: str, timeout_s: float, fn, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


async def node_state(url: str, node: str, timeout_s: float = 15) -> NodeState:
    """The next state the node's worker publishes (its containers with their limits)."""
    bus = await Bus.connect(client_url(url), "test-compose")
    got: asyncio.Future[NodeState] = asyncio.get_running_loop().create_future()
    try:
        await bus.subscribe(subjects.state(node), lambda m, _: got.done() or got.set_result(m),
                            expect=NodeState)
        return await asyncio.wait_for(got, timeout_s)
    finally:
        await bus.close()


# ---- the files -------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_compose_file_is_valid(version):
    cmd = compose_v1() if version == "v1" else compose_v2()
    if cmd is None:
        pytest.skip("the `docker compose` v2 plugin is not installed here (docs/guide/compose.md)")
    r = run([*cmd, "-f", str(COMPOSE_FILE), "-p", "dqoes-validate", "config"], check=True)
    cfg = r.stdout
    services = run([*cmd, "-f", str(COMPOSE_FILE), "-p", "dqoes-validate", "config", "--services"],
                   check=True).stdout.split()
    assert sorted(services) == ["a1", "a2", "a3", "b1", "b2", "b3", "manager", "nats", "worker-a", "worker-b"]
    # Anchors and defaults resolved: every inference container is labelled for its node,
    # the workers keep to labelled containers, and NATS is published on loopback only.
    assert cfg.count("dqoes.managed: 'true'") + cfg.count('dqoes.managed: "true"') == 6
    assert cfg.count("dqoes.node: node-a") == 3 and cfg.count("dqoes.node: node-b") == 3
    assert cfg.count("DQOES_REQUIRE_NODE_LABEL: '1'") + cfg.count('DQOES_REQUIRE_NODE_LABEL: "1"') == 2
    assert "127.0.0.1" in cfg and "${" not in cfg
    # Prometheus /metrics of the manager and both workers, published on the host's loopback.
    assert cfg.count("DQOES_METRICS_PORT") == 3
    assert all(port in cfg for port in ("19100", "19101", "19102"))
    # Inside each container on every interface (the default is loopback), on 9180 (9100 is node_exporter's).
    assert len(re.findall(r"DQOES_METRICS_ADDR: ['\"]?0\.0\.0\.0", cfg)) == 3
    assert "9180" in cfg and not re.search(r"\b9100\b", cfg)
    # Authentication on: the server reads the generated users; each service mounts its own file.
    assert "/etc/nats/nats-server.conf" in cfg and cfg.count("/run/dqoes/nats.creds") >= 9
    assert "inference-node-a.creds" in cfg and "worker-node-b.creds" in cfg and "admin.creds" not in cfg
    # The manager's objectives-bucket connection has an identity of its own: its variable and its file.
    assert cfg.count("/run/dqoes/store.creds") >= 2


def test_the_stack_file_is_valid_and_needs_the_node_name():
    cmd = compose_v1()
    r = run([*cmd, "-f", str(STACK_FILE), "config"], env={"DQOES_SWARM_NODE": "n1"}, check=True)
    assert r.stdout.count("dqoes.node: n1") == 4
    assert "{{.Node.Hostname}}" in r.stdout  # left for Swarm to expand in the environment
    assert len(re.findall(r"DQOES_METRICS_ADDR: ['\"]?0\.0\.0\.0", r.stdout)) == 2  # manager, worker tasks
    assert len(re.findall(r"DQOES_METRICS_PORT: ['\"]?9180", r.stdout)) == 2
    bad = run([*cmd, "-f", str(STACK_FILE), "config"], env={"DQOES_SWARM_NODE": ""})
    assert bad.returncode != 0 and "DQOES_SWARM_NODE" in bad.stderr


# ---- compose: a short real bring-up ----------------------------------------------------------


@pytest.fixture
def project() -> Iterator[dict]:
    cmd = compose_v1()
    images_or_skip()
    tag = uuid.uuid4().hex[:6]
    p = {
        "name": f"dqoes-test-{tag}",
        "node": f"t{tag}-a",
        "port": free_port(),
        "cmd": [*cmd, "-f", str(COMPOSE_FILE), "-p", f"dqoes-test-{tag}"],
    }
    p["env"] = {"DQOES_DEMO_PORT": str(p["port"]), "DQOES_NODE_A": p["node"], "DQOES_NODE_B": f"t{tag}-b",
                "DQOES_INTERVAL_S": "3", "DQOES_A1_OBJECTIVE": "2.0"}
    credentials(p["node"], f"t{tag}-b")
    try:
        yield p
    finally:
        run([*p["cmd"], "down", "-v", "--remove-orphans", "-t", "5"], env=p["env"], timeout=180)
        left = run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={p['name']}"])
        assert left.stdout.strip() == "", "containers left behind"


def test_compose_up_objective_through_targets_and_a_limit_on_the_container(project):
    p = project
    url = f"nats://127.0.0.1:{p['port']}"
    run([*p["cmd"], "up", "-d", "nats", "manager", "worker-a", "a1", "a2"], env=p["env"], timeout=180,
        check=True)

    def names() -> dict[str, str]:
        out = run(["docker", "ps", "--filter", f"label=com.docker.compose.project={p['name']}",
                   "--format", '{{.Label "com.docker.compose.service"}} {{.Names}}']).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    running = names()
    assert set(running) == {"nats", "manager", "worker-a", "a1", "a2"}
    a1, a2 = running["a1"], running["a2"]
    for name in (a1, a2):
        info = inspect(name)
        labels = info["Config"]["Labels"]
        assert labels["dqoes.managed"] == "true" and labels["dqoes.node"] == p["node"]
        assert info["HostConfig"]["CpusetCpus"] == "0"
        assert (info["HostConfig"]["CpuQuota"], info["HostConfig"]["NanoCpus"]) == (0, 0)

    def cluster() -> dict | None:
        r = dqoes("status", "--nats", url, "--json")
        return last_json(r.stdout) if r.returncode == 0 else None

    cs = wait("the cluster state lists both inference containers", 120,
              lambda: (c := cluster()) and c["containers_total"] == 2 and c)
    assert list(cs["nodes"]) == [p["node"]]

    # The objective goes through dqoes.targets (the manager stores it, then hands it over).
    r = dqoes("target", "set", a2, "60", "--nats", url, "--json")
    assert r.returncode == 0, r.stderr
    reply = last_json(r.stdout)
    assert reply["ok"] and reply["node"] == p["node"] and reply["running"] is True

    # a2 is far faster than 60 s a batch (class G): DQoES shrinks it, on the container itself.
    quota = wait("a CPU quota on a2 in docker inspect", 150,
                 lambda: inspect(a2)["HostConfig"]["CpuQuota"] > 0 and inspect(a2)["HostConfig"]["CpuQuota"])
    assert inspect(a2)["HostConfig"]["CpuPeriod"] == PERIOD_US

    ns = wait("the worker's state with a2's limit", 30,
              lambda: (s := asyncio.run(node_state(url, p["node"]))) and
              any(c.container == a2 and c.limit for c in s.containers) and s)
    states = {c.container: c for c in ns.containers}
    assert states[a2].objective_s == 60 and states[a1].objective_s == 2.0  # target, label
    # One core for this logical node: the limit is a fraction of CPU 0, as docker shows it
    # (the worker may have moved it again since; compare with what docker shows now).
    now_quota = inspect(a2)["HostConfig"]["CpuQuota"]
    assert states[a2].limit == pytest.approx(now_quota / PERIOD_US, abs=0.05) or \
        states[a2].limit == pytest.approx(quota / PERIOD_US, abs=0.05)
    assert 1 / 4 - 1e-6 <= now_quota / PERIOD_US < 1.0  # within [floor 1/(2|C|), the core)
    # Nothing else was touched: the control plane's containers carry no limit.
    for svc in ("nats", "manager", "worker-a"):
        hc = inspect(names()[svc])["HostConfig"]
        assert (hc["CpuQuota"], hc["NanoCpus"]) == (0, 0)


# ---- Swarm: a single-node stack --------------------------------------------------------------


def reduced_stack(tmp: Path, keep: tuple[str, ...]) -> Path:
    """compose/stack.yml with only some inference services (less CPU for the test)."""
    out, skip = [], False
    for line in STACK_FILE.read_text().splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.strip().endswith(":"):
            svc = line.strip()[:-1]
            skip = svc.startswith("s") and svc[1:].isdigit() and svc not in keep
        elif line and not line.startswith(" "):
            skip = False
        if not skip:
            out.append(line)
    path = tmp / "stack.yml"
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.fixture
def swarm() -> Iterator[dict]:
    engine_or_skip()
    images_or_skip()
    state = run(["docker", "info", "-f", "{{.Swarm.LocalNodeState}}"]).stdout.strip()
    created = False
    gwbridge_before = run(["docker", "network", "inspect", "docker_gwbridge"]).returncode == 0
    if state == "inactive":
        r = run(["docker", "swarm", "init", "--advertise-addr", "127.0.0.1"])
        if r.returncode != 0:
            need(f"docker swarm init failed here: {r.stderr.strip()[-300:]}")
        created = True
    elif state != "active":
        need(f"swarm state is {state!r}")
    elif run(["docker", "info", "-f", "{{.Swarm.ControlAvailable}}"]).stdout.strip() != "true":
        need("this engine is a swarm worker, not a manager")
    stack = f"dqt{uuid.uuid4().hex[:6]}"
    try:
        yield {"stack": stack, "node": run(["docker", "info", "-f", "{{.Name}}"]).stdout.strip()}
    finally:
        run(["docker", "stack", "rm", stack])
        with contextlib.suppress(AssertionError):
            wait("the stack's containers and network gone", 90, lambda: not run(
                ["docker", "ps", "-aq", "--filter", f"label=com.docker.stack.namespace={stack}"]).stdout.strip()
                and run(["docker", "network", "inspect", f"{stack}_default"]).returncode != 0)
        run(["docker", "volume", "rm", f"{stack}_nats-data"])
        if created:
            run(["docker", "swarm", "leave", "--force"])
            if not gwbridge_before:
                run(["docker", "network", "rm", "docker_gwbridge"])


@pytest.mark.swarm
def test_swarm_stack_worker_limits_the_task_containers_directly(swarm, tmp_path):
    stack, node = swarm["stack"], swarm["node"]
    env = {"DQOES_SWARM_NODE": node, "DQOES_INTERVAL_S": "3", "DQOES_S1_OBJECTIVE": "2.0"}
    credentials(node)
    run(["docker", "stack", "deploy", "-c", str(reduced_stack(tmp_path, ("s1", "s2"))), stack], env=env,
        check=True, timeout=120)

    def task(service: str) -> str:
        return run(["docker", "ps", "--filter", f"label=com.docker.swarm.service.name={stack}_{service}",
                    "--format", "{{.Names}}"]).stdout.strip()

    s1, s2, mgr = (wait(f"a running task of {s}", 150, lambda s=s: task(s)) for s in ("s1", "s2", "manager"))
    # Service-level `labels:` are the task containers' labels (what the worker reads).
    for name in (s1, s2):
        labels = inspect(name)["Config"]["Labels"]
        assert labels["dqoes.managed"] == "true" and labels["dqoes.node"] == node
        assert labels["com.docker.stack.namespace"] == stack

    def cli(*args: str) -> subprocess.CompletedProcess:
        # The manager's task has the client's credentials mounted for this (compose/stack.yml).
        return run(["docker", "exec", "-i", "-e", f"{auth.CREDS_ENV}=/run/dqoes/client.creds", mgr, "dqoes", *args,
                    "--nats", "nats://nats:4222"], timeout=60)

    def cluster() -> dict | None:
        r = cli("status", "--json")
        return last_json(r.stdout) if r.returncode == 0 else None

    cs = wait("the cluster state lists both task containers", 150,
              lambda: (c := cluster()) and c["containers_total"] == 2 and c)
    assert list(cs["nodes"]) == [node]

    r = cli("target", "set", s2, "60", "--json")
    assert r.returncode == 0, r.stderr
    assert last_json(r.stdout)["ok"] and last_json(r.stdout)["node"] == node
    s2_id = inspect(s2)["Id"]

    quota = wait("a CPU quota on s2's task container", 150,
                 lambda: inspect(s2)["HostConfig"]["CpuQuota"] > 0 and inspect(s2)["HostConfig"]["CpuQuota"])
    cores = int(run(["docker", "info", "-f", "{{.NCPU}}"]).stdout)
    assert 1 / 4 * cores - 1e-6 <= quota / PERIOD_US < cores
    # The service spec is untouched, and Swarm neither reverts the change nor replaces the task.
    spec = json.loads(run(["docker", "service", "inspect", f"{stack}_s2"], check=True).stdout)[0]["Spec"]
    assert not (spec["TaskTemplate"].get("Resources") or {}).get("Limits")
    time.sleep(5)
    assert task("s2") == s2 and inspect(s2)["Id"] == s2_id
    assert inspect(s2)["HostConfig"]["CpuQuota"] > 0
