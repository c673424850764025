"""Run an inference workload standalone, without NATS, and print each batch.

Why this exists: to measure a model's seconds per batch on a machine, or
inside a container under a CPU quota, with the same loop the DQoES service
runs. One line per batch, human-readable or (--json) one JSON object per
line. Under jemalloc when the library is installed (see jemalloc.py).

    python -m services.inference.run --model resnet50 --batch 10 --batches 3 --json

Bad arguments: one line on stderr, exit 2. SIGTERM or Ctrl-C stops after the
batch in progress (exit 0); a second Ctrl-C aborts (exit 130).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from services.inference.jemalloc import OPT_OUT_ENV, reexec_with_jemalloc

PROG = "python -m services.inference.run"
# Static so --help needs no torch; a test checks it against models.MODELS.
MODEL_HELP = "resnet50, vgg16, mobilenetv2 (alias nasnetmobile, a stand-in), inceptionv3, xception"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Run a CNN inference workload batch after batch and print each batch's "
        "latency and CPU seconds.",
    )
    p.add_argument("--model", default="resnet50", help=f"one of {MODEL_HELP} (default resnet50)")
    p.add_argument("--batch", type=_positive_int, default=100, help="images a batch (default 100)")
    p.add_argument(
        "--resolution",
        type=_positive_int,
        default=None,
        metavar="PX",
        help="input side in pixels (default: the model's native 224 or 299)",
    )
    p.add_argument(
        "--batches",
        type=_positive_int,
        default=None,
        metavar="N",
        help="stop after N batches, the first being warm-up (default: run until stopped)",
    )
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="pin torch intra-op threads (default: max(1, floor(cgroup CPU quota)))",
    )
    p.add_argument(
        "--default-threads",
        type=_positive_int,
        default=1,
        metavar="N",
        help="threads when the cgroup sets no CPU quota (default 1)",
    )
    p.add_argument(
        "--seed", type=_int, default=0, help="seed for weights and synthetic images (default 0)"
    )
    p.add_argument("--weights", metavar="FILE", help="a torch state_dict file to load")
    p.add_argument(
        "--images",
        metavar="DIR",
        help="use the .npy/.pt/.ppm images in DIR instead of synthetic ones",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per batch")
    p.add_argument(
        "--no-jemalloc",
        action="store_true",
        help=f"keep the default allocator (also: {OPT_OUT_ENV}=1)",
    )
    return p


def _human(r) -> str:
    limit = "none" if r.limit_cores is None else f"{r.limit_cores:g} cpu"
    warm = "  (warm-up)" if r.warmup else ""
    return (
        f"batch {r.batch}: {r.model} {r.images} x {r.resolution_px}px  "
        f"latency {r.latency_s:.3f} s  cpu {r.cpu_s:.3f} s  "
        f"threads {r.threads} (limit {limit}){warm}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None:  # only a real command line can be re-executed
        reexec_with_jemalloc(opt_out=args.no_jemalloc)

    # torch is imported only now, after the allocator is settled.
    from services.inference.jemalloc import jemalloc_loaded
    from services.inference.models import WeightsError
    from services.inference.workload import Workload, WorkloadError

    stop = threading.Event()
    try:
        workload = Workload(
            args.model,
            args.batch,
            args.resolution,
            seed=args.seed,
            weights=args.weights,
            images_dir=args.images,
            threads=args.threads,
            default_threads=args.default_threads,
            stop_event=stop,
        )
    except (WorkloadError, WeightsError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2

    def on_signal(signum, frame):
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    if not args.json:
        allocator = "jemalloc" if jemalloc_loaded() else "default malloc"
        print(
            f"{workload.spec.name}: {args.batch} images x {workload.resolution_px}px a batch, "
            f"allocator {allocator}",
            file=sys.stderr,
        )
    try:
        for result in workload.run(args.batches):
            line = json.dumps(result.to_dict()) if args.json else _human(result)
            print(line, flush=True)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
