"""`dqoes calibrate`: measure the real models under CPU quotas and write the simulator's profiles.

Thin: the flags become `experiments.calibrate.CalibrationOptions`; the
measuring, fitting and rendering live in `experiments.calibrate`. Progress
goes to stderr; with --json the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import sys

from experiments.calibrate import (
    DEFAULT_LIMITS,
    REAL_MODELS,
    CalibrationOptions,
    calibrate,
)
from services.cli.common import emit_json
from shared.runtime import cgroupfs


def cmd_calibrate(args: argparse.Namespace) -> int:
    opts = CalibrationOptions(
        models=args.models, limits=args.limits, batch_size=args.batch_size, resolution=args.resolution,
        batches=args.batches, warmup=args.warmup, threads=args.threads, cgroup_root=args.cgroup_root,
        from_file=args.from_file, out=args.out, plot=args.plot, update=args.update,
    )
    res = calibrate(opts, lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.json:
        emit_json(res.summary)
    elif not args.update:
        print(res.markdown)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="measure the real models under CPU limits and write simulator profiles",
        description="Run each model's real inference workload in a cgroup under each CPU limit (and once with "
        "none), measure seconds and CPU-seconds per batch, fit the simulator's profiles (work per batch and the "
        "efficiency curve) and write them as a profiles file. Needs root (cgroups). Progress goes to stderr.")
    p.add_argument("--models", default=",".join(REAL_MODELS),
                   help=f"comma-separated (default: {','.join(REAL_MODELS)}; nasnetmobile runs MobileNetV2)")
    p.add_argument("--limits", default=",".join(f"{x:g}" for x in DEFAULT_LIMITS),
                   help="CPU limits in cores, comma-separated (default: 0.25,0.5,1,1.5,2); an unlimited run is "
                   "always added as the baseline")
    p.add_argument("--batch-size", type=int, default=10, help="images a batch (default 10)")
    p.add_argument("--resolution", type=int, help="image side in px (default: each model's native 224/299)")
    p.add_argument("--batches", type=int, default=3, help="measured batches per limit (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up batches dropped per limit (default 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads, pinned (default 1, as the containers run on this machine)")
    p.add_argument("--out", metavar="FILE", help="write the profiles file (.toml, or .json)")
    p.add_argument("--plot", metavar="SVG", help="write a figure of latency and CPU-s per batch vs limit (.svg or .png)")
    p.add_argument("--update", metavar="MD", help="replace the generated section of this Markdown file")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="measure nothing: report (and --plot/--update) from a profiles file written earlier")
    p.add_argument("--cgroup-root", default=str(cgroupfs.DEFAULT_ROOT), help="the cgroup filesystem")
    p.add_argument("--json", action="store_true", help="last line of stdout: one JSON object")
    p.set_defaults(func=cmd_calibrate)
