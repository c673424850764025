"""docs/results.md, rendered whole from the summaries in docs/data (`make results`).

Why: a results page a reader can trust has no number typed in. Every table here is made from a small
JSON file the command that measured it wrote: the held-out simulations and the stress variants by the
benchmarks (`make bench-policies`, `make bench-stress`: half an hour, so they are stored, never re-run
by `make results`), the paper's scenarios and the simulated training runs by `simulate` below (about a
minute), the real nodes from the summaries `dqoes experiment real` writes, collected by `real-runs`, and
the real training runs by `python -m lab training-real`. Rendering reads only those files, so the
same files always give the same page, byte for byte (tests/lab/test_results_page.py).

    python -m lab results [--data DIR] render [--out FILE] [--check]
    python -m lab results [--data DIR] simulate [--seeds 1-5]
    python -m lab results [--data DIR] real-runs SUMMARY.json ...
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from experiments.common import ExperimentError
from lab import serving_table

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "docs" / "data"
PAGE = REPO / "docs" / "results.md"
FILES = {
    "policies": "bench-policies.json",
    "stress": "bench-stress.json",
    "paper": "sim-paper.json",
    "training": "sim-training.json",
    "real": "real-runs.json",
    "training_real": "training-real.json",
    "serving_real": "serving-real.json",
}
"""What each table is made from, in docs/data."""
PAPER_POLICIES = ("default", "dqoes", "learned", "oracle")
REAL_POLICIES = ("default", "dqoes", "learned")
"""The real-node table's rows: the policies at their defaults (runs with a setting changed,
`learned:NAME=VALUE`, are kept in the data and counted in the decision records, not here)."""
REAL_KEEP = ("run", "started_at", "runtime", "cores", "containers", "cpu_weights", "policy", "met", "in_band",
             "cpu_cores", "bound_met", "bound_in_band")


class ResultsError(Exception):
    """A summary that is missing or is not what its table needs: one line naming the file."""


# ---------------------------------------------------------------- reading


def read(data: Path, key: str) -> Any:
    path = data / FILES[key]
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file (the {key} table is made from it)") from None
    except orjson.JSONDecodeError as e:
        raise ResultsError(f"{path}: not JSON ({e})") from None


def write(data: Path, key: str, value: Any) -> Path:
    path = data / FILES[key]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")
    return path


# ---------------------------------------------------------------- numbers


def mean_se(xs: Sequence[float]) -> tuple[float, float | None]:
    """Mean and its standard error (None below two values)."""
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None)


def pm(value: float | None, se: float | None = None, digits: int = 1) -> str:
    """'28.6 ± 0.4', '28.6' without a standard error, '-' without a value."""
    if value is None:
        return "-"
    return f"{value:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def ratio_cell(pair: Sequence[float] | None) -> str:
    return "-" if not pair else pm(pair[0], pair[1], 3)


# ---------------------------------------------------------------- tables


def _bench_rows(s: dict[str, Any]) -> list[str]:
    rows = []
    ratios = s.get("to_oracle_policy") or {}
    where = f"{s['scenario']}, {s['seeds']} ({s['n']} seeds)"
    for label, p in s["policies"].items():
        name = "oracle policy" if label == "oracle" else label
        r = ratios.get(label) or {}
        rows.append(f"| {where} | {name} | {pm(p['met'], p.get('met_se'))} | {pm(p['in_band'], p.get('in_band_se'))} "
                    f"| {pm(p['cpu_cores'], p.get('cpu_cores_se'), 2)} | {pm(p['changes_per_container'])} "
                    f"| {ratio_cell(r.get('met'))} | {ratio_cell(r.get('in_band'))} |")
    b = s["oracle_bound"]
    rows.append(f"| {where} | oracle bound (ceiling) | {pm(b['met'])} | {pm(b['in_band'])} | - | - | - | - |")
    return rows


BENCH_HEAD = ("| scenario, seeds | policy | met | in band | CPU (cores) | limit changes per container "
              "| met / oracle policy | in band / oracle policy |\n|---|---|---|---|---|---|---|---|")


def bench_table(d: dict[str, Any]) -> list[str]:
    lines = [BENCH_HEAD]
    pooled = []
    for s in d["sets"]:
        if "policies" in s:
            lines += _bench_rows(s)
        else:
            pooled.append(s)
    for s in pooled:
        for label, r in s["to_oracle_policy"].items():
            lines.append(f"| {s['scenario']}, {s['seeds']} ({s['n']} seeds) | {label} | - | - | - | - "
                         f"| {ratio_cell(r.get('met'))} | {ratio_cell(r.get('in_band'))} |")
    return lines


def paper_table(d: dict[str, Any]) -> list[str]:
    lines = ["| scenario | policy | met | in band | CPU (cores) |", "|---|---|---|---|---|"]
    for name, s in d.items():
        where = f"{name} ({s['containers']} containers, {s['cores']:g} cores)"
        for pol in PAPER_POLICIES:
            v = s["policies"].get(pol)
            if v is None:
                continue
            label = "oracle policy" if pol == "oracle" else pol
            lines.append(f"| {where} | {label} | {pm(*mean_se(v['met']))} | {pm(*mean_se(v['in_band']))} "
                         f"| {pm(*mean_se(v['cpu_cores']), 2)} |")
        b = s["oracle_bound"]
        lines.append(f"| {where} | oracle bound (ceiling) | {pm(*mean_se(b['met']))} "
                     f"| {pm(*mean_se(b['in_band']))} | - |")
    return lines


def node_kind(r: dict[str, Any]) -> str:
    weights = ", CPU weights" if r.get("cpu_weights") else ""
    return f"{r['runtime']}, {r['cores']:g} cores, {r['containers']} containers{weights}"


def real_table(d: dict[str, Any]) -> list[str]:
    lines = ["| node | policy | runs | met | in band | CPU (cores) |", "|---|---|---|---|---|---|"]
    kinds: dict[str, list[dict[str, Any]]] = {}
    for r in d["runs"]:
        kinds.setdefault(node_kind(r), []).append(r)
    for kind in sorted(kinds):
        rs = kinds[kind]
        for pol in REAL_POLICIES:
            mine = [r for r in rs if r["policy"] == pol and r["met"] is not None]
            if not mine:
                continue
            cpu = [r["cpu_cores"] for r in mine if r["cpu_cores"] is not None]
            lines.append(f"| {kind} | {pol} | {len(mine)} | {pm(*mean_se([r['met'] for r in mine]))} "
                         f"| {pm(*mean_se([r['in_band'] for r in mine]))} "
                         f"| {pm(*mean_se(cpu), 2) if cpu else '-'} |")
        bounded = [r for r in rs if r["policy"] in REAL_POLICIES and r["bound_met"] is not None]
        runs = {r["run"]: r for r in bounded}
        if runs:
            lines.append(f"| {kind} | oracle bound (ceiling) | {len(runs)} "
                         f"| {pm(*mean_se([r['bound_met'] for r in runs.values()]))} "
                         f"| {pm(*mean_se([r['bound_in_band'] for r in runs.values()]))} | - |")
    return lines


def _change(a: float, b: float) -> str:
    return f"{100.0 * (a - b) / b:+.1f}%" if b else "-"


def training_table(sim: dict[str, Any], real: dict[str, Any]) -> list[str]:
    lines = ["| setting | runs | makespan FlowCon (s) | makespan default (s) | change | paper's change "
             "| mean completion FlowCon (s) | mean completion default (s) | change | paper's change |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in sim.items():
        f, b = s["policies"]["flowcon"], s["policies"]["default"]
        p = s.get("paper") or {}
        pm_change = (_change(p["makespan_flowcon_s"], p["makespan_default_s"])
                     if p.get("makespan_flowcon_s") else "-")
        pc_change = (_change(p["mean_completion_flowcon_s"], p["mean_completion_default_s"])
                     if p.get("mean_completion_flowcon_s") else "-")
        fm, bm = mean_se(f["makespan_s"]), mean_se(b["makespan_s"])
        fc, bc = mean_se(f["mean_completion_s"]), mean_se(b["mean_completion_s"])
        lines.append(f"| simulator: {name} ({s['jobs']} jobs, {s['workers']} worker{'s' if s['workers'] > 1 else ''}) "
                     f"| {len(s['seeds'])} | {pm(*fm)} | {pm(*bm)} | {_change(fm[0], bm[0])} | {pm_change} "
                     f"| {pm(*fc)} | {pm(*bc)} | {_change(fc[0], bc[0])} | {pc_change} |")
    pols = real["policies"].values()
    by = {pol: [r for r in pols if r["policy"] == pol] for pol in ("flowcon", "default")}
    if all(by.values()):
        fm, bm = (mean_se([r["makespan_s"] for r in by[p]]) for p in ("flowcon", "default"))
        fc, bc = (mean_se([r["mean_completion_s"] for r in by[p]]) for p in ("flowcon", "default"))
        jobs = len(real["options"]["jobs"].split(","))
        lines.append(f"| real: cgroup runtime, {real['cores']:g} cores, {jobs} training processes "
                     f"| {len(by['flowcon'])} | {pm(*fm)} | {pm(*bm)} | {_change(fm[0], bm[0])} | - "
                     f"| {pm(*fc)} | {pm(*bc)} | {_change(fc[0], bc[0])} | - |")
    return lines


# ---------------------------------------------------------------- the page

HEAD = """# Results

<!-- Generated by `make results` (lab/results_page.py) from docs/data/*.json: do not edit. -->

Every number below is a table rendered from a stored summary. **Met**: a container's latest batch at
or under (1 + alpha) x its objective, what a client counts. **In band**: within +-alpha of the
objective, the paper's figure (a container faster than asked is met but not in band). **CPU**: cores
the managed containers spent. Counts are plateaus (lower median over a run's final window), then means
over seeds or runs, ± their standard error. The **oracle policy** knows every latency curve and the
noise and sets the allocation with the most expected met + in band; the **oracle bound** is the most
any steady allocation could keep met / in band without noise: the ceiling. How each is computed:
[design/oracle.md](design/oracle.md), [design/simulator.md](design/simulator.md); the scenarios:
[reference/scenarios.md](reference/scenarios.md); each policy: [reference/policies.md](reference/policies.md)."""


def render(data: Path) -> str:
    policies, stress = read(data, "policies"), read(data, "stress")
    paper, training = read(data, "paper"), read(data, "training")
    real, training_real = read(data, "real"), read(data, "training_real")
    serving = read(data, "serving_real")
    try:
        parts = [
            HEAD,
            "## Held-out simulations",
            f"Seeds never used while the learned allocator was developed. Made by `{policies['command']}` "
            f"(docs/data/{FILES['policies']}).{_note(policies)} The learned allocator also runs with a calibrated "
            f"prior whose work per batch is off by ±30 % per model (`learned+prior±30%`).{_rescue_note(policies)} "
            "Ratios to the oracle policy are ratios of means over the paired seeds, ± their standard error.",
            "\n".join(bench_table(policies)),
            "## Stress variants",
            "The random clusters departing in one way each: half the cores (scarce), the 40 containers on two "
            "nodes (crowded), twice the cores (roomy), noise sigma in [0.15, 0.3] (noisy), a ±5 % band (tight), "
            "noise that persists from batch to batch (sticky), slow spells a node shares (spells), threads that "
            f"follow the limit (threads). Made by `{stress['command']}` (docs/data/{FILES['stress']}).{_note(stress)}",
            "\n".join(bench_table(stress)),
            "## The paper's scenarios",
            "The paper's single nodes and 40-container cluster in the simulator, built-in profiles. Made by "
            f"`make results` (docs/data/{FILES['paper']}; seeds {_seeds(paper)}).",
            "\n".join(paper_table(paper)),
            "## Real nodes",
            "Real processes under each policy, every stored run: Docker on a 2-core machine, the cgroup runtime "
            "on a 16-core host given 8 or 4 cores; `CPU weights` sets each container's weight from its limit. "
            "The bound is the oracle's on the calibrated profiles, per run. Made by `dqoes experiment real` and "
            f"collected by `python -m lab results real-runs` (docs/data/{FILES['real']}; per-run "
            f"records: {real['records']}).",
            "\n".join(real_table(real)),
            "## Training",
            "FlowCon against default Swarm on training jobs: makespan (first submission to last completion) and "
            "mean completion time. Simulator rows: built-in training scenarios, made by `make results` "
            f"(docs/data/{FILES['training']}; seeds {_seeds(training)}). The real row: training processes on one "
            f"worker, made by `python -m lab training-real` (docs/data/{FILES['training_real']}, with its "
            "options).",
            "\n".join(training_table(training, training_real)),
            "## Model servers on a real node",
            serving_table.intro(serving, FILES["serving_real"]),
            "\n".join(serving_table.section_table(serving)),
        ]
    except (KeyError, TypeError, ValueError, statistics.StatisticsError) as e:
        raise ResultsError(f"{data}: a summary lacks what its table needs ({type(e).__name__}: {e})") from None
    return "\n\n".join(parts) + "\n"


def _rescue_note(d: dict[str, Any]) -> str:
    """Summaries recorded before the `late_rescue` switch was dropped still carry its rows."""
    labels = {label for s in d["sets"] for label in (*s.get("policies", {}), *s.get("to_oracle_policy", {}))}
    if "learned+late rescue" not in labels:
        return ""
    return (" The `learned+late rescue` rows are the dropped `late_rescue` switch, as the summary recorded it "
            "([decision record](decisions/late-rescue.md)); the next run of the benchmark leaves them out.")


def _note(d: dict[str, Any]) -> str:
    return f" {d['note']}" if d.get("note") else ""


def _seeds(d: dict[str, Any]) -> str:
    seeds = next(iter(d.values()))["seeds"]
    return f"{seeds[0]}-{seeds[-1]}"


# ---------------------------------------------------------------- writing the inputs


def bench_sets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The benchmark's results (bench/bench_policies.py run_sets) as the sets the page renders."""
    sets = []
    for v in res.values():
        ratios = {}
        for label, key in (("learned", "learned"), ("learned+late rescue", "learned_late_rescue")):
            f = v["figures"]
            if f"{key}_met_to_oracle_policy" in f:
                ratios[label] = {c: [f[f"{key}_{c}_to_oracle_policy"]["value"], f[f"{key}_{c}_to_oracle_policy"].get("se")]
                                 for c in ("met", "in_band")}
        if "pooled" in v:
            sets.append({"scenario": v["scenario"], "seeds": "every held-out set above", "n": v["pooled"],
                         "to_oracle_policy": ratios})
            continue
        s = v["summary"]
        pols = {label: {"met": p["met_mean"], "met_se": p.get("met_se"), "in_band": p["in_band_mean"],
                        "in_band_se": p.get("in_band_se"), "cpu_cores": p["cpu_cores_mean"],
                        "cpu_cores_se": p.get("cpu_cores_se"), "idle_cores": p["cpu_idle_cores_mean"],
                        "changes_per_container": p["changes_per_container"]} for label, p in s.items()}
        o = s["oracle"]
        sets.append({"scenario": v["scenario"], "seeds": f"{v['seeds'][0]}-{v['seeds'][-1]}", "n": len(v["seeds"]),
                     "policies": pols, "oracle_bound": {"met": o["oracle_met_mean"], "in_band": o["oracle_in_band_mean"]},
                     "to_oracle_policy": ratios})
    return sets


def write_bench(data: Path, key: str, command: str, res: dict[str, Any]) -> Path:
    return write(data, key, {"command": command, "sets": bench_sets(res)})


def simulate(data: Path, seeds: Sequence[int]) -> list[Path]:
    """The paper's scenarios and the training scenarios in the simulator (about a minute)."""
    from experiments import report, training
    from shared.scenarios.training import TRAINING_BUILTINS

    paper = report.report_data(report.builtin_names(None), seeds)
    sim_training = training.report_data(list(TRAINING_BUILTINS), seeds)
    return [write(data, "paper", paper), write(data, "training", sim_training)]


def collect_real(data: Path, paths: Sequence[str]) -> Path:
    """Add (or replace, by run name) the rows of `dqoes experiment real` summaries in real-runs.json."""
    from lab import real_index

    rows = real_index.read_runs(real_index.summary_files(paths))
    try:
        d = read(data, "real")
    except ResultsError:
        d = {"records": "the summaries named when they were collected", "runs": []}
    new = {r["run"] for r in rows}
    d["runs"] = sorted([r for r in d["runs"] if r["run"] not in new] + [{k: r[k] for k in REAL_KEEP} for r in rows],
                       key=lambda r: (r["started_at"], r["run"], r["policy"]))
    return write(data, "real", d)


def _seed_range(text: str) -> list[int]:
    a, sep, b = text.partition("-")
    try:
        lo, hi = int(a), int(b if sep else a)
    except ValueError:
        raise ResultsError(f"--seeds: expected N or A-B, got {text!r}") from None
    if lo < 0 or hi < lo:
        raise ResultsError(f"--seeds: expected A <= B, got {text!r}")
    return list(range(lo, hi + 1))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The actions and their flags, on `python -m lab results` (lab/cli.py)."""
    ap.add_argument("--data", type=Path, default=DATA, help="the summaries' folder (default: docs/data)")
    sub = ap.add_subparsers(dest="results_action", required=True, metavar="STEP")
    r = sub.add_parser("render", help="write the page from the summaries")
    r.add_argument("--out", type=Path, default=PAGE, help="the page (default: docs/results.md)")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page differs")
    s = sub.add_parser("simulate", help="rerun the paper's and the training scenarios in the simulator")
    s.add_argument("--seeds", default="1-5")
    c = sub.add_parser("real-runs", help="collect `dqoes experiment real` summaries into real-runs.json")
    c.add_argument("paths", nargs="+", help="summary files, or folders of real-*.json")


def run(args: argparse.Namespace) -> int:
    try:
        if args.results_action == "simulate":
            for p in simulate(args.data, _seed_range(args.seeds)):
                print(f"written {p}", file=sys.stderr)
        elif args.results_action == "real-runs":
            print(f"written {collect_real(args.data, args.paths)}", file=sys.stderr)
        else:
            page = render(args.data)
            if args.check:
                same = args.out.is_file() and args.out.read_text() == page
                print(f"{args.out}: {'up to date' if same else 'differs from what make results writes'}",
                      file=sys.stderr)
                return 0 if same else 1
            args.out.write_text(page)
            print(f"written {args.out} ({page.count(chr(10))} lines)", file=sys.stderr)
    except ResultsError as e:
        print(f"results: error: {e}", file=sys.stderr)
        return 2
    except ExperimentError as e:  # a file that is not a summary `dqoes experiment real` writes
        print(f"results: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab results", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
