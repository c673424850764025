"""Fuzz every entry point with 10,000 generated inputs (hypothesis): no crash, nothing changed."""

from __future__ import annotations

import os

from bench.fuzz_inputs import DOORS, fuzz

EXAMPLES = int(os.environ.get("DQOES_FUZZ_EXAMPLES", "10000"))


def run() -> dict:
    out = {}
    for name in DOORS:
        r = fuzz(name, EXAMPLES)
        print(f"  {name:<12} {r.inputs:>6} inputs (goal >= {EXAMPLES}, ratio {r.inputs / EXAMPLES:.3f}), "
              f"{r.accepted:>5} accepted; none crashed, none refused changed anything ({r.seconds:.0f} s)",
              flush=True)
        out[name] = {"value": r.inputs, "unit": "inputs", "goal": EXAMPLES, "ratio": r.inputs / EXAMPLES,
                     "accepted": r.accepted, "seconds": round(r.seconds, 1)}
    return out
