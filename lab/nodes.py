"""The lab's actions on real nodes and their records: real-index, replay, threads, weights.

Why its own module: lab/cli.py holds the entry point and the simulator's and
training actions; these four read or measure real processes and cgroups.
"""

from __future__ import annotations

import argparse
import sys

from lab import real_index, replay, threads, weights
from services.cli.common import CliError, emit_json, parse_assignments
from shared.core import registry
from shared.settings import parse_policy_entry, policy_entry


def cmd_threads(args: argparse.Namespace) -> int:
    opts = threads.ThreadsOptions(models=args.models, limits=args.limits, pinned=args.pinned,
                                  batch_size=args.batch_size, resolution=args.resolution, batches=args.batches,
                                  warmup=args.warmup, cgroup_root=args.cgroup_root)
    command = " ".join(["python -m lab threads", f"--models {args.models}", f"--limits {args.limits}",
                        f"--pinned {args.pinned}", f"--batch-size {args.batch_size}"])
    out = threads.run(opts, lambda m: print(m, file=sys.stderr, flush=True), from_file=args.from_file,
                      update=args.update, command=command)
    if args.json:
        emit_json(out)
    elif not args.update:
        print(threads.render_markdown(out["rows"], out["machine"]))
    return 0


def cmd_weights(args: argparse.Namespace) -> int:
    opts = weights.WeightsOptions(
        quotas=args.quotas, workload=args.workload, model=args.model, batch_size=args.batch_size,
        resolution=args.resolution, duration_s=args.duration_s, warmup_s=args.warmup_s, conditions=args.conditions,
        neighbour_procs=args.neighbour_procs, neighbour_at=args.neighbour_at, section=args.section,
        node_cores=args.node_cores, cgroup_root=args.cgroup_root)
    out = weights.run(opts, lambda m: print(m, file=sys.stderr, flush=True), from_file=args.from_file,
                      update=args.update)
    if args.json:
        emit_json(out)
    elif not args.update:
        print(weights.render_markdown(out, args.section))
    return 0


def cmd_real_index(args: argparse.Namespace) -> int:
    out, md = real_index.run(args.paths, plot=args.plot, update=args.update)
    if args.json:
        emit_json(out)
    elif not args.update:
        print(md)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        policy, run_settings = parse_policy_entry(args.policy)
    except ValueError as e:
        raise CliError(f"--policy: {e}") from None
    if policy not in registry.names():
        raise CliError(f"--policy: choose from {', '.join(registry.names())}")
    # The run's own settings for that policy (its label says them), then the ones asked for.
    settings = {**run_settings, **parse_assignments(args.set)}
    try:
        # The record is named by the label as `experiment real` wrote it (settings in name order).
        rows, cores = replay.load_run(args.run_dir, policy_entry(policy, run_settings))
        res = replay.replay(rows, policy, cores, settings)
    except ValueError as e:
        raise CliError(str(e)) from None
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise CliError(f"{args.run_dir}: the record is not as `dqoes experiment real --out` writes it "
                       f"({type(e).__name__}: {e})") from None
    if args.json:
        emit_json(res)
    else:
        print(replay.render(res))
        if args.changes:
            for c in res["changes"]:
                print(f"{c['t_s']:8.2f} s  {c['container']}  {c['old_limit']:.4f} -> {c['new_limit']:.4f}  "
                      f"{c['reason']}")
    return 0




def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "real-index", help="every stored real run at a glance, with the real-node goals checked run by run",
        description="Read the summaries `dqoes experiment real` wrote (every real-*.json in a directory, or the "
        "files named) and tabulate each policy run: met, in band and CPU spent, the oracle's bound, the "
        "second-half means beside what the oracle expects under the noise that run measured, and for the learned "
        "allocator per kind of node how many runs met at least default's count and kept in band at least the "
        "bound less one, and at least the in-band count of the oracle under the run's noise less one. Runs nothing.",
        epilog="example: python -m lab real-index docs/data --update docs/results.md")
    p.add_argument("paths", nargs="*", default=["docs/data"], metavar="PATH",
                   help="summaries, or directories of real-*.json (default docs/data)")
    p.add_argument("--plot", metavar="FILE", help="write the figure (.svg or .png): each run's second-half means "
                   "against what the oracle expects under its noise")
    p.add_argument("--update", metavar="MD", help="replace the generated section of this Markdown file")
    p.add_argument("--json", action="store_true", help="last line of stdout: one JSON object (summary, runs)")
    p.set_defaults(func=cmd_real_index)

    p = sub.add_parser(
        "replay", help="replay a recorded real run through a policy with other settings",
        description="Feed the batches a `dqoes experiment real --out DIR` run recorded, at their times, to a "
        "fresh policy and run its rounds when the worker ran them; count the limit changes it makes. With the "
        "run's own settings the decisions come out as recorded; with others it says which limits would have "
        "moved. Open loop: batches under limits never set are not known, so it says nothing of met or in band.",
        epilog="example: python -m lab replay runs/real-3p-2511 --policy learned half_life_s=60")
    p.add_argument("run_dir", metavar="DIR", help="a directory written by `dqoes experiment real --out`")
    p.add_argument("set", nargs="*", metavar="NAME=VALUE", help="the policy's parameters to change")
    p.add_argument("--policy", default="learned", help="whose record to replay, as the run's --policies named it "
                   "(default learned; e.g. learned:half_life_s=0, whose settings then apply before NAME=VALUE)")
    p.add_argument("--changes", action="store_true", help="also list every replayed change with its reason")
    p.add_argument("--json", action="store_true", help="last line of stdout: one JSON object")
    p.set_defaults(func=cmd_replay)

    t = threads.ThreadsOptions()
    p = sub.add_parser(
        "threads", help="the real workload with threads following its CPU limit vs pinned counts (root)",
        description="Run the real inference workload in a cgroup under each CPU limit, once with its intra-op "
        "threads following the limit (what the containers do) and once pinned to each given count, and report "
        "seconds and CPU-seconds per batch and the gain. Needs root (cgroups) and torch. Progress: stderr.")
    p.add_argument("--models", default=t.models, help=f"comma-separated (default {t.models})")
    p.add_argument("--limits", default=t.limits, help=f"CPU limits in cores (default {t.limits})")
    p.add_argument("--pinned", default=t.pinned, help=f"fixed thread counts to compare (default {t.pinned})")
    p.add_argument("--batch-size", type=int, default=t.batch_size, help="images a batch (default 10)")
    p.add_argument("--resolution", type=int, help="image side in px (default: the model's)")
    p.add_argument("--batches", type=int, default=t.batches, help="measured batches per run (default 3)")
    p.add_argument("--warmup", type=int, default=t.warmup, help="warm-up batches dropped (default 2)")
    p.add_argument("--cgroup-root", default=t.cgroup_root, help="the cgroup filesystem")
    p.add_argument("--from", dest="from_file", metavar="JSON", help="measure nothing: report a --json output")
    p.add_argument("--update", metavar="MD", help="replace the generated section of this Markdown file")
    p.add_argument("--json", action="store_true", help="last line of stdout: one JSON object")
    p.set_defaults(func=cmd_threads)

    w = weights.WeightsOptions()
    p = sub.add_parser(
        "weights", help="do CPU weights protect quotas from an unmanaged neighbour? (root)",
        description="Run managed groups under CPU quotas (the real inference workload, or busy loops) beside an "
        "unmanaged neighbour group with one busy loop per core and no quota, in three conditions: alone; with the "
        "neighbour, default weights; with the neighbour, managed weights = the kernel's maximum x quota / node "
        "cores. Report per group the cores received, received / quota, throttled periods and batch latency. "
        "Plain processes in cgroups (no Docker), all removed at the end. Needs root. Progress goes to stderr.")
    p.add_argument("--quotas", help="managed quotas in cores, comma-separated (default: 25%% and 50%% of the node)")
    p.add_argument("--workload", choices=("inference", "spin"), default=w.workload,
                   help="inference: the real workload, threads following the quota; spin: one busy loop per "
                   "started core of quota (default inference)")
    p.add_argument("--model", default=w.model, help=f"the inference model (default {w.model})")
    p.add_argument("--batch-size", type=int, default=w.batch_size, help=f"images a batch (default {w.batch_size})")
    p.add_argument("--resolution", type=int, help="image side in px (default: the model's)")
    p.add_argument("--duration-s", type=float, default=w.duration_s,
                   help=f"measured seconds per condition (default {w.duration_s:g})")
    p.add_argument("--warmup-s", type=float, default=w.warmup_s,
                   help=f"seconds before measuring each condition (default {w.warmup_s:g})")
    p.add_argument("--conditions", default=w.conditions,
                   help=f"run in this order, from {','.join(weights.CONDITIONS)} (default {w.conditions}; parent: "
                   "as weighted, and the managed groups' parent group weighted from the sum of their quotas; "
                   "alone-weighted: no neighbour, the managed weights as in weighted)")
    p.add_argument("--neighbour-procs", type=int, help="busy loops in the neighbour (default: one per node core)")
    p.add_argument("--neighbour-at", choices=weights.NEIGHBOUR_AT, default=w.neighbour_at,
                   help="sibling: the neighbour beside the managed groups under the run's parent group (another "
                   "container); root: beside that parent (a host process outside docker/) (default sibling)")
    p.add_argument("--node-cores", type=float, help="the node's cores (default: the CPUs this process may use)")
    p.add_argument("--cgroup-root", default=w.cgroup_root, help="the cgroup filesystem")
    p.add_argument("--from", dest="from_file", metavar="JSON", help="measure nothing: report a --json output")
    p.add_argument("--update", metavar="MD", help="replace the generated section of this Markdown file")
    p.add_argument("--section", help="with --update: a named generated section, for several runs in one file")
    p.add_argument("--json", action="store_true", help="last line of stdout: one JSON object")
    p.set_defaults(func=cmd_weights)
