"""FlowCon's experiments in the simulator over several seeds, next to the paper's numbers.

Why: the FlowCon paper reports one run per experiment; one seed of ours
would be an anecdote too. This runs every built-in training scenario under
FlowCon and default Swarm for each seed (same seed, same jobs, same
submission times for both), and writes makespan and mean completion time per
seed, their means, the change FlowCon makes and the paper's change, so the
comparison with the paper is always over seeds and never a best seed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.scenarios.training import TRAINING_BUILTINS, TrainingProfile, load_training
from shared.sim.training import TrainingSimResult, simulate_training
from shared.timeline import run_file_name, write_jsonl

REPORT_BEGIN = "<!-- BEGIN generated: python -m lab training-report -->"
REPORT_END = "<!-- END generated: python -m lab training-report -->"
POLICIES = ("flowcon", "default")


def is_training(name: str) -> bool:
    return name in TRAINING_BUILTINS


def run_one(name: str, policy: str, seed: int, out: str | None = None,
            profiles: Mapping[str, TrainingProfile] | None = None) -> TrainingSimResult:
    """One simulated run of a built-in training scenario; with `out`, its timeline as JSON lines there."""
    sc = load_training(name, seed, profiles)
    res = simulate_training(sc, policy, seed, record=out is not None)
    if out is not None:
        rows = [{"kind": "meta", "scenario": sc.name, "policy": policy, "seed": seed, "training": True,
                 "workers": {w.name: w.cores for w in sc.workers}}]
        rows += res.timeline + [{"kind": "result", **res.summary()}]
        write_jsonl(Path(out) / run_file_name(sc.name, policy, seed), rows)
    return res


def compare(name: str, seed: int, policies: Sequence[str] = POLICIES,
            profiles: Mapping[str, TrainingProfile] | None = None, out: str | None = None) -> dict[str, Any]:
    """Every policy on the same seed: per-job completion, makespan, mean completion, and FlowCon's change."""
    runs = {p: run_one(name, p, seed, out, profiles) for p in policies}
    data: dict[str, Any] = {"scenario": name, "seed": seed, "policies": {p: r.summary() for p, r in runs.items()}}
    if "flowcon" in runs and "default" in runs:
        f, d = runs["flowcon"], runs["default"]
        data["makespan_change_pct"] = _pct(f.makespan_s, d.makespan_s)
        data["mean_completion_change_pct"] = _pct(f.mean_completion_s, d.mean_completion_s)
        data["jobs_faster"] = sum(1 for j in f.completion_s if f.completion_s[j] < d.completion_s.get(j, 0) - 1e-9)
    return data


def _pct(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return round(100.0 * (a - b) / b, 1)


def report_data(names: Sequence[str], seeds: Sequence[int], profiles: Mapping[str, TrainingProfile] | None = None,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in names:
        per: dict[str, dict[str, list[float]]] = {p: {"makespan_s": [], "mean_completion_s": [], "free_s": []}
                                                  for p in POLICIES}
        faster: list[int] = []
        jobs = workers = 0
        for seed in seeds:
            if progress:
                progress(f"{name} seed {seed}")
            c = compare(name, seed, POLICIES, profiles)
            for p in POLICIES:
                s = c["policies"][p]
                per[p]["makespan_s"].append(s["makespan_s"])
                per[p]["mean_completion_s"].append(s["mean_completion_s"])
                per[p]["free_s"].append(s["free_competition_s"])
                jobs = s["jobs"]
            faster.append(c["jobs_faster"])
        sc = load_training(name, seeds[0] if seeds else 1, profiles)
        workers = len(sc.workers)
        paper = sc.paper
        data[name] = {
            "description": sc.description, "jobs": jobs, "workers": workers,
            "cores": [w.cores for w in sc.workers], "seeds": list(seeds), "policies": per, "jobs_faster": faster,
            "paper": None if paper is None else {
                "makespan_flowcon_s": paper.makespan_flowcon_s, "makespan_default_s": paper.makespan_default_s,
                "mean_completion_flowcon_s": paper.mean_completion_flowcon_s,
                "mean_completion_default_s": paper.mean_completion_default_s, "note": paper.note},
        }
    return data


def _mean(xs: Sequence[float]) -> float:
    return statistics.mean(xs) if xs else 0.0


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def render_report(data: Mapping[str, Any]) -> str:
    lines = [REPORT_BEGIN, ""]
    lines.append(
        "Per built-in training scenario, from `python -m lab training-report` (simulator, the training "
        "profiles of docs/guide/training.md): makespan (first submission to last completion) and mean completion time "
        "(submission to completion, averaged over the jobs), FlowCon vs default Swarm on the same jobs and "
        "submission times for each seed, the means over the seeds, FlowCon's change, and the paper's figure. "
        "\"Faster\" counts the jobs FlowCon finished sooner than default, per seed."
    )
    lines.append("")
    lines.append("| scenario | seeds | makespan FlowCon / default (s) | change | paper | "
                 "mean completion FlowCon / default (s) | change | paper | jobs faster (of n) |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name, d in data.items():
        f, b = d["policies"]["flowcon"], d["policies"]["default"]
        mf, mb = _mean(f["makespan_s"]), _mean(b["makespan_s"])
        cf, cb = _mean(f["mean_completion_s"]), _mean(b["mean_completion_s"])
        p = d["paper"] or {}
        pm = _pct(p.get("makespan_flowcon_s"), p.get("makespan_default_s"))
        pc = _pct(p.get("mean_completion_flowcon_s"), p.get("mean_completion_default_s"))
        paper_m = (f"{p['makespan_flowcon_s']:.1f} / {p['makespan_default_s']:.1f} ({_fmt_pct(pm)})"
                   if p.get("makespan_flowcon_s") else "-")
        paper_c = (f"{p['mean_completion_flowcon_s']:.1f} / {p['mean_completion_default_s']:.1f} ({_fmt_pct(pc)})"
                   if p.get("mean_completion_flowcon_s") else (p.get("note") or "-"))
        seeds = d["seeds"]
        lines.append(
            f"| {name} | {seeds[0]}-{seeds[-1]} | {mf:.1f} / {mb:.1f} | {_fmt_pct(_pct(mf, mb))} | {paper_m} | "
            f"{cf:.1f} / {cb:.1f} | {_fmt_pct(_pct(cf, cb))} | {paper_c} | "
            f"{', '.join(str(x) for x in d['jobs_faster'])} (of {d['jobs']}) |")
    lines.append("")
    lines.append("Per seed (makespan / mean completion, seconds):")
    lines.append("")
    for name, d in data.items():
        f, b = d["policies"]["flowcon"], d["policies"]["default"]
        cells = [f"seed {s}: {fm:.0f}/{fc:.0f} vs {bm:.0f}/{bc:.0f}" for s, fm, fc, bm, bc in zip(
            d["seeds"], f["makespan_s"], f["mean_completion_s"], b["makespan_s"], b["mean_completion_s"], strict=True)]
        free = _mean(f["free_s"])
        lines.append(f"- **{name}** ({d['jobs']} jobs, workers of {', '.join(f'{c:g}' for c in d['cores'])} cores): "
                     + "; ".join(cells) + f". FlowCon in free competition (every job of a worker in CL) "
                     f"{free:.0f} worker-seconds on average.")
    lines.append("")
    lines.append(REPORT_END)
    return "\n".join(lines)
