"""`python -m services.training.measure`: one training task alone, each epoch's loss and CPU as JSON lines.

Why: `python -m lab calibrate-training` fits the simulator's job profiles
to these curves; running the real task in its own process (no NATS) keeps
the measurement free of the experiment's own work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m services.training.measure",
                                 description="Train one task alone and print each epoch's mean loss, CPU seconds "
                                 "and wall seconds as JSON lines.")
    ap.add_argument("--model", required=True, help="vae, cnn, mlp, lstm, gru")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    import torch

    from services.training.tasks import TaskError, build

    torch.set_num_threads(a.threads)
    try:
        task = build(a.model, seed=a.seed)
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for epoch in range(a.epochs):
        c0, w0 = time.process_time(), time.perf_counter()
        losses = [task.step() for _ in range(task.steps_per_epoch)]
        print(json.dumps({"epoch": epoch, "loss": sum(losses) / len(losses), "cpu_s": time.process_time() - c0,
                          "wall_s": time.perf_counter() - w0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
