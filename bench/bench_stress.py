"""Policies on stress variants of the random clusters: scarce, crowded, roomy, noisy, tight bands, sticky noise,
spells a node shares, threads that follow the limit.

Why: the learned allocator was developed on `random-cluster-40` (seeds 1-400)
and is judged there on held-out seeds (`make bench-policies`); a user's node
is rarely that one. Each variant (shared/scenarios/builtin.py, STRESS) makes
the same draws from the seed and then departs from it in one way: half the
cores on every node, the 40 containers on two nodes, twice the cores, noise
sigma in [0.15, 0.3], a band of +-5 %, noise that persists from batch to
batch (lag-one correlation 0.6), slow spells every container of a node
shares (every 120 s on average, 5-60 s long, 1.2-1.6x slower), or
workloads whose threads follow their limit (floor of it, up to four). Seeds 1001-1020 of each, never run
while the allocator was developed; every policy runs every seed (no prior),
with the figures and goals of `make bench-policies`.

Writes bench/out/stress.json; with $DQOES_BENCH_DATA (`make bench-stress`: docs/data)
also the summary docs/results.md is rendered from (bench-stress.json there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.bench_policies import SEEDS, run_sets
from shared.scenarios.builtin import STRESS

OUT = Path(__file__).resolve().parent / "out" / "stress.json"
KEY = "stress"


def run() -> dict[str, Any]:
    return run_sets([(name, SEEDS) for name in STRESS], None, OUT, KEY)
