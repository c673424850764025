"""A rolling restart of every worker keeps the objectives and the limits in force; removing a node gives its
containers their own limits back.

Real processes against the real engine and the real nats-server: `dqoes serve control-plane`, and two
`dqoes serve node` roles (docker runtime, each governing the containers labelled with its name on this
engine, configured by a TOML file as on a host). The test plays the containers' side: it reads each
container's CPU quota from the engine and publishes a batch latency that follows it (0.1 cpu-s of work
per batch), as the node's inference identity. Objectives are set with `dqoes target set`.

Once the workers have limited every container, each worker is restarted in turn, three ways: SIGTERM to
the worker (its supervisor restarts it), SIGKILL to the worker (likewise), and a restart of the whole role
(SIGTERM to the supervisor, then the same command again: what `systemctl restart dqoes-node` does). After
each: the new worker's first state shows the limits in force before (it adopted them), the engine's
quota never moved between the kill and the new worker's first round, that round starts from those limits
(every container's old_limit), the engine then holds what the round decided, and the worker's state shows
every objective again. The control plane's restart moves no limit either, and the nodes come back with
their objectives. Then one node is removed as docs/guide/install.md says: `on_stop = "restore"`,
a restart, a stop, `dqoes node revoke`; its containers are back to no limit, the other node's keep theirs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from role_parts import Role, dqoes, worker_pid

from shared import subjects
from shared.bus import Bus
from shared.ports import free_port
from shared.schema import DecisionMsg, LatencyEvent, NodeState

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
CORES = 2.0
WORK_CPU_S = 0.1
"""CPU seconds of one batch: its latency is this over its limit in cores (all the node's without one)."""
OBJECTIVES_S = {"a": 0.4, "b": 0.8}
TOLERANCE_CORES = 0.005


@dataclass
class Seen:
    """What the test saw, with the monotonic time it arrived."""

    states: dict[str, list[tuple[float, NodeState]]] = field(default_factory=dict)
    decisions: dict[str, list[tuple[float, DecisionMsg]]] = field(default_factory=dict)
    quotas: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Containers:
    """The test's side of the containers: quotas from the engine, latencies onto NATS, states and decisions
    from NATS. Runs in a thread with its own event loop."""

    def __init__(self, client: Any, url: str, admin: Path, nodes: dict[str, tuple[Path, list[str]]]) -> None:
        self.client, self.url, self.admin, self.nodes = client, url, admin, nodes
        self.seen = Seen()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def quota_cores(self, name: str) -> float | None:
        hc = self.client.api.inspect_container(name)["HostConfig"]
        if (hc.get("NanoCpus") or 0) > 0:
            return hc["NanoCpus"] / 1e9
        quota, period = hc.get("CpuQuota") or 0, hc.get("CpuPeriod") or 100_000
        return quota / period if quota > 0 else None

    async def _main(self) -> None:
        watcher = await Bus.connect(self.url, "test-watcher", creds=self.admin)
        feeders = {}
        for node, (creds, _) in self.nodes.items():
            self.seen.states[node], self.seen.decisions[node] = [], []
            await watcher.subscribe(subjects.state(node), self._keep(self.seen.states[node]), expect=NodeState)
            await watcher.subscribe(subjects.decisions(node), self._keep(self.seen.decisions[node]),
                                    expect=DecisionMsg)
            feeders[node] = await Bus.connect(self.url, f"test-inference-{node}", creds=creds)
        batch = 0
        try:
            while not self.stopping.is_set():
                batch += 1
                for node, (_, names) in self.nodes.items():
                    for name in names:
                        cores = await asyncio.to_thread(self.quota_cores, name)
                        with self.seen.lock:
                            self.seen.quotas.setdefault(name, []).append((time.monotonic(), cores))
                        latency_s = WORK_CPU_S / min(cores or CORES, CORES)
                        await feeders[node].publish(subjects.latency(node, name), LatencyEvent(
                            container=name, node=node, latency_s=latency_s, images=1, batch=batch,
                            finished_at=time.time()))
                await asyncio.sleep(0.25)
        finally:
            for b in [watcher, *feeders.values()]:
                await b.close()

    def _keep(self, into: list[Any]) -> Callable[[Any, Any], None]:
        def keep(msg: Any, _: Any) -> None:
            with self.seen.lock:
                into.append((time.monotonic(), msg))
        return keep

    def states(self, node: str, since: float = 0.0) -> list[tuple[float, NodeState]]:
        with self.seen.lock:
            return [(t, s) for t, s in self.seen.states[node] if t >= since]

    def decisions(self, node: str, since: float = 0.0) -> list[tuple[float, DecisionMsg]]:
        with self.seen.lock:
            return [(t, d) for t, d in self.seen.decisions[node] if t >= since]

    def quotas(self, name: str, since: float, until: float) -> list[float | None]:
        with self.seen.lock:
            return [q for t, q in self.seen.quotas.get(name, []) if since <= t <= until]


def wait(what: str, check: Callable[[], Any], timeout_s: float = 90, logs: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}\n{logs()[-3000:]}"
        time.sleep(0.1)


def limits_of(state: NodeState) -> dict[str, float | None]:
    """Limits in cores, as the state has them (fractions of the node)."""
    return {c.container: None if c.limit is None else c.limit * state.cores for c in state.containers}


def same(a: float | None, b: float | None) -> bool:
    return (a is None) == (b is None) and (a is None or b is None or abs(a - b) <= TOLERANCE_CORES)


def node_config(path: Path, name: str, url: str, on_stop: str) -> None:
    path.write_text(f'[node]\nname = "{name}"\ncontrol_plane = "{url}"\nruntime = "docker"\npolicy = "learned"\n'
                    f'cores = {CORES}\nrequire_node_label = true\non_stop = "{on_stop}"\n')


def test_a_rolling_restart_keeps_objectives_and_limits_and_removing_a_node_restores_them(
        containers, docker_client, tmp_path):
    run = containers.run_id[:6]
    nodes = {k: f"rr{run}{k}" for k in ("a", "b")}
    names = {k: [containers.run(f"{k}{i}", labels={"dqoes.node": node}).name for i in (1, 2)]
             for k, node in nodes.items()}
    objective_of = {n: OBJECTIVES_S["a" if n.endswith("1") else "b"] for k in nodes for n in names[k]}
    cp_state, port = tmp_path / "cp", free_port()
    url = f"nats://127.0.0.1:{port}"
    cp = Role(["serve", "control-plane", "--port", str(port)], cp_state, tmp_path / "cp.out").start()
    roles: dict[str, Role] = {}
    feed = None
    try:
        cp.wait_for("control plane: ready")
        for k, node in nodes.items():
            tok = dqoes("join-token", "create", "--quiet", state=cp_state)
            assert tok.returncode == 0, tok.stderr
            joined = dqoes("join", url, "--token", tok.stdout.strip(), "--name", node, state=tmp_path / k)
            assert joined.returncode == 0, joined.stderr
            node_config(tmp_path / f"{k}.toml", node, url, "keep")
            roles[k] = Role(["serve", "node", "--config", str(tmp_path / f"{k}.toml")], tmp_path / k,
                            tmp_path / f"{k}.out").start()
            roles[k].wait_for(f"node {node}: worker on the docker runtime")
        client_creds = cp_state / "control-plane" / "auth" / "client.creds"
        feed = Containers(docker_client, url, cp_state / "control-plane" / "auth" / "admin.creds",
                          {node: (tmp_path / k / "node" / "auth" / f"inference-{node}.creds", names[k])
                           for k, node in nodes.items()})
        feed.thread.start()
        for name, objective_s in objective_of.items():
            r = dqoes("target", "set", name, str(objective_s), "--nats", url, "--creds", str(client_creds),
                      state=cp_state)
            assert r.returncode == 0, r.stdout + r.stderr

        def log_of(k: str) -> Callable[[], str]:
            return lambda: (roles[k].text() + (tmp_path / k / "node" / f"worker-{nodes[k]}.log").read_text(
                errors="replace"))

        def objectives_in_force(state: NodeState) -> bool:
            return {c.container: c.objective_s for c in state.containers} == {n: objective_of[n] for n in
                                                                               names_of[state.node]}

        names_of = {nodes[k]: names[k] for k in nodes}
        # Settle: every container limited by its worker, with its objective in force.
        for k, node in nodes.items():
            wait(f"{node}: no state with every container limited and its objective",
                 lambda node=node: [s for _, s in feed.states(node)[-1:]
                                    if objectives_in_force(s) and all(v is not None for v in limits_of(s).values())],
                 timeout_s=180, logs=log_of(k))

        def restart(k: str, how: str) -> dict[str, Any]:
            node, role = nodes[k], roles[k]
            before_states = feed.states(node)
            before = limits_of(before_states[-1][1])
            for name, cores in before.items():  # the engine holds what the worker says
                assert same(feed.quota_cores(name), cores), (name, cores, feed.quota_cores(name))
            t_kill = time.monotonic()
            if how == "role":
                role.stop()
                roles[k] = role = Role(role.argv, role.state, role.out).start()
            else:
                restarts = role.text().count(f"worker-{node} restarted")
                os.kill(worker_pid(role), signal.SIGTERM if how == "term" else signal.SIGKILL)
                role.wait_for(f"worker-{node} restarted", count=restarts + 1)
            first_state = wait(f"{node}: no state from the restarted worker",
                               lambda: [s for _, s in feed.states(node, t_kill) if s.round == 0][:1],
                               logs=log_of(k))[0]
            t_first, first_decision = wait(f"{node}: no round from the restarted worker",
                                           lambda: [(t, d) for t, d in feed.decisions(node, t_kill)
                                                    if d.round == 1][:1], logs=log_of(k))[0]
            # the worker adopted the limits in force, and the engine's quota did not move until its first round
            adopted = limits_of(first_state)
            assert all(same(adopted[n], before[n]) for n in before), (how, node, before, adopted)
            for name, cores in before.items():
                moved = [q for q in feed.quotas(name, t_kill, t_first) if not same(q, cores)]
                assert not moved, (how, name, cores, moved)
            # its first round starts from those limits; any change in it is the policy's
            old = {c.container: None if c.old_limit is None else c.old_limit * CORES for c in first_decision.containers}
            assert set(old) == set(before), (old, before)
            assert all(same(old[n], before[n]) for n in before), (how, node, before, old)
            # every objective is in force again
            wait(f"{node}: objectives not in force after the restart",
                 lambda: [s for _, s in feed.states(node, t_kill) if objectives_in_force(s)], timeout_s=30,
                 logs=log_of(k))
            changed = {c.container: (c.old_limit, c.new_limit) for c in first_decision.containers
                       if c.old_limit != c.new_limit}
            return {"how": how, "node": node, "changed_in_first_round": changed,
                    "restart_to_first_round_s": round(t_first - t_kill, 2)}

        rounds = []
        for how in ("term", "kill", "role"):
            for k in nodes:  # rolling: one node after the other
                rounds.append(restart(k, how))
        print("\n".join(map(str, rounds)))

        # The control plane restarted (systemctl restart): the nodes reconnect, the limits do not move meanwhile.
        held = {n: feed.quota_cores(n) for k in nodes for n in names[k]}
        t_cp = time.monotonic()
        assert cp.stop() == 0
        cp = Role(cp.argv, cp.state, cp.out).start()
        cp.wait_for("control plane: ready", count=2)
        t_ready = time.monotonic()
        for k, node in nodes.items():
            wait(f"{node}: no state with its objectives after the control plane's restart",
                 lambda node=node: [s for _, s in feed.states(node, t_ready) if objectives_in_force(s)],
                 timeout_s=60, logs=log_of(k))
        t_back = time.monotonic()
        for name, cores in held.items():
            moved = [q for q in feed.quotas(name, t_cp, t_back) if not same(q, cores)]
            assert not moved, ("control plane restart", name, cores, moved)

        # Remove node b as the guide says: restore on stop, restart, stop, revoke.
        kept_a = {n: feed.quota_cores(n) for n in names["a"]}
        node_config(tmp_path / "b.toml", nodes["b"], url, "restore")
        roles["b"].stop()
        roles["b"] = Role(roles["b"].argv, roles["b"].state, roles["b"].out).start()
        roles["b"].wait_for(f"node {nodes['b']}: worker on the docker runtime")
        t_up = time.monotonic()
        wait("b: no state from the restarted worker", lambda: [s for _, s in feed.states(nodes["b"], t_up)],
             logs=log_of("b"))
        assert roles["b"].stop() == 0
        assert {n: feed.quota_cores(n) for n in names["b"]} == {n: None for n in names["b"]}
        revoked = dqoes("node", "revoke", nodes["b"], state=cp_state)
        assert revoked.returncode == 0, revoked.stderr
        listed = dqoes("node", "list", "--json", state=cp_state)
        assert nodes["b"] not in listed.stdout and nodes["a"] in listed.stdout
        # node a carries on with its limits (its worker still decides them)
        time.sleep(3)
        assert all(feed.quota_cores(n) is not None for n in names["a"]), kept_a
        assert roles["a"].proc is not None and roles["a"].proc.poll() is None
    finally:
        if feed is not None:
            feed.stopping.set()
            feed.thread.join(10)
        for role in roles.values():
            role.stop()
        cp.stop()
