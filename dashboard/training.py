"""Training jobs on the dashboard: FlowCon against default, from recorded timelines (pure functions).

Why its own module: training timelines (`dqoes experiment run flowcon-* --out
DIR`) carry other rows than inference ones (a `job` row per job per training
round: list, growth efficiency, CPU share, limit; a `result` row with each
job's completion time). These functions turn them into the frames and Altair
figures of the Training page (`app_pages/training.py`): per-job completion
bars, FlowCon beside default as in the paper's Figs. 5, 8 and 13-16, and each
job's growth efficiency and CPU share over time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

JOB_COLUMNS = ("t", "node", "job", "stage", "growth", "cpu_share", "limit")


@dataclass
class TrainingRun:
    label: str
    scenario: str
    policy: str
    seed: int | None
    jobs: pd.DataFrame
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_s(self) -> dict[str, float]:
        return dict(self.result.get("completion_s") or {})


def is_training_timeline(path: str | Path) -> bool:
    """True when the file's first line is the meta row of a training run."""
    try:
        with open(path, "rb") as f:
            first = json.loads(f.readline() or b"{}")
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and first.get("kind") == "meta" and first.get("training") is True


def run_from_rows(rows: Iterable[dict[str, Any]], label: str) -> TrainingRun:
    meta: dict[str, Any] = {}
    result: dict[str, Any] = {}
    jobs = []
    for r in rows:
        kind = r.get("kind")
        if kind == "meta" and not meta:
            meta = r
        elif kind == "job":
            jobs.append({c: r.get(c) for c in JOB_COLUMNS})
        elif kind == "result":
            result = r
    df = pd.DataFrame(jobs, columns=list(JOB_COLUMNS))
    for c in ("t", "growth", "cpu_share", "limit"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return TrainingRun(label=label, scenario=str(meta.get("scenario", result.get("scenario", "?"))),
                       policy=str(meta.get("policy", result.get("policy", "?"))), seed=meta.get("seed"),
                       jobs=df, result=result)


def live_run(label: str, rows: Sequence[dict[str, Any]]) -> TrainingRun:
    """A live cluster's training rounds (the collector's `SourceSnapshot.training`) as a run without a result."""
    df = pd.DataFrame([{c: r.get(c) for c in JOB_COLUMNS} for r in rows], columns=list(JOB_COLUMNS))
    for c in ("t", "growth", "cpu_share", "limit"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    policy = str(rows[-1].get("policy", "?")) if rows else "?"
    return TrainingRun(label=label, scenario=label, policy=policy, seed=None, jobs=df)


def latest_jobs(run: TrainingRun) -> pd.DataFrame:
    """Each job's newest row: node, list, G, CPU share, limit (the live table)."""
    if run.jobs.empty:
        return run.jobs
    return run.jobs.sort_values("t").groupby("job", as_index=False).last()[list(JOB_COLUMNS)]


def load(path: str | Path) -> TrainingRun:
    with open(path, "rb") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return run_from_rows(rows, Path(path).stem)


def completion_frame(runs: Sequence[TrainingRun]) -> pd.DataFrame:
    """One row per job and run: job, policy, completion_s (jobs in submission order)."""
    rows = []
    for r in runs:
        for job, c in r.completion_s.items():
            rows.append({"job": job, "policy": r.policy, "completion_s": float(c)})
    return pd.DataFrame(rows, columns=["job", "policy", "completion_s"])


def summary_sentence(a: TrainingRun, b: TrainingRun) -> str:
    """Makespan and mean completion of two runs, with the change said plainly."""
    def pct(x: float, y: float) -> str:
        return "no change" if not y else f"{100 * (x - y) / y:+.1f}%"
    ma, mb = a.result.get("makespan_s"), b.result.get("makespan_s")
    ca, cb = a.result.get("mean_completion_s"), b.result.get("mean_completion_s")
    if ma is None or mb is None or ca is None or cb is None:
        return "One of the runs has no result row (it did not finish)."
    return (f"{a.policy}: makespan {ma:.1f} s, mean completion {ca:.1f} s; {b.policy}: {mb:.1f} s and {cb:.1f} s. "
            f"{a.policy} vs {b.policy}: makespan {pct(ma, mb)}, mean completion {pct(ca, cb)}.")


def completion_chart(df: pd.DataFrame) -> alt.Chart:
    order = list(dict.fromkeys(df["job"]))
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("job:N", sort=order, title="job"),
        xOffset=alt.XOffset("policy:N"),
        y=alt.Y("completion_s:Q", title="completion time (s)"),
        color=alt.Color("policy:N", title="policy"),
        tooltip=["job", "policy", alt.Tooltip("completion_s:Q", format=".1f")],
    ).properties(height=300)


def _lines(df: pd.DataFrame, y: str, title: str) -> alt.Chart:
    return alt.Chart(df.dropna(subset=[y])).mark_line(interpolate="step-after").encode(
        x=alt.X("t:Q", title="time (s)"), y=alt.Y(f"{y}:Q", title=title),
        color=alt.Color("job:N", title="job"), tooltip=["job", "node", "stage", alt.Tooltip(f"{y}:Q", format=".4g")],
    ).properties(height=260)


def growth_chart(run: TrainingRun) -> alt.Chart:
    """Each job's growth efficiency G (per-second progress per core, FlowCon's unit) at every round."""
    return _lines(run.jobs, "growth", "growth efficiency G")


def share_chart(run: TrainingRun) -> alt.Chart:
    """Each job's CPU share of its node over the last interval, at every round."""
    return _lines(run.jobs, "cpu_share", "CPU share of the node")


def counterpart(path: Path, candidates: Sequence[Path]) -> Path | None:
    """The same scenario and seed under the other policy (flowcon <-> default), if it is there."""
    name = path.name
    for a, b in (("_flowcon_", "_default_"), ("_default_", "_flowcon_")):
        if a in name:
            want = name.replace(a, b)
            for c in candidates:
                if c.name == want:
                    return c
    return None
