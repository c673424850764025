"""`python -m services.inference`: the process an inference container runs.

Flags are also environment variables, so a compose file or a Swarm stack sets
them per container: DQOES_CONTAINER_NAME (default: the hostname, which Docker
sets to the container's short id), DQOES_NODE, DQOES_MODEL, DQOES_BATCH,
DQOES_RESOLUTION, DQOES_NATS_URL...

`--serve [HOST:]PORT` runs the same model as an HTTP server instead
(services/inference/serving.py): POST /predict answered in micro-batches of
up to --batch images, a request-latency histogram on GET /metrics, no NATS
(a latency source scrapes the metrics).
"""

from __future__ import annotations

import argparse
import socket
import sys

from services.inference.jemalloc import reexec_with_jemalloc
from shared.settings import add_common, flag, nats_url, setup_logging


def parse(argv: list[str] | None = None):
    from services.inference.service import InferenceConfig

    ap = argparse.ArgumentParser(
        prog="python -m services.inference",
        description="Run a CNN inference workload batch after batch and publish each batch's latency "
        "(and CPU seconds) on dqoes.latency.<node>.<container>; or, with --serve, answer HTTP inference "
        "requests in micro-batches and export their latency on /metrics.",
    )
    add_common(ap)
    flag(ap, "--name", "DQOES_CONTAINER_NAME", socket.gethostname(), help="this container's name")
    flag(ap, "--node", "DQOES_NODE", None, help="the node it runs on (required)")
    flag(ap, "--model", "DQOES_MODEL", "resnet50", help="resnet50, vgg16, mobilenetv2 (nasnetmobile), inceptionv3, xception")
    flag(ap, "--batch", "DQOES_BATCH", 100, type=int, help="images a batch (with --serve: the most a micro-batch holds)")
    flag(ap, "--resolution", "DQOES_RESOLUTION", None, type=int, help="image side in pixels (default: the model's)")
    flag(ap, "--threads", "DQOES_THREADS", None, type=int, help="pin intra-op threads (default: floor of the CPU quota)")
    flag(ap, "--seed", "DQOES_SEED", 0, type=int, help="weights and synthetic images seed")
    flag(ap, "--weights", "DQOES_WEIGHTS", None, help="a torch state_dict file")
    flag(ap, "--images", "DQOES_IMAGES", None, help="a directory of .npy/.pt/.ppm images (default: synthetic)")
    flag(ap, "--batches", "DQOES_BATCHES", None, type=int, help="stop after N batches (default: never)")
    flag(ap, "--serve", "DQOES_SERVE", None, help="[HOST:]PORT: serve HTTP requests there instead of running "
         "batches (POST /predict {\"images\": N, \"seed\": S}, GET /metrics; no NATS, no --node)")
    flag(ap, "--max-wait", "DQOES_MAX_WAIT_S", 0.01, type=float,
         help="with --serve: seconds the oldest request waits for a micro-batch to fill")
    a = ap.parse_args(argv)
    if a.serve is not None:
        from services.inference.serving import parse_addr

        try:
            a.serve_addr = parse_addr(a.serve)
        except ValueError as e:
            ap.error(str(e))
        if not 0 <= a.max_wait <= 60:
            ap.error(f"--max-wait must be between 0 and 60 seconds, got {a.max_wait}")
    elif not a.node:
        ap.error("--node (or DQOES_NODE) is required: the worker of that node listens for this container")
    if a.batch < 1:
        ap.error("--batch must be >= 1")
    return a, InferenceConfig(name=a.name, node=a.node or "", nats_url=nats_url(ap, a), model=a.model, batch=a.batch,
                              resolution_px=a.resolution, threads=a.threads, seed=a.seed, weights=a.weights,
                              images_dir=a.images, batches=a.batches)


def main(argv: list[str] | None = None) -> int:
    args, cfg = parse(argv)
    if argv is None:
        reexec_with_jemalloc()
    setup_logging(args.log_level, args.log_format, f"inference[{cfg.name}]")
    if args.serve is not None:
        from services.inference.service import run_http

        host, port = args.serve_addr
        return run_http(cfg, host, port, max_wait_s=args.max_wait)
    from services.inference.service import run

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
