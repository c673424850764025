"""The multi-node stack on three real Docker engines (a Swarm), one per network namespace.

What docs/guide/three-hosts.md tells a person to do, run for real: per-node
credentials (`python3 -m shared.auth init --node ...`), each node's own two
files at the same path, `docker stack deploy -c compose/stack-multinode.yml`
on the manager, a global application service (tests/multihost/load.yml: a
labelled pure-Python CPU burner on every node), then objectives. Each worker
is given no node name: it asks its engine (`docker info` Name, dqt-engN), and
the status rows must name that node. Asserted:

- an objective on the container of one node is carried out by that node's
  worker only: its CPU limit changes, the other nodes' containers keep none;
- a node's worker identity cannot publish for another node: the server
  refuses it (a permissions violation), while its own subjects pass;
- an objective set once on the service (a container label, one
  `docker service update`) is applied on every node by that node's worker.

The engines (tests/multihost/engines.py) share this machine's cgroup tree and
kernel; a Swarm with overlay networking across them works here (vxlan in
the kernel; no IPVS, hence DNS round robin for NATS, as in compose/stack.yml).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import engines
import pytest

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
STACK = "dqt"
APPS = "dqt-load"
ROUND_S = 2.0
"""The workers' initial control interval (DQOES_INTERVAL_S)."""
OBJECTIVE_S = 1.0
"""Far above what a load batch takes unlimited (tens of ms): a worker meets it by cutting the CPU limit."""


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, every_s: float = 1.0) -> Any:
    t_end = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < t_end:
        try:
            last = pred()
        except engines.EngineError as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s:g} s: {what} (last: {last!r})")


def task_of(engine: engines.Engine, service: str) -> str | None:
    """The running task container of a service on this engine (its name), if any."""
    out = engine.docker("ps", "--filter", f"label=com.docker.swarm.service.name={service}",
                        "--format", "{{.Names}}")
    return out.splitlines()[0] if out else None


def limit_of(engine: engines.Engine, container: str) -> tuple[int, int]:
    """(CpuQuota, NanoCpus) of a container: (0, 0) is no limit."""
    q, n = engine.docker("inspect", "-f", "{{.HostConfig.CpuQuota}} {{.HostConfig.NanoCpus}}", container).split()
    return int(q), int(n)


def limited(engine: engines.Engine, container: str) -> bool:
    return any(v > 0 for v in limit_of(engine, container))


class Stack:
    def __init__(self, cluster: engines.Cluster, auth_dir: Path) -> None:
        self.cluster = cluster
        self.manager_engine = cluster.engines[0]
        self.env = {**os.environ, "DOCKER_HOST": self.manager_engine.url, "DQOES_AUTH_DIR": str(auth_dir),
                    "DQOES_NODE_DIR": str(engines.NODE_DIR),
                    "DQOES_DOCKER_SOCK": str(engines.NODE_DIR / "docker.sock"),
                    "DQOES_INTERVAL_S": str(ROUND_S), "DQOES_LOG_LEVEL": "info"}

    def deploy(self, file: Path, name: str) -> None:
        done = subprocess.run(["docker", "stack", "deploy", "-c", str(file), name], env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"docker stack deploy {name}: {done.stderr}"

    def dqoes(self, *args: str) -> str:
        """The CLI inside the manager's task, as the client identity (a Docker secret there)."""
        task = task_of(self.manager_engine, f"{STACK}_manager")
        assert task, "no manager task on the manager node"
        done = subprocess.run(["docker", "-H", self.manager_engine.url, "exec", "-e",
                               "DQOES_NATS_CREDS=/run/secrets/client.creds", task, "dqoes", *args,
                               "--nats", "nats://nats:4222"], capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise engines.EngineError(f"dqoes {' '.join(args)}: {done.stderr.strip()[-300:]}")
        return done.stdout

    def status(self) -> dict[str, Any]:
        return json.loads(self.dqoes("status", "--json"))

    def logs(self) -> str:
        out = []
        for s in ("manager", "worker", "nats"):
            done = subprocess.run(["docker", "service", "logs", "--tail", "15", f"{STACK}_{s}"], env=self.env,
                                  capture_output=True, text=True, timeout=30)
            out.append(f"--- {s}\n{done.stdout}{done.stderr}")
        ps = subprocess.run(["docker", "stack", "ps", "--no-trunc", "--format",
                             "{{.Name}} {{.Node}} {{.CurrentState}} {{.Error}}", STACK], env=self.env,
                            capture_output=True, text=True, timeout=30)
        return "\n".join([ps.stdout, *out])


@pytest.fixture(scope="module")
def stack(cluster: engines.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Stack:
    # Per-node credentials, made once on one machine; each host gets only its own two files.
    auth_dir = tmp_path_factory.mktemp("auth")
    nodes = [e.name for e in cluster.engines]
    subprocess.run([sys.executable, "-m", "shared.auth", "init", "--dir", str(auth_dir),
                    *(f"--node={n}" for n in nodes)], check=True, cwd=REPO, capture_output=True)
    for e in cluster.engines:
        shutil.copy(auth_dir / f"worker-{e.name}.creds", e.node_dir / "worker.creds")
        shutil.copy(auth_dir / f"inference-{e.name}.creds", e.node_dir / "inference.creds")
    s = Stack(cluster, auth_dir)
    s.deploy(REPO / "compose/stack-multinode.yml", STACK)
    s.deploy(HERE / "load.yml", APPS)
    try:
        wait_for(lambda: all(task_of(e, f"{APPS}_load") for e in cluster.engines), 120,
                 "a load task runs on every engine")
        wait_for(lambda: s.status().get("containers_total") == len(nodes), 120,
                 "every node's worker reports its load container")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{s.logs()}") from None
    return s


def test_an_objective_is_carried_out_by_its_own_nodes_worker_only(stack: Stack) -> None:
    engs = stack.cluster.engines
    tasks = {e.name: task_of(e, f"{APPS}_load") for e in engs}
    assert all(tasks.values()), tasks
    assert not any(limited(e, tasks[e.name]) for e in engs), "a load container was limited before any objective"
    first = engs[0]
    target = engs[1] if len(engs) > 1 else first  # a container on a node other than the manager's
    reply = stack.dqoes("target", "set", tasks[target.name], str(OBJECTIVE_S))
    assert tasks[target.name] in reply or "ok" in reply.lower(), reply
    wait_for(lambda: limited(target, tasks[target.name]), 90,
             f"the worker of {target.name} limits {tasks[target.name]}")
    time.sleep(3 * ROUND_S)  # the other workers' next rounds: they must leave their containers alone
    for e in engs:
        if e is not target:
            assert limit_of(e, tasks[e.name]) == (0, 0), f"{e.name}'s load container was limited too"
    # The node that reports it is the target's own (its worker's state).
    rows = {c["container"]: c for c in stack.status()["containers"]}
    assert rows[tasks[target.name]]["node"] == target.name, rows
    assert rows[tasks[target.name]]["objective_s"] == OBJECTIVE_S, rows


def test_a_nodes_worker_identity_cannot_publish_for_another_node(stack: Stack) -> None:
    engs = stack.cluster.engines
    me, other = engs[-1], engs[0]
    worker = task_of(me, f"{STACK}_worker")
    assert worker
    theirs = [f"dqoes.state.{other.name}", f"dqoes.decisions.{other.name}", f"dqoes.latency.{other.name}.x"]
    mine = [f"dqoes.state.{me.name}"]
    done = subprocess.run(["docker", "-H", me.url, "exec", "-i", worker, "python", "-", *theirs, *mine],
                          input=(HERE / "probe_publish.py").read_text(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["identity"] == f"worker-{me.name}"
    refused = " ".join(out["refused"])
    for subject in theirs:
        assert f'Permissions Violation for Publish to "{subject}"'.lower() in refused.lower(), out
    assert mine[0] not in refused, out


def test_an_objective_set_once_on_the_service_applies_on_every_node(stack: Stack) -> None:
    engs = stack.cluster.engines
    done = subprocess.run(["docker", "service", "update", "--detach", "--container-label-add",
                           f"dqoes.objective_s={OBJECTIVE_S}", f"{APPS}_load"], env=stack.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    def new_tasks() -> dict[str, str] | None:
        out: dict[str, str] = {}
        for e in engs:
            for name in e.docker("ps", "--filter", f"label=com.docker.swarm.service.name={APPS}_load",
                                 "--filter", "label=dqoes.objective_s", "--format", "{{.Names}}").splitlines():
                out[e.name] = name
        return out if len(out) == len(engs) else None

    tasks = wait_for(new_tasks, 120, "the labelled load task runs on every engine")
    for e in engs:
        wait_for(lambda e=e: limited(e, tasks[e.name]), 90, f"the worker of {e.name} limits {tasks[e.name]}")
    rows = {c["container"]: c for c in stack.status()["containers"]}
    for e in engs:
        assert rows[tasks[e.name]]["node"] == e.name, rows
        assert rows[tasks[e.name]]["objective_s"] == OBJECTIVE_S, rows


def test_a_plain_container_on_the_network_is_governed_by_its_nodes_worker(stack: Stack) -> None:
    """`docker run --network dqoes` with the labels (docs/guide/three-hosts.md, step 4), no Swarm service."""
    e = stack.cluster.engines[1 % len(stack.cluster.engines)]
    name = "dqt-plain"
    e.docker("run", "-d", "--name", name, "--init", "--network", "dqoes",
             "--label", "dqoes.managed=true", "--label", "dqoes.model=busy",
             "--label", f"dqoes.objective_s={OBJECTIVE_S}",
             "-v", f"{engines.NODE_DIR}/inference.creds:/run/dqoes/nats.creds:ro",
             "-v", f"{HERE / 'load.py'}:/opt/dqoes-load.py:ro",
             "-e", "DQOES_NATS_URL=nats://nats:4222", "-e", "DQOES_NATS_CREDS=/run/dqoes/nats.creds",
             "-e", f"DQOES_NODE={e.docker('info', '-f', '{{.Name}}')}",
             "--entrypoint", "python", stack.env.get("DQOES_IMAGE", "dqoes:latest"), "/opt/dqoes-load.py")
    try:
        wait_for(lambda: limited(e, name), 90, f"the worker of {e.name} limits {name}")
        rows = {c["container"]: c for c in stack.status()["containers"]}
        assert rows[name]["node"] == e.name, rows
    finally:
        e.docker("rm", "-f", name, check=False)


def test_removing_a_node(stack: Stack) -> None:
    """Drain, leave, node rm (docs/guide/three-hosts.md): the node's worker and tasks stop, the rest go on."""
    engs = stack.cluster.engines
    if len(engs) < 3:
        pytest.skip("needs three engines")
    gone, manager = engs[-1], engs[0]
    manager.docker("node", "update", "--availability", "drain", gone.name)
    wait_for(lambda: task_of(gone, f"{STACK}_worker") is None and task_of(gone, f"{APPS}_load") is None, 90,
             f"the worker and the load task on {gone.name} stop")
    gone.docker("swarm", "leave", timeout=60)
    wait_for(lambda: "Down" in manager.docker("node", "ls", "--filter", f"name={gone.name}",
                                              "--format", "{{.Status}}"), 60, f"{gone.name} is down")
    manager.docker("node", "rm", gone.name)
    assert gone.name not in manager.docker("node", "ls", "--format", "{{.Hostname}}").split()
    # The other nodes go on: their workers and load tasks run, and report to the manager.
    rows = {c["container"]: c for c in stack.status()["containers"]}
    for e in engs[:-1]:
        assert task_of(e, f"{STACK}_worker"), f"no worker on {e.name} any more"
        task = task_of(e, f"{APPS}_load")
        assert task and rows.get(task, {}).get("node") == e.name, (e.name, task, rows)
