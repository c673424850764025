"""Run the benchmarks: `python -m bench [NAME ...] [--json]`."""

from __future__ import annotations

import argparse
import importlib
import sys

import orjson

SUITES = {
    "core": "bench.bench_core",
    "messages": "bench.bench_messages",
    "live": "bench.bench_live",
    "docker": "bench.bench_docker",
    "dashboard": "bench.bench_dashboard",
    "policies": "bench.bench_policies",
    "stress": "bench.bench_stress",
    "fuzz": "bench.bench_fuzz",
    "load": "bench.bench_load",
    "failover": "bench.bench_failover",
}
OPT_IN = {"fuzz", "load", "stress"}
"""Suites that run only when named (`make fuzz`: minutes, not a figure of speed; `make bench-stress`:
minutes, the policies beyond the setting they were developed on)."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description="Run DQoES benchmarks and print figures.")
    ap.add_argument("names", nargs="*", help=f"suites to run (default: all of {', '.join(SUITES)})")
    ap.add_argument("--json", action="store_true", help="last line of stdout: all figures as one JSON object")
    args = ap.parse_args(argv)
    names = args.names or [n for n in SUITES if n not in OPT_IN]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"bench: error: unknown suite(s) {', '.join(unknown)} (have: {', '.join(SUITES)})", file=sys.stderr)
        return 2
    results: dict[str, dict] = {}
    for name in names:
        mod = importlib.import_module(SUITES[name])
        print(f"== {name}: {(mod.__doc__ or name).strip().splitlines()[0]}")
        results[name] = mod.run()
    if args.json:
        print(orjson.dumps(results).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
