"""Service and percentile objectives end to end: a real nats-server, manager and worker (sim runtime).

A service objective (here the label selector `dqoes.model=resnet50`, the form that also names a
Swarm or compose service) governs every matching container; a container's own objective wins over
it; a container of the service that joins after the objective was set (a replaced replica with a new
name) is governed by the stored one in its first reported state; clearing it hands the containers
back to their labels (or leaves them unmanaged).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
import urllib.request

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.cli.stack import Stack, StackSpec
from shared import subjects
from shared.bus import Bus, BusError
from shared.public import parse_containers_reply, parse_target_reply
from shared.scenarios.builtin import load

pytestmark = pytest.mark.integration

SERVICE = "dqoes.model=resnet50"
TIME_SCALE = 5.0
LATE_AT_S = 75.0
"""Scenario seconds at which the new replica starts (15 wall seconds in)."""


def scenario():
    base = load("paper-varied")
    c = base.containers[0]
    containers = (
        dataclasses.replace(c, name="api-1", objective_s=None),
        dataclasses.replace(c, name="api-2", objective_s=None),
        dataclasses.replace(c, name="api-3", objective_s=None, submit_at_s=LATE_AT_S),
        dataclasses.replace(c, name="other", model="mobilenetv2", objective_s=20.0),
    )
    return dataclasses.replace(base, containers=containers, duration_s=600.0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(StackSpec(scenario(), time_scale=TIME_SCALE, start_delay_s=0.5, state_interval_s=0.3, metrics=True),
              run_dir=tmp_path_factory.mktemp("service-objectives"))
    with s:
        yield s


async def _request(bus: Bus, subject: str, body: dict) -> dict:
    return parse_target_reply(await bus.request(subject, orjson.dumps(body), timeout_s=5))


async def _rows(bus: Bus) -> dict:
    data = await bus.request(subjects.CLUSTER_CONTAINERS, b"{}", timeout_s=5)
    return {r.container: r for r in parse_containers_reply(data)}


async def _until(what, check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def objective_kinds(url: str) -> dict[str, tuple[str, str, str, str]]:
    rows = scrape(url).get("dqoes_container_objective_info", {})
    return {d["container"]: (d["kind"], d["window_s"], d["from"], d["service"]) for d in map(dict, rows)}


def dqoes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_a_service_objective_governs_present_and_future_replicas(stack):
    async def go():
        bus = await Bus.connect(stack.url, "service-objectives")
        try:
            async def ready():
                try:
                    rows = await _rows(bus)
                except BusError:
                    return None
                return rows if {"api-1", "api-2", "other"} <= set(rows) else None

            rows = await _until("the worker's first containers", ready)
            assert "api-3" not in rows, "the late replica must join after the objective is set"
            assert rows["api-1"].managed is False  # no label, no objective yet

            reply = await _request(bus, subjects.TARGETS, {"service": SERVICE, "objective": 60.0,
                                                           "percentile": 90, "window_s": 120})
            assert reply["ok"] is True, reply
            assert (reply["service"], reply["percentile"], reply["window_s"]) == (SERVICE, 90, 120)
            reply = await _request(bus, subjects.TARGETS, {"container": "api-2", "objective": 45.0})
            assert reply["ok"] is True, reply

            async def governed():
                rows = await _rows(bus)
                a1, a2 = rows["api-1"], rows["api-2"]
                if (a1.objective_s, a1.objective_selector, a2.objective_s) == (60.0, SERVICE, 45.0):
                    return rows
                return None

            rows = await _until("the service objective on api-1 and the own one on api-2", governed)
            a1, a2, other = rows["api-1"], rows["api-2"], rows["other"]
            assert (a1.managed, a1.objective_source, a1.percentile, a1.window_s) == (True, "target", 90.0, 120.0)
            assert (a2.objective_source, a2.objective_selector, a2.percentile) == ("target", None, None)
            assert (other.objective_s, other.objective_source, other.objective_selector) == (20.0, "label", None)

            # The new replica: the first state that reports it already carries the stored objective.
            async def joined():
                rows = await _rows(bus)
                return rows.get("api-3")

            late = await _until("the late replica", joined, timeout_s=60.0)
            assert (late.managed, late.objective_s, late.objective_selector, late.percentile) == \
                (True, 60.0, SERVICE, 90.0)

            listed = await _request(bus, subjects.TARGETS_LIST, {})
            kinds = {(t.get("service"), t.get("container")): t for t in listed["targets"]}
            assert set(kinds) == {(SERVICE, None), (None, "api-2")}
            assert kinds[(SERVICE, None)]["containers"] == ["api-1", "api-3"]
            got = await _request(bus, subjects.TARGETS_GET, {"service": SERVICE})
            assert got["ok"] and got["target"]["objective_s"] == 60.0

            # The metrics say each objective's kind and where it comes from.
            kinds = await asyncio.to_thread(objective_kinds, stack.metrics_urls["worker-1"])
            assert kinds["api-1"] == kinds["api-3"] == ("p90", "120", "service", SERVICE)
            assert (kinds["api-2"], kinds["other"]) == (("batch", "", "container", ""), ("batch", "", "label", ""))
            stored = await asyncio.to_thread(scrape, stack.metrics_urls["manager"])
            assert stored["dqoes_service_objectives_stored"][()] == 1.0
            assert stored["dqoes_objectives_stored"][()] == 2.0

            # The CLI shows both kinds and where each comes from.
            r = await asyncio.to_thread(dqoes, "target", "list", "--nats", stack.url)
            assert r.returncode == 0, r.stderr
            header, *lines = r.stdout.splitlines()
            assert header.split() == ["FOR", "OBJECTIVE", "ALPHA", "FROM", "WHERE", "REVISION"]
            assert lines[0].split()[:5] == [SERVICE, "p90", "60", "s/120s", "default"]
            assert "service" in lines[0] and "api-1, api-3" in lines[0]
            assert lines[1].split()[:5] == ["api-2", "45", "s", "default", "container"]
            r = await asyncio.to_thread(dqoes, "status", "--nats", stack.url)
            assert r.returncode == 0, r.stderr
            row = next(line for line in r.stdout.splitlines() if " api-3 " in f" {line} ")
            assert "p90 60 s/120s" in row and f"service {SERVICE}" in row
            r = await asyncio.to_thread(dqoes, "target", "get", "api-3", "--nats", stack.url)
            assert r.returncode == 1 and "no objective stored for 'api-3'" in r.stderr  # none of its own
            assert (f"in force on worker-1: p90 60 s/120s, from the objective stored for service {SERVICE}"
                    in r.stdout), r.stdout
            r = await asyncio.to_thread(dqoes, "target", "get", "--service", SERVICE, "--nats", stack.url, "--json")
            assert r.returncode == 0 and json.loads(r.stdout)["target"]["percentile"] == 90, r.stderr
            r = await asyncio.to_thread(dqoes, "target", "set", "--service", SERVICE, "60", "--percentile", "100",
                                        "--nats", stack.url)
            assert r.returncode != 0 and "percentile" in r.stderr and len(r.stderr.strip().splitlines()) == 1

            cleared = await _request(bus, subjects.TARGETS_CLEAR, {"service": SERVICE})
            assert cleared["ok"] and cleared["containers"] == ["api-1", "api-3"], cleared

            async def released():
                rows = await _rows(bus)
                return rows if not rows["api-1"].managed and not rows["api-3"].managed else None

            rows = await _until("the service's containers released", released)
            assert rows["api-2"].objective_s == 45.0 and rows["api-2"].managed
            assert rows["other"].objective_s == 20.0
            assert (await _request(bus, subjects.TARGETS_LIST, {}))["targets"][0]["container"] == "api-2"
        finally:
            await bus.close()

    asyncio.run(go())
    assert stack.dead() == {}
    assert "Traceback" not in stack.logs()
