"""Acceptance: one short simulation under the learned allocator gives the figures it gave as one module.

The figures below were printed by the single-module allocator (before it became a package) for the
same scenario and seed; the simulator is deterministic in its seed, so any change of a decision the
allocator makes shows here first (a change of the limits, of how many rounds it took, of the count).
A deliberate change of behaviour updates them, with the reason in its commit.
"""

from __future__ import annotations

from shared.scenarios.builtin import load
from shared.sim.engine import simulate

FINAL_LIMITS = {"c01": 0.05, "c02": 0.0615, "c03": 0.0516, "c04": 0.071, "c05": 0.1, "c06": 0.05, "c07": 0.05,
                "c08": 0.1, "c09": 0.25, "c10": 0.129}


def test_the_papers_varied_node_gives_the_figures_it_always_gave():
    s = simulate(load("fig2node-varied", 1), "learned", 1).summary()
    assert (s["met_final"], s["satisfied_final"], s["cpu_cores_final"]) == (9, 6, 5.205)
    assert (s["rounds"], s["limit_changes"], s["converged_round"]) == (43, 25, 31)
    assert {f["container"]: f["limit"] for f in s["final"]} == FINAL_LIMITS
