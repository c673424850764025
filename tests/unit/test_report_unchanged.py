"""The paper experiments' counts are a contract: refactors must not move them.

`tests/fixtures/reports/paper-seeds-1-5.json` is what `dqoes experiment
report --seeds 1-5 --json` printed before the policy registry, the runtime
factory and the schema split (issue 8): the in-band plateau of DQoES and
default Swarm and the oracle's bound, per built-in scenario and seed. The
same simulations must give the same numbers. A deliberate change of a
policy's behaviour updates the fixture in the same commit and says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.scenarios.builtin import BUILTINS
from shared.sim.engine import simulate

BEFORE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "paper-seeds-1-5.json").read_text())


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_in_band_counts_of_the_paper_experiments_are_unchanged(name):
    want = BEFORE[name]
    got: dict[str, list[int]] = {"dqoes": [], "default": [], "oracle_bound": []}
    for seed in want["seeds"]:
        for policy in ("dqoes", "default"):
            r = simulate(BUILTINS[name](seed), policy, seed)
            got[policy].append(r.satisfied_final)
        got["oracle_bound"].append(r.oracle_satisfied)
    assert got == {k: want[k] for k in got}
