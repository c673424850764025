"""The live system and the virtual-time simulator agree on the same scenario and seed.

Live: a private nats-server, the manager and a worker process hosting the
scenario's simulated containers on a scaled clock, every batch latency going
over NATS. Simulator: the same core in virtual time. Both are measured the
same way (plateau of |S| over the final window).
"""

from __future__ import annotations

import asyncio

import pytest

from services.cli.live import observe
from services.cli.stack import Stack, StackSpec
from shared.scenarios.builtin import load
from shared.sim.engine import simulate

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["paper-varied", "paper-identical-achievable"])
def test_live_and_simulated_runs_end_within_one(name, tmp_path):
    sc = load(name, 1)
    sim = simulate(sc, "dqoes", 1)
    stack = Stack(StackSpec(sc, policy="dqoes", seed=1, time_scale=40.0, start_delay_s=2.0, state_interval_s=0.25),
                  run_dir=tmp_path / "run")
    with stack:
        obs = asyncio.run(observe([stack], sc.duration_s, quiet=True))
    live = obs[0].summary(sc.duration_s)
    assert "Traceback" not in stack.logs()
    print(f"{name}: live {live['satisfied_final']} vs simulator {sim.satisfied_final}")
    assert abs(live["satisfied_final"] - sim.satisfied_final) <= 1, (live, sim.summary())
