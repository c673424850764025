"""`dqoes experiment ...`: run the simulator and the experiments from the command line.

Thin: parse arguments, call the simulator or the `experiments` package,
format. Tables for people, one JSON object on the last line of stdout with
--json for programs. Only what a user of the product needs is here (the
scenarios, comparisons, the paper's report, the real-node trial); the
project's own research tools are `python -m lab` in the checkout.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from experiments import paired, real, report
from experiments import training as training_exp
from experiments.common import update_section
from services.cli.common import CliError, emit_json, parse_seeds, profiles_from
from services.cli.progress import Progress
from shared.core import registry
from shared.core.profiles import ModelProfile
from shared.scenarios.builtin import BUILTINS
from shared.scenarios.training import TRAINING_BUILTINS
from shared.sim.engine import SimResult
from shared.timeline import run_file_name


def run_one(scenario_name: str, policy: str, seed: int, out: str | None, label: str | None = None,
            profiles: dict[str, ModelProfile] | None = None) -> SimResult:
    prog = Progress(label or f"{scenario_name} {policy} seed {seed}")
    return report.run_one(scenario_name, policy, seed, out, profiles, progress=prog)


def cmd_list(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for name, make in BUILTINS.items():
        sc = make(1)
        rows.append(
            {
                "name": name,
                "nodes": len(sc.nodes),
                "containers": len(sc.containers),
                "duration_s": sc.duration_s,
                "description": sc.description,
                "kind": "inference",
            }
        )
    for name, make_training in TRAINING_BUILTINS.items():
        tsc = make_training(1)
        rows.append({"name": name, "nodes": len(tsc.workers), "containers": len(tsc.jobs), "duration_s": None,
                     "description": tsc.description, "kind": "training"})
    if args.json:
        emit_json({"scenarios": rows})
        return 0
    w = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{w}}  {r['nodes']} node(s) {r['containers']:>3} containers  {r['description']}")
    return 0


def _training_policy(args: argparse.Namespace, policy: str | None) -> str:
    name = policy or "flowcon"
    if name not in registry.names("training"):
        raise CliError(f"--policy: {args.scenario} is a training scenario; choose from "
                       f"{', '.join(registry.names('training'))}")
    return name


def _print_training(s: dict) -> None:
    print(f"scenario {s['scenario']}  policy {s['policy']}  seed {s['seed']}: {s['finished']}/{s['jobs']} jobs finished")
    print(f"  makespan {s['makespan_s']:.1f} s   mean completion {s['mean_completion_s']:.1f} s   "
          f"rounds {s['rounds']}  limit changes {s['limit_changes']}")
    print("  " + "  ".join(f"{j} ({s['profile'][j]} on {s['placement'][j]}): {c:.1f} s"
                           for j, c in s["completion_s"].items()))


def cmd_run(args: argparse.Namespace) -> int:
    if training_exp.is_training(args.scenario):
        tres = training_exp.run_one(args.scenario, _training_policy(args, args.policy), args.seed, args.out)
        s = tres.summary()
        if not args.json:
            _print_training(s)
        else:
            emit_json(s)
        return 0
    if args.policy is not None and args.policy not in registry.names():
        raise CliError(f"--policy: {args.policy} governs training jobs; choose from {', '.join(registry.names())}")
    args.policy = args.policy or "learned"
    res = run_one(args.scenario, args.policy, args.seed, args.out, profiles=profiles_from(args.profiles))
    s = res.summary()
    if not args.json:
        print(f"scenario {s['scenario']}  policy {s['policy']}  seed {s['seed']}")
        print(f"  {s['containers']} containers on {s['nodes']} node(s), {s['sim_duration_s']:.0f} s simulated, "
              f"{s['rounds']} rounds")
        print(f"  plateau of the last {s['final_window_s']:.0f} s:  met {s['met_final']} (oracle {s['oracle_met']})"
              f"   in band {s['satisfied_final']} (oracle {s['oracle_satisfied']})"
              f"   CPU spent {s['cpu_cores_final']:.2f} of {s['cores_total']:g} cores "
              f"({s['cpu_cores_idle_final']:.2f} idle)")
        print(f"  oracle under this run's noise: met {s['oracle_noise_met_median']}, in band "
              f"{s['oracle_noise_in_band_median']} as a run counts them; at most {s['ceiling_met']:.1f} met "
              f"or {s['ceiling_in_band']:.1f} in band expected (the oracle figures above are noise-free)")
        print(f"  its final limits, as chances of each container's next batch: met {s['expected_met_final']:.1f}, "
              f"in band {s['expected_in_band_final']:.1f} expected (the oracle under noise's: "
              f"{s['oracle_noise_met']:.1f} / {s['oracle_noise_in_band']:.1f})")
        per = "  ".join(f"{k}: {s['met_per_node'][k]}/{v}" for k, v in s["satisfied_per_node"].items())
        print(f"  per node (met/in band): {per}")
        st = s["settle"]
        print(f"  limit changes: {s['limit_changes']} ({s['changes_per_container_round']:.3f} per container per round);"
              f" after the last change at {st['after_s']:.0f} s, limits still moved in {st['rounds_max']} round(s)"
              f" on the busiest node")
        if args.out:
            print(f"  timeline: {Path(args.out) / run_file_name(res.scenario, res.policy, res.seed)}")
    if args.json:
        emit_json({k: v for k, v in s.items() if k != "final" or args.verbose})
    return 0


def cmd_paired(args: argparse.Namespace) -> int:
    if training_exp.is_training(args.scenario):
        raise CliError(f"{args.scenario} is a training scenario; paired runs compare inference policies")
    first, second = paired.parse_entry(args.first), paired.parse_entry(args.second)
    seeds = parse_seeds(args.seeds)
    bar = Progress(f"{args.scenario}: {first.label} and {second.label}, {len(seeds)} seeds")
    pairs = paired.run_pairs(args.scenario, seeds, first, second, profiles=profiles_from(args.profiles),
                             workers=max(1, args.workers), progress=lambda done, total: bar(done / total))
    summary = paired.compare(pairs)
    if args.json:
        emit_json(summary)
        return 0
    w = max(len(f["name"]) for f in summary["figures"].values())
    print(f"{summary['scenario']}, seeds {args.seeds} ({len(seeds)} seeds)")
    print(f"  first:  {first.label}\n  second: {second.label}")
    print("means over the seeds; the difference is the second's less the first's on each seed (standard error)")
    print(f"{'':<{w}}  {'first':>10}  {'second':>10}  difference")
    for f in summary["figures"].values():
        se = "" if f["difference_se"] is None else f" ({f['difference_se']:.3f})"
        print(f"{f['name']:<{w}}  {f['first_mean']:>10.3f}  {f['second_mean']:>10.3f}  {f['difference']:+.3f}{se}")
    print(paired.sentence(summary))
    return 0


def cmd_compare_training(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in (args.policies or "flowcon,default").split(",") if p.strip()]
    for p in policies:
        _training_policy(args, p)
    data = training_exp.compare(args.scenario, args.seed, policies, out=args.out)
    if args.json:
        emit_json(data)
        return 0
    for s in data["policies"].values():
        _print_training(s)
    if "makespan_change_pct" in data:
        print(f"FlowCon vs default Swarm: makespan {data['makespan_change_pct']:+.1f}%, mean completion "
              f"{data['mean_completion_change_pct']:+.1f}%, {data['jobs_faster']} jobs faster")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    if training_exp.is_training(args.scenario):
        return cmd_compare_training(args)
    policies = [p.strip() for p in (args.policies or "learned,dqoes,default").split(",") if p.strip()]
    for p in policies:
        if p not in registry.REGISTRY:
            raise CliError(f"--policies: unknown policy {p!r} (choose from {', '.join(registry.names())})")
    profiles = profiles_from(args.profiles)
    results = {p: run_one(args.scenario, p, args.seed, args.out, profiles=profiles) for p in policies}
    first = next(iter(results.values()))
    table = {p: {"met_final": r.met_final, "met_per_node": r.met_per_node, "satisfied_final": r.satisfied_final,
                 "satisfied_per_node": r.satisfied_per_node, "satisfied_at_end": r.satisfied_at_end,
                 "cpu_cores_final": round(r.cpu_cores_final, 3), "cpu_cores_idle_final": round(r.cpu_cores_idle_final, 3),
                 "limit_changes": r.limit_changes} for p, r in results.items()}
    summary = {
        "scenario": first.scenario,
        "seed": first.seed,
        "containers": first.containers,
        "nodes": first.nodes,
        "cores_total": first.cores_total,
        "oracle_met": first.oracle_met,
        "oracle_satisfied": first.oracle_satisfied,
        "policies": table,
    }
    if "dqoes" in results and "default" in results:
        d, b = results["dqoes"].satisfied_final, results["default"].satisfied_final
        summary["ratio_dqoes_to_default"] = None if b == 0 else round(d / b, 2)
    if not args.json:
        print(f"{first.scenario}, seed {first.seed}: {first.containers} containers on {first.nodes} node(s), "
              f"{first.cores_total:g} cores; plateau of the final {first.final_window_s:.0f} s")
        print(f"{'policy':<10}{'met':>6}{'in band':>9}{'CPU spent':>11}{'idle':>7}   per node (met/in band)")
        for p, r in results.items():
            per = " ".join(f"{r.met_per_node[n]}/{r.satisfied_per_node[n]}" for n in r.satisfied_per_node)
            print(f"{p:<10}{r.met_final:>6}{r.satisfied_final:>9}{r.cpu_cores_final:>11.2f}"
                  f"{r.cpu_cores_idle_final:>7.2f}   {per}")
        print(f"{'oracle*':<10}{first.oracle_met:>6}{first.oracle_satisfied:>9}")
        print("* the most any steady allocation can keep met / in band on this placement (knows every latency curve)")
        if "ratio_dqoes_to_default" in summary:
            ratio = summary["ratio_dqoes_to_default"]
            d, b = results["dqoes"].satisfied_final, results["default"].satisfied_final
            shown = f": {ratio}x" if ratio is not None else " (no ratio: default Swarm has none in band)"
            print(f"in band: DQoES {d} vs {b} for default Swarm" + shown)
    if args.json:
        emit_json(summary)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    try:
        names = report.builtin_names(args.scenarios)
    except ValueError as e:
        raise CliError(f"--scenarios: {e}") from None
    data = report.report_data(names, seeds, progress=Progress)
    md = report.render_report(data)
    if args.update:
        update_section(Path(args.update), md, report.REPORT_BEGIN, report.REPORT_END)
    if args.json:
        emit_json({"report": data})
    else:
        print(md)
    return 0


def cmd_real(args: argparse.Namespace) -> int:
    opts = real.RealOptions(
        containers=args.containers, duration_s=args.duration_s, policies=args.policies, runtime=args.runtime,
        section=args.section, models=args.models,
        objectives=args.objectives, batch_size=args.batch_size, resolution=args.resolution, cores=args.cores,
        profiles=args.profiles, image=args.image, seed=args.seed, sample_s=args.sample_s, out=args.out,
        from_file=args.from_file, records=args.records, plot=args.plot, update=args.update,
        cpu_weights=args.cpu_weights, calibrate=args.calibrate,
    )
    res = real.run(opts)
    if args.json:
        emit_json(res.summary)
    elif not args.update:
        print(res.markdown)
    return 0


POLICIES_HELP = ("policies (inference scenarios):\n" + registry.describe()
                 + "\npolicies (training scenarios, flowcon-*):\n" + registry.describe("training"))

PROFILES_HELP = ("model profiles (e.g. from `dqoes calibrate --out`) replacing the built-ins of the same names "
                 "(default: $DQOES_PROFILES; a scenario file's own `profiles`/`models` still win)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser("experiment", help="run the simulator on built-in or user scenarios",
                        description="Run the allocators (learned, DQoES, default Swarm, the oracle, ...) on a "
                        "simulated cluster, or try them on this node's real containers (real).")
    es = ex.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = es.add_parser("list", help="list built-in scenarios")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_list)

    p = es.add_parser("run", help="run one scenario under one policy",
                      description="Run SCENARIO (a built-in name or a .toml/.json file) under one policy.",
                      epilog=POLICIES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", metavar="SCENARIO")
    p.add_argument("--policy", choices=registry.all_names(), default=None,
                   help="allocation policy (below; default learned, or flowcon for a training scenario)")
    p.add_argument("--seed", type=int, default=1, help="random seed (noise, random objectives)")
    p.add_argument("--out", metavar="DIR", help="write the timeline as JSON lines into DIR")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.add_argument("--verbose", action="store_true", help="with --json, include every container's final state")
    p.add_argument("--profiles", metavar="FILE", help=PROFILES_HELP)
    p.set_defaults(func=cmd_run)

    p = es.add_parser("compare", help="run one scenario under several policies, same seed",
                      epilog=POLICIES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", metavar="SCENARIO")
    p.add_argument("--policies", default=None,
                   help="comma-separated (default: learned,dqoes,default; flowcon,default for a training scenario)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", metavar="DIR", help="write each run's timeline into DIR")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.add_argument("--profiles", metavar="FILE", help=PROFILES_HELP)
    p.set_defaults(func=cmd_compare)

    p = es.add_parser(
        "paired", help="two policies, or one under two settings, on the same seeds: the differences and their errors",
        description="Run SCENARIO under FIRST and under SECOND on every seed, and print each figure's mean on "
        "either side and SECOND's less FIRST's, paired by seed, with its standard error: met and in band as "
        "counted at the plateau and as the chances of each run's next batches at its final limits (the steadier "
        "read of the same allocations), CPU spent, limit changes and rounds to settle. A difference under two "
        "standard errors is not told apart from the seeds' noise. Progress: stderr.",
        epilog="example: dqoes experiment paired random-cluster-40 learned learned:dead_band=0.1 --seeds 1-40\n\n"
        + POLICIES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", metavar="SCENARIO", help="a built-in inference scenario or a scenario file")
    p.add_argument("first", metavar="FIRST", help="POLICY[:NAME=VALUE...], e.g. learned")
    p.add_argument("second", metavar="SECOND", help="POLICY[:NAME=VALUE...], e.g. learned:dead_band=0.1 or oracle")
    p.add_argument("--seeds", default="1-20", help="e.g. 1-20 or 1,3,7; at least two (default 1-20)")
    p.add_argument("--workers", type=int, default=1, help="processes to run seeds in (default 1)")
    p.add_argument("--profiles", metavar="FILE", help=PROFILES_HELP)
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.set_defaults(func=cmd_paired)

    p = es.add_parser("report", help="met and in band counts of the paper's experiments over seeds, as Markdown")
    p.add_argument("--seeds", default="1-5", help="e.g. 1-5 or 1,3,7")
    p.add_argument("--scenarios", help="comma-separated built-ins (default: all)")
    p.add_argument("--update", metavar="FILE", help="replace the generated section of this Markdown file")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.set_defaults(func=cmd_report)

    p = es.add_parser(
        "real", help="DQoES vs default on real inference containers here, with the simulator's forecast",
        description="Start a private NATS, the manager and a worker, run N real inference workloads (Docker "
        "containers of the workload image, or processes in cgroups with --runtime cgroup) with objectives under "
        "each policy in turn, record met, in band and CPU over time, and compare with the simulator run on the "
        "same setup with the calibrated profiles. Needs root (and Docker for --runtime docker). Progress goes to "
        "stderr.")
    d = real.RealOptions()
    p.add_argument("--containers", type=int, default=d.containers, help="how many inference containers (default 5)")
    p.add_argument("--duration-s", type=float, default=d.duration_s, help="seconds per policy (default 600)")
    p.add_argument("--policies", default=d.policies,
                   help=f"run in this order (default {d.policies}); POLICY:NAME=VALUE[:NAME=VALUE] runs a policy "
                   "with those parameters, so one policy can run under two settings (learned,learned:half_life_s=0)")
    p.add_argument("--runtime", choices=("docker", "cgroup"), default=d.runtime,
                   help="docker: containers of --image; cgroup: inference processes in cgroups, no Docker (default docker)")
    p.add_argument("--section", default=d.section,
                   help="with --update: a named generated section (e.g. host16), for several real setups in one file")
    p.add_argument("--models", default=d.models, help="cycled over the containers")
    p.add_argument("--objectives", help="seconds a batch, cycled (default: fastest-alone x 0.8, 3, 1.6, 5, 2.2, 8)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="images a batch (default 10, as calibrated; the profiles' work per batch is scaled to it)")
    p.add_argument("--resolution", type=int, default=d.resolution, help="image side in px (default 224, as calibrated; work scaled by pixels)")
    p.add_argument("--cores", type=float, help="the node's cores (default: all of this machine's)")
    p.add_argument("--profiles", help="profiles file for the forecast (default: $DQOES_PROFILES, else "
                   "the profiles packaged with dqoes, measured on a 2-core machine)")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine's profiles for the run's models first (`dqoes calibrate` at the "
                   "run's batch size and resolution; one to two minutes for ResNet-50 and MobileNetV2 on a 2-core "
                   "machine) and work the objectives, the "
                   "forecast and the bounds out from them; written to OUT/profiles.toml and kept in the summary")
    p.add_argument("--image", default=d.image, help="inference image")
    p.add_argument("--seed", type=int, default=d.seed, help="simulator seed")
    p.add_argument("--sample-s", type=float, default=d.sample_s, help="seconds between CPU samples (default 5)")
    p.add_argument("--cpu-weights", action=argparse.BooleanOptionalAction, default=d.cpu_weights,
                   help="the worker sets each container's CPU weight from its limit as well as its quota (the "
                   "worker's --cpu-weights; default on; --no-cpu-weights: quotas only, as before 28 Nov 2026)")
    p.add_argument("--out", help="directory for the raw records: per policy, node states, CPU samples, decisions with their reasons and batches as JSON lines (default runs/real-<time>)")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="run nothing: report (and --plot/--update) from a summary.json written earlier")
    p.add_argument("--records", metavar="DIR",
                   help="with --from: the run's --out directory, to add what an older summary lacks (the noise "
                   "each run saw and the oracle under it, each container's second-half batches one by one); --json prints "
                   "the completed summary")
    p.add_argument("--plot", metavar="FILE", help="write the figure (.svg or .png)")
    p.add_argument("--update", metavar="MD", help="replace the generated section of this Markdown file")
    p.add_argument("--json", action="store_true", help="last line of stdout: the summary as one JSON object")
    p.set_defaults(func=cmd_real)

