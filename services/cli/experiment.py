"""`dqoes experiment ...`: run the simulator from the command line.

Thin: parse, call `shared.sim`, format. Tables for people, one JSON object on
the last line of stdout with --json for programs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import orjson

from services.cli.progress import Progress
from shared.core.profiles import ModelProfile
from shared.sim.builtin import BUILTINS, load
from shared.sim.engine import POLICIES, SimResult, simulate
from shared.sim.scenario import load_profiles_file
from shared.timeline import run_file_name, write_jsonl


class CliError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise CliError(f"--seeds: expected a list like 1-5 or 1,3,7, got {text!r}") from None
    if not out:
        raise CliError("--seeds: no seeds given")
    return out


def emit_json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj).decode() + "\n")
    sys.stdout.flush()


def profiles_from(path: str | None) -> dict[str, ModelProfile] | None:
    """--profiles FILE, else $DQOES_PROFILES, else None (the built-ins)."""
    path = path or os.environ.get("DQOES_PROFILES") or None
    return None if path is None else load_profiles_file(path)


def run_one(scenario_name: str, policy: str, seed: int, out: str | None, label: str | None = None,
            profiles: dict[str, ModelProfile] | None = None) -> SimResult:
    sc = load(scenario_name, seed, profiles)
    prog = Progress(label or f"{sc.name} {policy} seed {seed}")
    res = simulate(sc, policy, seed, record=out is not None, progress=prog)
    if out is not None:
        rows = res.timeline + [{"kind": "result", **res.summary()}]
        write_jsonl(Path(out) / run_file_name(sc.name, policy, seed), rows)
    return res


def cmd_list(args: argparse.Namespace) -> int:
    rows = []
    for name, make in BUILTINS.items():
        sc = make(1)
        rows.append(
            {
                "name": name,
                "nodes": len(sc.nodes),
                "containers": len(sc.containers),
                "duration_s": sc.duration_s,
                "description": sc.description,
            }
        )
    if args.json:
        emit_json({"scenarios": rows})
        return 0
    w = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{w}}  {r['nodes']} node(s) {r['containers']:>3} containers  {r['description']}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    res = run_one(args.scenario, args.policy, args.seed, args.out, profiles=profiles_from(args.profiles))
    s = res.summary()
    if not args.json:
        print(f"scenario {s['scenario']}  policy {s['policy']}  seed {s['seed']}")
        print(f"  {s['containers']} containers on {s['nodes']} node(s), {s['sim_duration_s']:.0f} s simulated, {s['rounds']} rounds")
        print(f"  satisfied (plateau of the last {s['final_window_s']:.0f} s): {s['satisfied_final']}"
              f"   at the end: {s['satisfied_at_end']}   oracle: {s['oracle_satisfied']}")
        per = "  ".join(f"{k}: {v}" for k, v in s["satisfied_per_node"].items())
        print(f"  per node: {per}")
        conv = "never settled" if s["converged_round"] is None else f"round {s['converged_round']} ({s['converged_at_s']:.0f} s)"
        print(f"  |S| settled: {conv}")
        if args.out:
            print(f"  timeline: {Path(args.out) / run_file_name(res.scenario, res.policy, res.seed)}")
    if args.json:
        emit_json({k: v for k, v in s.items() if k != "final" or args.verbose})
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in POLICIES:
            raise CliError(f"--policies: unknown policy {p!r} (choose from {', '.join(POLICIES)})")
    profiles = profiles_from(args.profiles)
    results = {p: run_one(args.scenario, p, args.seed, args.out, profiles=profiles) for p in policies}
    first = next(iter(results.values()))
    table = {p: {"satisfied_final": r.satisfied_final, "satisfied_per_node": r.satisfied_per_node,
                 "satisfied_at_end": r.satisfied_at_end} for p, r in results.items()}
    summary = {
        "scenario": first.scenario,
        "seed": first.seed,
        "containers": first.containers,
        "nodes": first.nodes,
        "oracle_satisfied": first.oracle_satisfied,
        "policies": table,
    }
    if "dqoes" in results and "default" in results:
        d, b = results["dqoes"].satisfied_final, results["default"].satisfied_final
        summary["ratio_dqoes_to_default"] = None if b == 0 else round(d / b, 2)
    if not args.json:
        nodes = list(first.satisfied_per_node)
        print(f"{first.scenario}, seed {first.seed}: {first.containers} containers on {first.nodes} node(s); "
              f"satisfied containers (plateau of the final {first.final_window_s:.0f} s)")
        head = f"{'policy':<9}" + "".join(f"{n:>10}" for n in nodes) + f"{'total':>8}"
        print(head)
        for p, r in results.items():
            print(f"{p:<9}" + "".join(f"{r.satisfied_per_node[n]:>10}" for n in nodes) + f"{r.satisfied_final:>8}")
        print(f"{'oracle*':<9}" + "".join(f"{first.oracle_per_node[n]:>10}" for n in nodes) + f"{first.oracle_satisfied:>8}")
        print("* the most any steady allocation can satisfy on this placement (knows every latency curve)")
        if "ratio_dqoes_to_default" in summary:
            r = summary["ratio_dqoes_to_default"]
            d, b = results["dqoes"].satisfied_final, results["default"].satisfied_final
            print(f"DQoES satisfies {d} vs {b} for default Swarm" + (f": {r}x" if r is not None else ""))
    if args.json:
        emit_json(summary)
    return 0


REPORT_BEGIN = "<!-- BEGIN generated: dqoes experiment report -->"
REPORT_END = "<!-- END generated: dqoes experiment report -->"


def cmd_report(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    names = args.scenarios.split(",") if args.scenarios else list(BUILTINS)
    for n in names:
        if n not in BUILTINS:
            raise CliError(f"--scenarios: unknown built-in {n!r}")
    data: dict[str, Any] = {}
    for name in names:
        per: dict[str, list[int]] = {"dqoes": [], "default": [], "oracle_bound": []}
        for seed in seeds:
            for pol in ("dqoes", "default"):
                r = run_one(name, pol, seed, None, f"{name} {pol} seed {seed}")
                per[pol].append(r.satisfied_final)
            per["oracle_bound"].append(r.oracle_satisfied)
        data[name] = {"containers": r.containers, "seeds": seeds, **per}
    md = render_report(data)
    if args.update:
        update_section(Path(args.update), md)
    if args.json:
        emit_json({"report": data})
    else:
        print(md)
    return 0


def render_report(data: dict[str, Any]) -> str:
    lines = [REPORT_BEGIN, ""]
    lines.append("Satisfied containers at the plateau (lower median of |S| over the final 120 s), "
                 "by seed, from `dqoes experiment report` (simulator, built-in profiles).")
    lines.append("")
    for name, d in data.items():
        seeds = d["seeds"]
        lines.append(f"#### {name} ({d['containers']} containers)")
        lines.append("")
        lines.append("| policy | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |")
        lines.append("|---|" + "---|" * (len(seeds) + 1))
        for key, label in (("dqoes", "DQoES"), ("default", "default Swarm"), ("oracle_bound", "oracle (bound)")):
            vals = d[key]
            lines.append(f"| {label} | " + " | ".join(str(v) for v in vals) + f" | {statistics.mean(vals):.1f} |")
        dq, df = sum(d["dqoes"]), sum(d["default"])
        if df:
            lines.append("")
            lines.append(f"DQoES satisfies {dq / df:.1f}x as many containers as default Swarm over these seeds "
                         f"({dq} vs {df}); it reaches {dq / max(1, sum(d['oracle_bound'])) * 100:.0f}% of the oracle's bound.")
        lines.append("")
    lines.append(REPORT_END)
    return "\n".join(lines)


def update_section(path: Path, block: str, begin: str = REPORT_BEGIN, end: str = REPORT_END) -> None:
    """Replace the generated block in a Markdown file (or append it)."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        a = text.index(begin)
        b = text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


PROFILES_HELP = ("model profiles (e.g. from `dqoes calibrate --out`) replacing the built-ins of the same names "
                 "(default: $DQOES_PROFILES; a scenario file's own `profiles`/`models` still win)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser("experiment", help="run the simulator on built-in or user scenarios",
                        description="Run DQoES, default Swarm or the oracle on a simulated cluster.")
    es = ex.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = es.add_parser("list", help="list built-in scenarios")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_list)

    p = es.add_parser("run", help="run one scenario under one policy",
                      description="Run SCENARIO (a built-in name or a .toml/.json file) under one policy.")
    p.add_argument("scenario", metavar="SCENARIO")
    p.add_argument("--policy", choices=POLICIES, default="dqoes")
    p.add_argument("--seed", type=int, default=1, help="random seed (noise, random objectives)")
    p.add_argument("--out", metavar="DIR", help="write the timeline as JSON lines into DIR")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.add_argument("--verbose", action="store_true", help="with --json, include every container's final state")
    p.add_argument("--profiles", metavar="FILE", help=PROFILES_HELP)
    p.set_defaults(func=cmd_run)

    p = es.add_parser("compare", help="run one scenario under several policies, same seed")
    p.add_argument("scenario", metavar="SCENARIO")
    p.add_argument("--policies", default="dqoes,default", help="comma-separated (default: dqoes,default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", metavar="DIR", help="write each run's timeline into DIR")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.add_argument("--profiles", metavar="FILE", help=PROFILES_HELP)
    p.set_defaults(func=cmd_compare)

    p = es.add_parser("report", help="satisfied counts of the paper's experiments over seeds, as Markdown")
    p.add_argument("--seeds", default="1-5", help="e.g. 1-5 or 1,3,7")
    p.add_argument("--scenarios", help="comma-separated built-ins (default: all)")
    p.add_argument("--update", metavar="FILE", help="replace the generated section of this Markdown file")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.set_defaults(func=cmd_report)

    from services.cli import realexp  # here: it imports this module

    realexp.add_parser(es)
