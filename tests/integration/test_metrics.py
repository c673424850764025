"""Prometheus metrics: scraped over real HTTP from a live manager and worker, parsed with the
Prometheus text parser, and checked against the node state the worker publishes on the bus."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.bus import Bus
from shared.scenarios.builtin import load
from shared.schema import NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} of one /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def per_container(m, name: str) -> dict[str, float]:
    return {dict(k)["container"]: v for k, v in m.get(name, {}).items()}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # DQoES: a round changes limits, so the state a scrape read is told apart from the next ones by its
    # latencies and limits (learned holds its limits for rounds at a time).
    s = Stack(StackSpec(load("paper-varied"), policy="dqoes", time_scale=10.0, start_delay_s=0.5,
                        state_interval_s=0.3, metrics=True), run_dir=tmp_path_factory.mktemp("metrics"))
    with s:
        yield s


def states_around_a_scrape(url: str, metrics_url: str) -> tuple[list[NodeState], dict]:
    """Node states heard just before and after one scrape of the worker (the scrape is one of them)."""

    async def go():
        bus = await Bus.connect(url, "test-metrics")
        seen: list[NodeState] = []
        await bus.subscribe(subjects.state("worker-1"), lambda m, _: seen.append(m), expect=NodeState)
        try:
            deadline = time.monotonic() + 40
            while True:  # until every container is classified and a round has set a limit
                await asyncio.sleep(0.3)
                last = seen[-1] if seen else None
                if (last is not None and len(last.containers) == 10 and not last.members["pending"]
                        and any(c.limit is not None for c in last.containers)):
                    break
                assert time.monotonic() < deadline, "the worker never classified every container and set a limit"
            m = await asyncio.get_running_loop().run_in_executor(None, scrape, metrics_url)
            n = len(seen)
            while len(seen) < n + 2:
                await asyncio.sleep(0.1)
            return seen[-8:], m
        finally:
            await bus.close()

    return asyncio.run(go())


def latencies_of(ns: NodeState) -> dict[str, float | None]:
    return {c.container: c.latency_s for c in ns.containers}


def limits_of(ns: NodeState) -> dict[str, float]:
    return {c.container: c.limit * ns.cores for c in ns.containers if c.limit is not None}


def test_worker_metrics_match_its_node_state(stack):
    states, m = states_around_a_scrape(stack.url, stack.metrics_urls["worker-1"])
    latency = per_container(m, "dqoes_container_latency_seconds")
    limits = per_container(m, "dqoes_container_cpu_limit_cores")
    # The collector reads the state last published: one of the states heard around the scrape. Two
    # states in a row can hold the same latencies (no batch in between) and differ in limits (a round
    # in between), so a state is matched on both.
    match = [ns for ns in states if latencies_of(ns) == latency and limits == pytest.approx(limits_of(ns))]
    assert match, (latency, limits, [(latencies_of(ns), limits_of(ns)) for ns in states])
    ns = match[-1]
    objectives = {c.container: c.objective_s for c in ns.containers}
    assert per_container(m, "dqoes_container_objective_seconds") == objectives
    assert objectives["c01"] == 75.0
    kinds = {dict(k)["container"]: (dict(k)["kind"], dict(k)["from"], dict(k)["service"])
             for k in m["dqoes_container_objective_info"]}
    assert kinds == {c.container: ("batch", "label", "") for c in ns.containers if c.managed}
    assert limits, "the worker exports no limit"
    met = per_container(m, "dqoes_container_met")
    assert met == {c.container: float(c.met) for c in ns.containers if c.met is not None}
    assert sum(met.values()) == ns.met
    in_band = per_container(m, "dqoes_container_in_band")
    assert sum(in_band.values()) == ns.satisfied == m["dqoes_node_in_band"][(("node", "worker-1"),)]
    classes = {dict(k)["class"]: v for k, v in m["dqoes_node_containers"].items()}
    assert classes == {"G": len(ns.members["G"]), "S": len(ns.members["S"]), "B": len(ns.members["B"]),
                       "pending": 0, "unmanaged": 0}
    assert m["dqoes_node_cores"][(("node", "worker-1"),)] == ns.cores
    params = {dict(k)["param"]: v for k, v in m["dqoes_policy_param"].items()}
    assert params == ns.params
    # no throttling counters from the simulated runtime: absent, not zero
    assert "dqoes_container_throttled_ratio" not in m
    rounds = m["dqoes_rounds_total"][(("node", "worker-1"),)]
    assert rounds >= ns.round >= 1
    hist = m["dqoes_round_duration_seconds_count"][(("node", "worker-1"),)]
    assert hist == rounds
    assert m["dqoes_bus_dropped_messages_total"][(("node", "worker-1"),)] == 0


def manager_knows_every_container(metrics_url: str, timeout_s: float = 40.0) -> None:
    """Wait until the manager serves its metrics and has heard the worker's state with all ten
    containers (run alone, this file's manager test would otherwise scrape a server not yet up, or ask
    for an objective of a container not yet known)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            m = scrape(metrics_url)
        except OSError:  # not serving yet
            m = {}
        if sum(m.get("dqoes_cluster_node_containers", {}).values()) == 10:
            return
        assert time.monotonic() < deadline, "the manager never heard the worker's ten containers"
        time.sleep(0.2)


def test_manager_metrics_count_targets_and_sum_the_cluster(stack):
    manager_knows_every_container(stack.metrics_urls["manager"])

    async def go():
        bus = await Bus.connect(stack.url, "test-metrics")
        try:
            await bus.request(subjects.TARGETS, b'{"container": "c02", "objective": 30}', timeout_s=3)
            await bus.request(subjects.TARGETS, b'{"container": "c02", "objective": -1}', timeout_s=3)
            # Only the node's own worker identity may publish its state (shared/auth.py).
            worker = await Bus.connect(stack.url_for("worker-worker-1"), "test-metrics-worker")
            await worker.publish_raw(subjects.state("worker-1"), b"\x00 not msgpack")
            await worker.flush()
            await worker.close()
        finally:
            await bus.close()

    asyncio.run(go())
    deadline = time.monotonic() + 10
    while True:
        m = scrape(stack.metrics_urls["manager"])
        if m["dqoes_bus_dropped_messages_total"][(("node", "manager"),)] >= 1:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    results = {dict(k)["result"]: v for k, v in m["dqoes_target_requests_total"].items()}
    assert results == {"accepted": 1.0, "rejected": 1.0, "cleared": 0.0}
    assert m["dqoes_objectives_stored"][()] == 1.0
    assert m["dqoes_service_objectives_stored"][()] == 0.0
    assert m["dqoes_cluster_nodes"][()] == 1.0
    per_node = {dict(k)["class"]: v for k, v in m["dqoes_cluster_node_containers"].items()}
    assert sum(per_node.values()) == 10
    assert m["dqoes_cluster_in_band"][()] == sum(m["dqoes_cluster_node_in_band"].values()) == per_node["S"]
    assert not [name for name in m if "satisf" in name]  # one vocabulary: met and in band
