"""Progress lines, the summary and the latency baseline of the compose and Swarm demos.

Why a separate file: both demo scripts (compose/demo.sh, compose/swarm-demo.sh)
read the same stream (`dqoes watch --json`, one cluster state a line) and
report the same way; in Python the numbers are computed once and the same
code gives the human lines and the --json summary. `follow` and `summary`
need only the standard library (the host's python3 runs them).

`latencies` listens to the inference containers' batches on NATS (it needs
this project's `shared` package: the repo's venv, or any dqoes image) and
prints each container's median seconds a batch. The demos set objectives
relative to these medians, measured at Docker's fair share on this machine
at this moment, so they are tight or loose by design on any machine, busy or
not, instead of fixed numbers that suit only one.

    dqoes watch --json ... | python3 compose/progress.py follow --log S.jsonl --t0 EPOCH
    python3 compose/progress.py summary --log S.jsonl --window 60 [--json] [--extra FILE]
    .venv/bin/python compose/progress.py latencies --nats URL --containers 6 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def sample(state: dict, t0: float) -> dict:
    nodes = state.get("nodes") or {}
    return {
        "t_s": round(float(state.get("at") or time.time()) - t0, 1),
        "satisfied": int(state.get("satisfied_total", 0)),
        "containers": int(state.get("containers_total", 0)),
        "G": int(state.get("G", 0)),
        "S": int(state.get("S", 0)),
        "B": int(state.get("B", 0)),
        "pending": int(state.get("pending", 0)),
        "nodes": {n: [int(v.get("satisfied", 0)), int(v.get("containers", 0))] for n, v in sorted(nodes.items())},
    }


def line(s: dict) -> str:
    per = "  ".join(f"{n} {sat}/{tot}" for n, (sat, tot) in s["nodes"].items())
    pend = f"  pending {s['pending']}" if s["pending"] else ""
    return (f"  t = {s['t_s']:+6.0f} s   satisfied {s['satisfied']} of {s['containers']}   "
            f"({per})   G {s['G']} S {s['S']} B {s['B']}{pend}")


def follow(args: argparse.Namespace) -> int:
    n = 0
    with open(args.log, "a") as log:
        for raw in sys.stdin:
            raw = raw.strip()
            if not raw.startswith("{"):
                continue
            try:
                s = sample(json.loads(raw), args.t0)
            except (ValueError, TypeError, AttributeError):
                continue
            log.write(json.dumps(s) + "\n")
            log.flush()
            print(line(s), flush=True)
            n += 1
    return 0 if n else 1


def summarize(samples: list[dict], window_s: float) -> dict:
    if not samples:
        return {"samples": 0}
    end = samples[-1]["t_s"]
    last = [s["satisfied"] for s in samples if s["t_s"] >= end - window_s]
    best = max(s["satisfied"] for s in samples)
    return {
        "samples": len(samples),
        "duration_s": end,
        "containers": samples[-1]["containers"],
        "satisfied_first": samples[0]["satisfied"],
        "satisfied_final": samples[-1]["satisfied"],
        "satisfied_final_per_node": {n: v[0] for n, v in samples[-1]["nodes"].items()},
        "window_s": window_s,
        "satisfied_window_mean": round(statistics.fmean(last), 2),
        "satisfied_window_min": min(last),
        "satisfied_window_max": max(last),
        "satisfied_best": best,
        "best_first_at_s": next(s["t_s"] for s in samples if s["satisfied"] == best),
        "series": [[s["t_s"], s["satisfied"]] for s in samples],
    }


def summary(args: argparse.Namespace) -> int:
    samples = []
    try:
        with open(args.log) as f:
            samples = [json.loads(x) for x in f if x.strip()]
    except OSError:
        pass
    out = summarize(samples, args.window)
    if args.label:
        out = {"policy": args.label, **out}
    if args.extra:
        try:
            with open(args.extra) as f:
                out.update(json.load(f))
        except (OSError, ValueError):
            pass
    if args.json:
        print(json.dumps(out))
        return 0
    if not samples:
        print(f"summary{' ' + args.label if args.label else ''}: no cluster state arrived")
        return 1
    per = ", ".join(f"{n} {v}" for n, v in out["satisfied_final_per_node"].items())
    print(f"summary{' (' + args.label + ')' if args.label else ''}: satisfied {out['satisfied_first']} of "
          f"{out['containers']} when the objectives were set, {out['satisfied_final']} at the end ({per}); "
          f"last {window(out)} s: mean {out['satisfied_window_mean']}, "
          f"min {out['satisfied_window_min']}, max {out['satisfied_window_max']}; "
          f"best {out['satisfied_best']} (first at t = {out['best_first_at_s']:.0f} s)")
    return 0


def window(out: dict) -> str:
    return f"{min(out['window_s'], out['duration_s']):.0f}"


def latencies(args: argparse.Namespace) -> int:
    import asyncio
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from shared import auth, subjects
    from shared.bus import Bus
    from shared.schema import LatencyEvent

    seen: dict[str, list[float]] = {}
    since: dict[str, float] = {}

    def on(m: LatencyEvent, _: object) -> None:
        if m.batch < args.warmup:  # the first batches are 1.5-2.5x slower
            return
        since.setdefault(m.container, time.monotonic())
        seen.setdefault(m.container, []).append(m.latency_s)

    def done() -> bool:
        now = time.monotonic()
        return len(seen) >= args.containers and all(
            len(v) >= args.min and now - since[c] >= args.seconds for c, v in seen.items())

    async def go() -> None:
        # The client's credentials from $DQOES_NATS_CREDS (the demo scripts set it).
        bus = await Bus.connect(auth.resolve(args.nats, None), "dqoes-demo-baseline")
        try:
            await bus.subscribe(subjects.LATENCY_ALL, on, expect=LatencyEvent)
            t_end = time.monotonic() + args.timeout
            while not done() and time.monotonic() < t_end:
                await asyncio.sleep(0.5)
        finally:
            await bus.close()

    asyncio.run(go())
    out = {c: {"median_s": round(statistics.median(v), 3), "batches": len(v)} for c, v in sorted(seen.items())}
    print(json.dumps(out))
    return 0 if len(out) >= args.containers else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="compose/progress.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("follow", help="cluster states (JSON lines) on stdin -> progress lines + a sample log")
    f.add_argument("--log", required=True, help="append one sample a line here (JSON)")
    f.add_argument("--t0", type=float, default=time.time(), help="unix time of t = 0 (objectives set)")
    f.set_defaults(func=follow)
    s = sub.add_parser("summary", help="the summary of a sample log")
    s.add_argument("--log", required=True)
    s.add_argument("--window", type=float, default=60.0, help="the final window, seconds (default 60)")
    s.add_argument("--label", default="", help="a name for this run (the policy)")
    s.add_argument("--extra", help="a JSON object file merged into the --json summary")
    s.add_argument("--json", action="store_true", help="one JSON object instead of a sentence")
    s.set_defaults(func=summary)
    b = sub.add_parser("latencies", help="each container's median seconds a batch, from NATS (JSON)")
    b.add_argument("--nats", required=True)
    b.add_argument("--containers", type=int, required=True, help="wait for this many containers")
    b.add_argument("--seconds", type=float, default=30.0, help="listen this long to each after warm-up")
    b.add_argument("--min", type=int, default=4, help="and for at least this many batches of each")
    b.add_argument("--warmup", type=int, default=2, help="ignore each container's first N batches")
    b.add_argument("--timeout", type=float, default=180.0)
    b.set_defaults(func=latencies)
    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C in a demo: the script tears down and says so
        return 130


if __name__ == "__main__":
    sys.exit(main())
