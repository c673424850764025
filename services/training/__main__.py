"""`python -m services.training`: the process a training container runs.

Flags are also environment variables (DQOES_JOB_NAME, DQOES_NODE,
DQOES_TRAINING_MODEL, DQOES_EPOCHS, DQOES_NATS_URL, ...), so a container, a
compose file or the worker's launcher sets them per job.
"""

from __future__ import annotations

import argparse
import socket
import sys

from shared.settings import add_common, flag, nats_url, setup_logging


def parse(argv: list[str] | None = None):
    from services.training.service import TrainingConfig

    ap = argparse.ArgumentParser(
        prog="python -m services.training",
        description="Train a small torch model on generated data and publish each epoch's loss on "
        "dqoes.progress.<node>.<job>, then the job's completion.",
    )
    add_common(ap)
    flag(ap, "--name", "DQOES_JOB_NAME", socket.gethostname(), help="this job's name")
    flag(ap, "--node", "DQOES_NODE", None, help="the node it runs on (required)")
    flag(ap, "--model", "DQOES_TRAINING_MODEL", "cnn", help="vae, cnn, mlp, lstm, gru")
    flag(ap, "--epochs", "DQOES_EPOCHS", 30, type=int, help="epochs to run")
    flag(ap, "--batch", "DQOES_BATCH", 128, type=int, help="examples a step")
    flag(ap, "--steps-per-epoch", "DQOES_STEPS_PER_EPOCH", None, type=int, help="default: the task's")
    flag(ap, "--threads", "DQOES_THREADS", None, type=int, help="pin intra-op threads (default: floor of the CPU quota)")
    flag(ap, "--seed", "DQOES_SEED", 0, type=int, help="data and weights seed")
    flag(ap, "--converge-delta", "DQOES_CONVERGE_DELTA", None, type=float,
         help="stop early when the loss improves by less than this fraction for --converge-patience epochs")
    flag(ap, "--converge-patience", "DQOES_CONVERGE_PATIENCE", 5, type=int, help="epochs (default 5)")
    a = ap.parse_args(argv)
    if not a.node:
        ap.error("--node (or DQOES_NODE) is required: the worker of that node listens for this job")
    from services.training.tasks import TASKS

    if a.model not in TASKS:
        ap.error(f"--model must be one of {', '.join(TASKS)}")
    for f in ("epochs", "batch"):
        if getattr(a, f) < 1:
            ap.error(f"--{f} must be >= 1")
    return a, TrainingConfig(name=a.name, node=a.node, nats_url=nats_url(ap, a), model=a.model, epochs=a.epochs,
                             batch=a.batch, steps_per_epoch=a.steps_per_epoch, threads=a.threads, seed=a.seed,
                             converge_delta=a.converge_delta, converge_patience=a.converge_patience)


def main(argv: list[str] | None = None) -> int:
    args, cfg = parse(argv)
    setup_logging(args.log_level, args.log_format, f"training[{cfg.name}]")
    from services.training.service import run

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
