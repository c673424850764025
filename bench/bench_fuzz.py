"""Fuzz every entry point with 10,000 generated inputs (hypothesis): no crash, nothing changed."""

from __future__ import annotations

import os

from bench.common import report
from bench.fuzz_inputs import DOORS, fuzz

EXAMPLES = int(os.environ.get("DQOES_FUZZ_EXAMPLES", "10000"))


def run() -> dict:
    out = {}
    for name in DOORS:
        r = fuzz(name, EXAMPLES)
        print(f"  {name:<12} {r.inputs:>6} inputs, {r.accepted:>5} accepted, none crashed or changed "
              f"state when refused ({r.seconds:.0f} s)", flush=True)
        out[name] = report(f"{name}: inputs without a failure", r.inputs, "inputs", EXAMPLES,
                           lower_is_better=False)
    return out
