"""The paper's experiments over several seeds, as the paper's table of docs/results.md
(rendered by experiments/results_page.py).

Why: one seed of a noisy system is an anecdote. The report runs every
built-in scenario under each policy for each seed in the simulator and
writes the counts per seed and their means, so a headline ratio is always a
mean over seeds, never a best seed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared.core.profiles import ModelProfile
from shared.core.registry import label as policy_label
from shared.scenarios.builtin import BUILTINS, PAPER_REPORT, load
from shared.sim.engine import SimResult, simulate
from shared.timeline import run_file_name, write_jsonl

REPORT_BEGIN = "<!-- BEGIN generated: dqoes experiment report -->"
REPORT_END = "<!-- END generated: dqoes experiment report -->"

Progress = Callable[[float], None]


def run_one(scenario_name: str, policy: str, seed: int, out: str | None = None,
            profiles: dict[str, ModelProfile] | None = None, progress: Progress | None = None) -> SimResult:
    """One simulated run; with `out`, its timeline is written there as JSON lines."""
    sc = load(scenario_name, seed, profiles)
    res = simulate(sc, policy, seed, record=out is not None, progress=progress)
    if out is not None:
        rows = res.timeline + [{"kind": "result", **res.summary()}]
        write_jsonl(Path(out) / run_file_name(sc.name, policy, seed), rows)
    return res


REPORT_POLICIES = ("dqoes", "default", "learned", "oracle")


def report_data(
    names: Sequence[str], seeds: Sequence[int], progress: Callable[[str], Progress] | None = None,
    policies: Sequence[str] = REPORT_POLICIES,
) -> dict[str, Any]:
    """Met, in band and CPU per built-in scenario, policy and seed, with the oracle's bounds.

    `progress(label)` gives a per-run callback.
    """
    data: dict[str, Any] = {}
    for name in names:
        per: dict[str, dict[str, list[float]]] = {p: {"met": [], "in_band": [], "cpu_cores": []} for p in policies}
        bounds: dict[str, list[int]] = {"met": [], "in_band": []}
        r = None
        for seed in seeds:
            for pol in policies:
                cb = progress(f"{name} {pol} seed {seed}") if progress else None
                r = run_one(name, pol, seed, progress=cb)
                per[pol]["met"].append(r.met_final)
                per[pol]["in_band"].append(r.satisfied_final)
                per[pol]["cpu_cores"].append(round(r.cpu_cores_final, 2))
            assert r is not None
            bounds["met"].append(r.oracle_met)
            bounds["in_band"].append(r.oracle_satisfied)
        assert r is not None
        data[name] = {"containers": r.containers, "cores": r.cores_total, "seeds": list(seeds),
                      "policies": per, "oracle_bound": bounds}
    return data


def builtin_names(text: str | None) -> list[str]:
    """Comma-separated built-in scenario names (all of them when None); ValueError naming a bad one."""
    names = text.split(",") if text else list(PAPER_REPORT)
    for n in names:
        if n not in BUILTINS:
            raise ValueError(f"unknown built-in {n!r}")
    return names


def _mean(xs: Sequence[float]) -> float:
    return statistics.mean(xs) if xs else 0.0


def _ratio(a: float, b: float) -> str:
    """a / b, saying so when b cannot carry a ratio."""
    if b == 0:
        return "no ratio (0)"
    return f"{a / b:.2f}" + (" (over 1)" if b == 1 else "")


def render_report(data: dict[str, Any]) -> str:
    lines = [REPORT_BEGIN, ""]
    lines.append(
        "Per built-in scenario and seed, from `dqoes experiment report` (simulator, built-in profiles), "
        "three numbers per policy: **met** (latest batch at or under (1 + alpha) x objective: what a client "
        "counts), **in band** (|S|, within +-alpha of the objective: the paper's figure; a container faster "
        "than asked is met but not in band), both the plateau (lower median) over the final 120 s, and "
        "**CPU spent** by the managed containers (cores, mean over the final window). The oracle bound is the "
        "most any steady allocation can keep met / in band on the same placement (it knows every curve). "
        "Means are over the seeds shown."
    )
    lines.append("")
    for name, d in data.items():
        seeds = d["seeds"]
        lines.append(f"#### {name} ({d['containers']} containers, {d['cores']:g} cores)")
        lines.append("")
        lines.append("| policy | " + " | ".join(f"seed {s}: met / in band / CPU" for s in seeds)
                     + " | mean met | mean in band | mean CPU (cores) |")
        lines.append("|---|" + "---|" * (len(seeds) + 3))
        for pol, v in d["policies"].items():
            cells = [f"{m} / {b} / {c:.1f}" for m, b, c in zip(v["met"], v["in_band"], v["cpu_cores"], strict=True)]
            lines.append(f"| {policy_label(pol)} | " + " | ".join(cells) + f" | {_mean(v['met']):.1f} | "
                         f"{_mean(v['in_band']):.1f} | {_mean(v['cpu_cores']):.2f} |")
        ob = d["oracle_bound"]
        lines.append("| oracle (bound) | " + " | ".join(f"{m} / {b} / -" for m, b in zip(ob["met"], ob["in_band"], strict=True))
                     + f" | {_mean(ob['met']):.1f} | {_mean(ob['in_band']):.1f} | - |")
        pol = d["policies"]
        om, ob_b = sum(ob["met"]), sum(ob["in_band"])
        parts = []
        for p in pol:
            parts.append(f"{policy_label(p)} {_ratio(sum(pol[p]['met']), om)} / {_ratio(sum(pol[p]['in_band']), ob_b)}")
        lines.append("")
        lines.append("Met / in band as a share of the oracle's bound over these seeds: " + "; ".join(parts) + ".")
        if "dqoes" in pol and "default" in pol:
            dq, df = sum(pol["dqoes"]["in_band"]), sum(pol["default"]["in_band"])
            lines.append(f"In band, DQoES to default Swarm: {_ratio(dq, df)} ({dq} vs {df} over the seeds); "
                         f"met: {_ratio(sum(pol['dqoes']['met']), sum(pol['default']['met']))}.")
        lines.append("")
    lines.append(REPORT_END)
    return "\n".join(lines)
