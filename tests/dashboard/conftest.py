"""Fixtures for the dashboard's tests: real timelines, a real cluster, a tap on the bus.

Timelines come from the simulator itself (paper-cluster-40, DQoES and
default Swarm, seed 1), so the recorded view is checked against the
simulator's own numbers. The live cluster is `services.cli.stack.Stack`, the
deployment `dqoes up` runs: a private nats-server, the manager and one worker
process per node of tests/e2e/small-cluster.json (two nodes, six
containers), sped up so that a few seconds cover minutes of scenario time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import streamlit as st

from services.cli.stack import Stack, StackSpec
from shared.scenarios.builtin import load
from shared.sim.engine import SimResult, simulate
from shared.timeline import run_file_name, write_jsonl

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "dashboard" / "app.py")
SMALL = REPO / "tests" / "e2e" / "small-cluster.json"


@dataclass(frozen=True)
class SimRuns:
    """paper-cluster-40, seed 1, under DQoES and default Swarm: timeline files and results."""

    dir: Path
    files: dict[str, Path]
    results: dict[str, SimResult]


@pytest.fixture(scope="session")
def sim_runs(tmp_path_factory: pytest.TempPathFactory) -> SimRuns:
    out = tmp_path_factory.mktemp("runs")
    sc = load("paper-cluster-40", 1)
    files, results = {}, {}
    for policy in ("dqoes", "default"):
        res = simulate(sc, policy, 1, record=True)
        rows = res.timeline + [{"kind": "result", **res.summary()}]
        files[policy] = write_jsonl(out / run_file_name(sc.name, policy, 1), rows)
        results[policy] = res
    return SimRuns(out, files, results)


@pytest.fixture(autouse=True)
def _fresh_streamlit_caches() -> Iterator[None]:
    """Each test starts with no cached collector or file (a cached collector is stopped)."""
    st.cache_resource.clear()
    yield
    st.cache_resource.clear()


@pytest.fixture(scope="session")
def small_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A live DQoES cluster of two nodes, scenario time x20, node states every 0.3 s."""
    spec = StackSpec(load(str(SMALL), 1), policy="dqoes", time_scale=20.0, start_delay_s=0.5, state_interval_s=0.3)
    with Stack(spec, run_dir=tmp_path_factory.mktemp("stack")) as s:
        yield s
