"""The multi-node stack on three real Docker engines (a Swarm), one per network namespace.

What docs/guide/three-hosts.md tells a person to do, run for real: one join
token with three uses (`dqoes join-token create` in the control plane's
volume, before the first deploy) made a Docker secret, `docker stack deploy
-c compose/stack-multinode.yml` on the manager, and each node's worker joins
by itself on its first start, under its engine's name (`docker info` Name,
dqt-engN), with keys it makes on its own host: no credentials are copied to
any host. Then a global application service (tests/multihost/load.yml: a
labelled pure-Python CPU burner on every node) and objectives. Asserted:

- each node joined under its engine's name, with its keys on its own host;
- an objective on the container of one node is carried out by that node's
  worker only: its CPU limit changes, the other nodes' containers keep none;
- a node's worker identity cannot publish for another node: the server
  refuses it (a permissions violation), while its own subjects pass;
- an objective set once on the service (`dqoes target set --service`,
  stored by the manager) is applied on every node by that node's worker,
  and governs the new tasks of a redeploy (`docker service update --force`);
- a replaced worker task reuses its host's keys, with no second join;
- `dqoes node revoke` cuts one node's worker off (the server refuses its
  identity, its state stops arriving) while the other nodes carry on;
- a node removed from the Swarm leaves the others running.

The engines (tests/multihost/engines.py) share this machine's cgroup tree and
kernel; a Swarm with overlay networking across them works here (vxlan in
the kernel; no IPVS, hence DNS round robin for NATS, as in compose/stack.yml).
"""

from __future__ import annotations

import json
import os
import subprocess
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


STATE = "/var/lib/dqoes"
"""Where the control plane's task and every worker task keep their state (compose/stack-multinode.yml)."""


class Stack:
    def __init__(self, cluster: engines.Cluster) -> None:
        self.cluster = cluster
        self.manager_engine = cluster.engines[0]
        self.env = {**os.environ, "DOCKER_HOST": self.manager_engine.url,
                    "DQOES_NODE_DIR": str(engines.NODE_DIR),
                    "DQOES_DOCKER_SOCK": str(engines.NODE_DIR / "docker.sock"),
                    "DQOES_INTERVAL_S": str(ROUND_S), "DQOES_LOG_LEVEL": "info"}

    def docker(self, *args: str, input: str | None = None) -> str:
        done = subprocess.run(["docker", *args], env=self.env, input=input, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"docker {' '.join(args[:3])}: {done.stderr}"
        return done.stdout

    def join_token_secret(self, uses: int) -> None:
        """The docs' step: a token in the control plane's volume, made a Docker secret (never printed)."""
        token = self.docker("run", "--rm", "-v", f"dqoes-control-plane:{STATE}", "-e", f"DQOES_STATE_DIR={STATE}",
                            self.env.get("DQOES_IMAGE", "dqoes:latest"), "dqoes", "join-token", "create",
                            "--uses", str(uses), "--ttl", "30m", "--quiet").strip()
        assert token.startswith("DQJ1-"), "join-token create printed no token"
        self.docker("secret", "create", "dqoes-join-token", "-", input=token)

    def deploy(self, file: Path, name: str) -> None:
        self.docker("stack", "deploy", "-c", str(file), name)

    def dqoes(self, *args: str) -> str:
        """The CLI inside the control plane's task (it finds the running control plane and its client identity)."""
        task = task_of(self.manager_engine, f"{STACK}_control-plane")
        assert task, "no control-plane task on the manager node"
        done = subprocess.run(["docker", "-H", self.manager_engine.url, "exec", task, "dqoes", *args],
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise engines.EngineError(f"dqoes {' '.join(args)}: {done.stderr.strip()[-300:]}")
        return done.stdout

    def status(self) -> dict[str, Any]:
        return json.loads(self.dqoes("status", "--json"))

    def logs(self) -> str:
        out = []
        for s in ("control-plane", "worker"):
            done = subprocess.run(["docker", "service", "logs", "--tail", "15", f"{STACK}_{s}"], env=self.env,
                                  capture_output=True, text=True, timeout=30)
            out.append(f"--- {s}\n{done.stdout}{done.stderr}")
        ps = subprocess.run(["docker", "stack", "ps", "--no-trunc", "--format",
                             "{{.Name}} {{.Node}} {{.CurrentState}} {{.Error}}", STACK], env=self.env,
                            capture_output=True, text=True, timeout=30)
        return "\n".join([ps.stdout, *out])


def worker_creds(node: str) -> str:
    """A node's worker credentials inside its worker task: made there when it joined."""
    return f"{STATE}/node/auth/worker-{node}.creds"


def probe(engine: engines.Engine, creds: str, subjects: list[str]) -> dict[str, Any]:
    """tests/multihost/probe_publish.py in the engine's worker task, speaking as `creds`."""
    worker = task_of(engine, f"{STACK}_worker")
    assert worker, f"no worker task on {engine.name}"
    done = subprocess.run(["docker", "-H", engine.url, "exec", "-i", "-e", f"DQOES_NATS_CREDS={creds}", worker,
                           "python", "-", *subjects], input=(HERE / "probe_publish.py").read_text(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def stack(cluster: engines.Cluster) -> Stack:
    nodes = [e.name for e in cluster.engines]
    s = Stack(cluster)
    s.join_token_secret(uses=len(nodes))
    s.deploy(REPO / "compose/stack-multinode.yml", STACK)
    try:
        # Each worker joins on its first start; its host then has the inference credentials for its apps.
        wait_for(lambda: all((e.node_dir / "inference.creds").exists() for e in cluster.engines), 120,
                 "every node's worker joins and writes its apps' credentials")
        s.deploy(HERE / "load.yml", APPS)
        wait_for(lambda: all(task_of(e, f"{APPS}_load") for e in cluster.engines), 120,
                 "a load task runs on every engine")
        wait_for(lambda: s.status().get("containers_total") == len(nodes), 120,
                 "every node's worker reports its load container")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{s.logs()}") from None
    return s


def test_each_node_joined_under_its_engines_name_with_keys_made_on_its_host(stack: Stack) -> None:
    joined = {n["node"]: n for n in json.loads(stack.dqoes("node", "list", "--json"))["nodes"]}
    assert sorted(joined) == sorted(e.name for e in stack.cluster.engines), joined
    for e in stack.cluster.engines:
        # The worker's seed is on its own host only; the control plane holds its public key.
        seed_file = e.node_dir / "node" / "auth" / f"worker-{e.name}.creds"
        assert json.loads(seed_file.read_text())["nkey"] == joined[e.name]["worker_nkey"], e.name
        for other in stack.cluster.engines:
            if other is not e:
                assert not (e.node_dir / "node" / "auth" / f"worker-{other.name}.creds").exists()
    assert not json.loads(stack.dqoes("join-token", "list", "--json"))["tokens"], "the token has uses left"


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
    theirs = [f"dqoes.state.{other.name}", f"dqoes.decisions.{other.name}", f"dqoes.latency.{other.name}.x"]
    mine = [f"dqoes.state.{me.name}"]
    out = probe(me, worker_creds(me.name), [*theirs, *mine])
    assert out["identity"] == f"worker-{me.name}"
    refused = " ".join(out["refused"])
    for subject in theirs:
        assert f'Permissions Violation for Publish to "{subject}"'.lower() in refused.lower(), out
    assert mine[0] not in refused, out


def test_an_objective_set_once_on_the_service_applies_on_every_node(stack: Stack) -> None:
    """`dqoes target set --service` once: stored by the manager, handed to every node's worker, which
    governs its task of the service; after a redeploy (new task containers everywhere) the new tasks
    are governed by the stored objective without it being set again."""
    engs = stack.cluster.engines
    service = f"{APPS}_load"
    before = {e.name: task_of(e, service) for e in engs}
    assert all(before.values()), before
    out = json.loads(stack.dqoes("target", "set", "--service", service, str(OBJECTIVE_S), "--json"))
    assert out["ok"] and out["service"] == service, out

    def governed(tasks: dict[str, str]) -> dict[str, Any] | None:
        """The status rows of `tasks` when each is reported by its node under the service's objective."""
        rows = {c["container"]: c for c in stack.status()["containers"]}
        mine = {n: rows.get(t) for n, t in tasks.items()}
        ok = all(r and r["node"] == n and r["objective_s"] == OBJECTIVE_S and r["objective_selector"] == service
                 for n, r in mine.items())
        return mine if ok else None

    # The tasks that carry no objective of their own (an earlier test gave one its own, which wins).
    own = {c["container"] for c in stack.status()["containers"] if c.get("objective_source") == "target"
           and not c.get("objective_selector")}
    free = {n: t for n, t in before.items() if t not in own}
    assert free, (before, own)
    wait_for(lambda: governed(free), 60, f"the service objective in force on {sorted(free)}")
    for e in engs:
        if e.name in free:
            wait_for(lambda e=e: limited(e, before[e.name]), 90, f"the worker of {e.name} limits {before[e.name]}")

    # A redeploy: every node's task replaced by a new container, governed by the stored objective.
    done = subprocess.run(["docker", "service", "update", "--detach", "--force", service], env=stack.env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    def new_tasks() -> dict[str, str] | None:
        now = {e.name: task_of(e, service) for e in engs}
        return now if all(t and t != before[n] for n, t in now.items()) else None

    tasks = wait_for(new_tasks, 120, "a new load task runs on every engine")
    for e in engs:
        wait_for(lambda e=e: limited(e, tasks[e.name]), 90, f"the worker of {e.name} limits {tasks[e.name]}")
    wait_for(lambda: governed(tasks), 30, "every node reports its new task under the service's objective")


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


def test_a_restarted_worker_task_reuses_its_identity_without_joining_again(stack: Stack) -> None:
    """A node's worker task killed: Swarm starts a new one there, which finds its host's keys and reports
    again, though the token is used up; the registry keeps the same keys."""
    e = stack.cluster.engines[1 % len(stack.cluster.engines)]
    joined = json.loads(stack.dqoes("node", "list", "--json"))["nodes"]
    old = task_of(e, f"{STACK}_worker")
    assert old
    t0 = time.time()
    e.docker("rm", "-f", old)
    new = wait_for(lambda: (lambda t: t if t not in (None, old) else None)(task_of(e, f"{STACK}_worker")), 60,
                   f"a new worker task on {e.name}")
    wait_for(lambda: "are reused" in e.docker("logs", new), 30, f"the new worker task on {e.name} reuses its keys")
    wait_for(lambda: float(stack.status()["nodes"].get(e.name, {}).get("at", 0)) > t0, 60,
             f"the new worker of {e.name} reports")
    assert json.loads(stack.dqoes("node", "list", "--json"))["nodes"] == joined


def test_revoking_a_node_cuts_its_worker_off_while_the_others_carry_on(stack: Stack) -> None:
    engs = stack.cluster.engines
    gone = engs[-1]
    out = stack.dqoes("node", "revoke", gone.name)
    assert "reloaded its authorization" in out, out
    refused = probe(gone, worker_creds(gone.name), [f"dqoes.state.{gone.name}"])
    assert "authorization violation" in refused.get("error", "").lower(), refused

    def rounds() -> dict[str, float]:
        """When each node's last state was made (the manager's summary: its node's `at`)."""
        return {k: float(v["at"]) for k, v in stack.status()["nodes"].items()}

    time.sleep(ROUND_S)  # a state the revoked worker sent just before the reload is counted as its last
    before = rounds()
    time.sleep(3 * ROUND_S)
    after = rounds()
    assert after.get(gone.name) in (None, before.get(gone.name)), (before, after)  # no state from it any more
    for e in engs[:-1]:
        assert after[e.name] > before[e.name], (e.name, before, after)  # the others' keep arriving


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
