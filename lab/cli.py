"""`python -m lab ACTION`: the project's own research tools, apart from the product.

Why apart: these actions served the project in developing and measuring its
policies (the results page, the paper's training report, real-node studies of
threads, CPU weights and training jobs, replays of recorded runs). A user of
`dqoes` needs none of them, so they live in the checkout only: the wheel leaves
this package out, and no product module imports it (an import-linter contract).
Every action has --help, and those that report take --json (one JSON object,
the last line of stdout). Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import orjson

from experiments import training as training_exp
from experiments.common import (
    ExperimentError,
    read_back_json,
    reading_back,
    sigterm_as_interrupt,
    update_section,
)
from lab import (
    loadgen,
    nodes,
    results_page,
    serving_real,
    serving_table,
    training_calibrate,
    training_real,
)
from services.cli.common import CliError, emit_json, parse_seeds, parse_with_pairs
from shared.scenarios.spec import ScenarioError
from shared.scenarios.training import TRAINING_BUILTINS


def cmd_training_report(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    names = args.scenarios.split(",") if args.scenarios else list(TRAINING_BUILTINS)
    for n in names:
        if n not in TRAINING_BUILTINS:
            raise CliError(f"--scenarios: unknown training scenario {n!r} (choose from {', '.join(TRAINING_BUILTINS)})")
    data = training_exp.report_data(names, seeds, progress=lambda m: print(m, file=sys.stderr, flush=True))
    md = training_exp.render_report(data)
    if args.update:
        update_section(Path(args.update), md, training_exp.REPORT_BEGIN, training_exp.REPORT_END)
    if args.json:
        emit_json({"report": data})
    elif not args.update:
        print(md)
    return 0


def cmd_training_real(args: argparse.Namespace) -> int:
    opts = training_real.TrainingRealOptions(
        jobs=args.jobs, policies=args.policies, cores=args.cores, threads=args.threads, interval_s=args.interval,
        timeout_s=args.timeout, repeat=args.repeat, out=args.out, from_file=args.from_file, update=args.update)
    s, md = training_real.run(opts, lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        emit_json(s)
    elif not args.update:
        print(md)
    return 0


def cmd_calibrate_training(args: argparse.Namespace) -> int:
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.epochs < 3:
        raise CliError("--epochs must be >= 3 (a curve needs three points)")
    what = "a `python -m lab calibrate-training --json` output"
    measured = when = host = None
    if args.from_file:
        old = read_back_json(args.from_file, what)
        # --from measures nothing: a file without its measurements is an error, never a new measurement.
        measured = old.get("raw")
        if not isinstance(measured, dict):
            raise CliError(f"--from {args.from_file}: not {what} (no \"raw\" measurements)")
        when, host = old.get("date"), (old.get("machine") or {}).get("host")
    with reading_back(args.from_file, what):
        d = training_calibrate.calibrate(models, args.epochs, lambda m: print(m, file=sys.stderr, flush=True),
                                         measured=measured, when=when, host=host)
    if args.out:
        Path(args.out).write_text(d["toml"])
    if args.json:
        emit_json(d)
    else:
        print(training_calibrate.render_markdown(d))
    return 0




def cmd_serving_real(args: argparse.Namespace) -> int:
    if not 10 <= args.duration_s <= 86_400 or not 1 <= args.window_s <= 600 or not 10 <= args.calibrate_s <= 3600:
        raise CliError("--duration-s must be in [10, 86400], --window-s in [1, 600], --calibrate-s in [10, 3600]")
    if not 0.5 <= args.cores <= 1024:
        raise CliError(f"--cores must be in [0.5, 1024], got {args.cores}")
    opts = serving_real.Options(servers=args.servers, policies=args.policies, cores=args.cores,
                                duration_s=args.duration_s, window_s=args.window_s, calibrate_s=args.calibrate_s)
    d = asyncio.run(serving_real.experiment(opts, lambda m: print(m, file=sys.stderr, flush=True)))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_bytes(orjson.dumps(d, option=orjson.OPT_INDENT_2) + b"\n")
    if args.json:
        emit_json(d)
    else:
        print("\n".join(serving_table.section_table(d)))
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    return results_page.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description="The DQoES project's research tools (run from the checkout; not part of the dqoes package).")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = sub.add_parser(
        "results", help="docs/results.md: rerun the simulations, collect real runs, render the page",
        description=results_page.__doc__.split("\n\n")[0] if results_page.__doc__ else None)
    results_page.add_arguments(p)
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("training-report",
                      help="FlowCon vs default Swarm on the paper's training experiments over seeds, as Markdown",
                      description="Run every built-in training scenario (flowcon-*) under FlowCon and default "
                      "Swarm for each seed in the simulator; makespan and mean completion time next to the paper's.")
    p.add_argument("--seeds", default="1-5", help="e.g. 1-5 or 1,3,7")
    p.add_argument("--scenarios", help="comma-separated training built-ins (default: all)")
    p.add_argument("--update", metavar="FILE", help="replace the generated section of this Markdown file")
    p.add_argument("--json", action="store_true", help="last line of stdout is one JSON object")
    p.set_defaults(func=cmd_training_report)

    p = sub.add_parser(
        "calibrate-training", help="fit the simulator's training-job profiles to the real workloads' loss curves",
        description="Run each real training task alone (one thread) for --epochs epochs, fit "
        "E(e) = floor + (start - floor) exp(-rate e) to its epoch losses, and write profiles for the simulator "
        "(CPU per epoch scaled to paper-length jobs; docs/guide/training.md). Progress goes to stderr.")
    p.add_argument("--models", default="vae,cnn,mlp,lstm,gru", help="comma-separated (default: all five)")
    p.add_argument("--epochs", type=int, default=30, help="epochs per task (default 30)")
    p.add_argument("--out", metavar="TOML", help="write the fitted profiles here")
    p.add_argument("--from", dest="from_file", metavar="JSON",
                   help="measure nothing: fit the losses of an earlier --json output again")
    p.add_argument("--json", action="store_true", help="last line of stdout: the measurements and fits")
    p.set_defaults(func=cmd_calibrate_training)

    tr = training_real.TrainingRealOptions()
    p = sub.add_parser(
        "training-real", help="FlowCon vs default on real training processes here (root): completion, CPU split",
        description="Start a private NATS, the manager and one worker (cgroup runtime), submit real training jobs "
        "through dqoes.submit at their offsets under each policy in turn, and record completion times and every "
        "job's CPU and limit after each training round. Needs root and torch. Progress goes to stderr.")
    p.add_argument("--jobs", default=tr.jobs, help=f"model:offset_s:epochs, comma-separated (default {tr.jobs})")
    p.add_argument("--policies", default=tr.policies, help=f"run in this order (default {tr.policies})")
    p.add_argument("--cores", type=float, help="the node's cores (default: all of this machine's)")
    p.add_argument("--threads", type=int, default=tr.threads, help="every job's intra-op threads (default 2)")
    p.add_argument("--interval", type=float, default=tr.interval_s, help="FlowCon's initial interval, s (default 2)")
    p.add_argument("--timeout", type=float, default=tr.timeout_s, help="give up on a policy after N s (default 400)")
    p.add_argument("--repeat", type=int, default=tr.repeat, help="run the policies in turn N times (default 1)")
    p.add_argument("--out", help="directory for the raw records (default runs/training-real-<time>)")
    p.add_argument("--from", dest="from_file", metavar="FILE", help="run nothing: report from a summary.json")
    p.add_argument("--update", metavar="MD", help="replace the generated section of this Markdown file")
    p.add_argument("--json", action="store_true", help="last line of stdout: the summary as one JSON object")
    p.set_defaults(func=cmd_training_real)

    so = serving_real.Options()
    p = sub.add_parser(
        "serving-real", help="three model servers on this node (root), each at its p95 objective, per policy",
        description="Start three model servers (the inference --serve mode and MLServer) under one worker "
        "(cgroup runtime, the node capped at --cores), drive each with its own open-loop load, and govern them "
        "by the p95 the worker scrapes from their metrics pages, once per policy. A short calibration under "
        "default first sets the rates and the objectives (lab/serving_real.py says how). Progress goes to stderr.",
        epilog="example: python -m lab serving-real --cores 1.5 --duration-s 60 --out /tmp/serving.json")
    p.add_argument("--servers", default=so.servers, help=f"kind:model:px, comma-separated (default {so.servers})")
    p.add_argument("--policies", default=so.policies, help=f"run in this order (default {so.policies})")
    p.add_argument("--cores", type=float, default=so.cores, help=f"the node's cores (default {so.cores:g})")
    p.add_argument("--duration-s", type=float, default=so.duration_s,
                   help=f"seconds of load per policy (default {so.duration_s:g})")
    p.add_argument("--window-s", type=float, default=so.window_s,
                   help=f"seconds a window lasts, the clients' and the worker's (default {so.window_s:g})")
    p.add_argument("--calibrate-s", type=float, default=so.calibrate_s,
                   help=f"seconds of the calibration with all servers loaded (default {so.calibrate_s:g})")
    p.add_argument("--out", default=str(results_page.DATA / "serving-real.json"),
                   help="write the summary here (default docs/data/serving-real.json)")
    p.add_argument("--json", action="store_true", help="last line of stdout: the summary as one JSON object")
    p.set_defaults(func=cmd_serving_real)

    nodes.add_parsers(sub)
    loadgen.add_parser(sub)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, NAME=VALUE pairs after an option included (`replay DIR --policy X a=1`)."""
    return parse_with_pairs(build_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        with sigterm_as_interrupt():
            return int(args.func(args) or 0)
    except (ScenarioError, CliError, ExperimentError) as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return 130
