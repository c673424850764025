"""Runs as tables: the one shape the dashboard draws, whatever the data came from.

Why: a recorded experiment (a timeline file from `dqoes experiment run --out`
or `dqoes record`) and a live cluster (node states on the bus) say the same
things in different forms. Both become a `RunData` here: a rounds table (one
row per node and sample) and a containers table (one row per container and
sample), with the timeline file's column names. Every figure and table in
`dashboard.views` is a function of a RunData, so the live and the recorded
views cannot disagree about what a number means.

Live node states are turned into timeline rows by `state_rows`, the same
function the recorder uses, so a recorded live run reads back exactly as it
was shown.

Units: `t_s` is seconds since the run began (scenario seconds for simulated
runs, wall seconds for live ones), `at` unix seconds (live only), `*_s`
seconds per batch, `limit` and `cpu_share` fractions of the node (1.0 = all
its cores; a NaN limit means no limit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from shared.core import registry
from shared.core.types import Cls
from shared.schema import NodeState
from shared.timeline import parse_lines, read_jsonl

ROUND_COLUMNS: tuple[str, ...] = (
    "t_s",
    "at",
    "node",
    "round",
    "node_round",
    "policy",
    "cores",
    "satisfied",
    "G",
    "S",
    "B",
    "pending",
    "containers",
    "slack_sum_g_s",
    "slack_sum_s_s",
    "slack_sum_b_s",
    "interval_s",
    "listener",
    "event",
)
"""One node's sample. `round` orders the samples of a run (the simulator's
round counter; a sequence number for live runs); `node_round` is the worker's
own round counter (live only)."""

CONTAINER_COLUMNS: tuple[str, ...] = (
    "t_s",
    "node",
    "round",
    "container",
    "model",
    "objective_s",
    "cls",
    "slack_s",
    "latency_s",
    "limit",
    "cpu_share",
    "throttled_ratio",
)
"""One container in one sample. `cls` is G, S, B, "pending" (no batch yet)
or "unmanaged" (no objective: seen, not controlled); `throttled_ratio` the
share of CFS periods it was throttled in (NaN: not measured, as in the
simulator and in timelines recorded before schema v3)."""

_FLOAT_ROUND = ("t_s", "at", "node_round", "cores", "slack_sum_g_s", "slack_sum_s_s", "slack_sum_b_s", "interval_s")
_INT_ROUND = ("round", "satisfied", "G", "S", "B", "pending", "containers")
_FLOAT_CONTAINER = ("t_s", "objective_s", "slack_s", "latency_s", "limit", "cpu_share", "throttled_ratio")
_TEXT_ROUND = ("node", "policy", "listener", "event")
_TEXT_CONTAINER = ("node", "container", "model", "cls")

PENDING = "pending"
UNMANAGED = "unmanaged"

OLD_NAMES = {"q_s": "slack_s", "q_g_s": "slack_sum_g_s", "q_s_s": "slack_sum_s_s", "q_b_s": "slack_sum_b_s"}
"""Column names timelines had before schema v2; files recorded then still load."""

def policy_name(policy: str) -> str:
    """How a policy is named on the page: `dqoes` -> DQoES, `default` -> default Swarm."""
    return registry.label(policy)


@dataclass(frozen=True)
class RunData:
    """One run (live or recorded) as the two tables every view is drawn from."""

    label: str
    """Who this run is on the page: a stack's label or a file's name."""
    rounds: pd.DataFrame
    containers: pd.DataFrame
    policy: str = ""
    scenario: str = ""
    seed: int | None = None
    live: bool = False
    nodes: dict[str, float] = field(default_factory=dict)
    """Node name -> cores."""
    containers_total: int = 0
    """Containers in the run (the "of 40" of "22 of 40 met")."""
    result: dict[str, Any] | None = None
    """The timeline's "result" line, when the run finished."""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def time_label(self) -> str:
        if self.live:
            return "time (s since the dashboard's first node state)"
        if self.meta.get("scenario") == "live":
            return "time (s since the recording began)"
        return "scenario time (s)"

    @property
    def title(self) -> str:
        """`DQoES` for a dqoes run, else the label."""
        name = policy_name(self.policy) if self.policy else self.label
        if self.label and self.label not in (self.policy, name):
            return f"{name} ({self.label})" if self.policy else self.label
        return name

    @property
    def empty(self) -> bool:
        return self.rounds.empty


# --- live node states -> rows -----------------------------------------------------------


def container_class(cls: Cls | str | None, managed: bool = True) -> str:
    if not managed:
        return UNMANAGED
    if cls is None:
        return PENDING
    return str(cls.value if isinstance(cls, Cls) else cls)


def state_rows(
    ns: NodeState, seq: int, t_s: float, listener: str = "", event: str | None = None
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """A node state as one rounds row and its containers rows (ROUND_/CONTAINER_COLUMNS order).

    `seq` is the sample's number in the run, `t_s` its time on the run's axis;
    `listener` and `event` come from the worker's decision of that round.
    """
    m = ns.members
    round_row = (
        t_s,
        ns.at,
        ns.node,
        seq,
        float(ns.round),
        ns.policy,
        ns.cores,
        ns.satisfied,
        len(m["G"]),
        len(m["S"]),
        len(m["B"]),
        len(m["pending"]),
        len(ns.containers),
        ns.slack_sum_g_s,
        ns.slack_sum_s_s,
        ns.slack_sum_b_s,
        ns.interval_s,
        listener,
        event,
    )
    rows = [
        (
            t_s,
            ns.node,
            seq,
            c.container,
            c.model,
            c.objective_s,
            container_class(c.cls, c.managed),
            c.slack_s,
            c.latency_s,
            c.limit,
            c.cpu_share,
            c.throttled_ratio,
        )
        for c in ns.containers
    ]
    return round_row, rows


def as_dict(columns: Sequence[str], row: Sequence[Any], kind: str) -> dict[str, Any]:
    """A row tuple as a timeline JSON line object."""
    return {"kind": kind, **dict(zip(columns, row, strict=True))}


# --- rows -> frames ------------------------------------------------------------------


def rounds_frame(rows: Sequence[tuple[Any, ...]] | Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The rounds table from row tuples (ROUND_COLUMNS order) or timeline dicts."""
    return _typed(_frame(rows, ROUND_COLUMNS), _FLOAT_ROUND, _INT_ROUND, _TEXT_ROUND)


def containers_frame(rows: Sequence[tuple[Any, ...]] | Sequence[dict[str, Any]]) -> pd.DataFrame:
    """The containers table from row tuples (CONTAINER_COLUMNS order) or timeline dicts."""
    return _typed(_frame(rows, CONTAINER_COLUMNS), _FLOAT_CONTAINER, ("round",), _TEXT_CONTAINER)


def _frame(rows: Sequence[Any], columns: Sequence[str]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame({c: [] for c in columns})
    if isinstance(rows[0], dict):
        df = pd.DataFrame.from_records(rows)
        return df.reindex(columns=list(columns))
    return pd.DataFrame.from_records(rows, columns=list(columns))


def _typed(
    df: pd.DataFrame, floats: Sequence[str], ints: Sequence[str], texts: Sequence[str]
) -> pd.DataFrame:
    out = {c: df[c].astype(object) for c in texts}
    for c in floats:
        out[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in ints:
        out[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype("int64")
    return df.assign(**out)


# --- timeline files -> RunData --------------------------------------------------------


def rows_from_bytes(data: bytes) -> Iterator[dict[str, Any]]:
    """Rows of a timeline given as bytes (an upload); torn or blank lines are skipped."""
    return parse_lines(data.splitlines())


def load_timeline(path: str | Path, label: str | None = None) -> RunData:
    """A timeline file (`dqoes experiment run --out`, `dqoes record`) as a RunData."""
    p = Path(path)
    return run_from_rows(read_jsonl(p), label or p.stem)


def run_from_rows(rows: Iterable[dict[str, Any]], label: str) -> RunData:
    """A RunData from timeline rows (meta, round, container, result; others ignored).

    Q_S per round is the sum of slack over the round's S containers when the
    file does not carry it (simulator timelines do not). Files written before
    the v2 names (`q_s`, `q_g_s`, ...) load the same.
    """
    meta: dict[str, Any] = {}
    result: dict[str, Any] | None = None
    round_rows: list[dict[str, Any]] = []
    container_rows: list[dict[str, Any]] = []
    for row in rows:
        kind = row.get("kind")
        if any(old in row for old in OLD_NAMES):
            row = {OLD_NAMES.get(k, k): v for k, v in row.items()}
        if kind == "round":
            round_rows.append(row)
        elif kind == "container":
            container_rows.append(row)
        elif kind == "meta" and not meta:
            meta = row
        elif kind == "result":
            result = row
    policy = str(meta.get("policy") or (round_rows[0].get("policy") if round_rows else "") or "")
    rounds = rounds_frame(round_rows)
    containers = containers_frame(container_rows)
    if not containers.empty:
        objective_missing = containers["objective_s"].isna()
        cls = containers["cls"].astype(object)
        cls = cls.where(cls.notna(), PENDING).where(~(cls.isna() & objective_missing), UNMANAGED)
        containers = containers.assign(cls=cls)
    if not rounds.empty:
        rounds = _fill_rounds(rounds, round_rows, containers, policy, meta)
    nodes = meta.get("nodes") or {}
    if not isinstance(nodes, dict):
        nodes = {}
    nodes = {str(k): float(v) for k, v in nodes.items() if isinstance(v, int | float)}
    if not nodes and not rounds.empty:
        nodes = rounds.groupby("node", sort=True)["cores"].last().fillna(0.0).to_dict()
    total = _containers_total(meta, result, containers)
    seed = meta.get("seed")
    return RunData(
        label=label,
        rounds=rounds,
        containers=containers,
        policy=policy,
        scenario=str(meta.get("scenario") or ""),
        seed=seed if isinstance(seed, int) else None,
        live=False,
        nodes=nodes,
        containers_total=total,
        result=result,
        meta=meta,
    )


def _fill_rounds(
    rounds: pd.DataFrame,
    raw: list[dict[str, Any]],
    containers: pd.DataFrame,
    policy: str,
    meta: dict[str, Any],
) -> pd.DataFrame:
    """Fill what simulator timelines leave out: policy, cores, container count, Q_S."""
    out: dict[str, Any] = {}
    if rounds["policy"].isna().all():
        out["policy"] = policy
    cores = meta.get("nodes") if isinstance(meta.get("nodes"), dict) else {}
    if rounds["cores"].isna().all() and cores:
        out["cores"] = rounds["node"].map(lambda n: cores.get(n, math.nan)).astype("float64")
    if not any("containers" in r for r in raw[:1]):
        out["containers"] = rounds[["G", "S", "B", "pending"]].sum(axis=1).astype("int64")
    if not any("slack_sum_s_s" in r for r in raw[:1]):
        if containers.empty:
            out["slack_sum_s_s"] = 0.0
        else:
            s = containers[containers["cls"] == "S"]
            sums = s.groupby(["node", "round"])["slack_s"].sum()
            key = pd.MultiIndex.from_arrays([rounds["node"], rounds["round"]])
            out["slack_sum_s_s"] = sums.reindex(key).fillna(0.0).to_numpy()
    if rounds["listener"].isna().any():
        out["listener"] = rounds["listener"].fillna("")
    return rounds.assign(**out) if out else rounds


def _containers_total(
    meta: dict[str, Any], result: dict[str, Any] | None, containers: pd.DataFrame
) -> int:
    declared = meta.get("containers")
    if isinstance(declared, dict) and declared:
        return len(declared)
    if isinstance(declared, int) and declared > 0:
        return declared
    if result and isinstance(result.get("containers"), int):
        return int(result["containers"])
    return int(containers["container"].nunique()) if not containers.empty else 0


def counterpart(name: str, candidates: Sequence[str]) -> str | None:
    """The same scenario and seed under the other policy (dqoes <-> default), if listed.

    Timeline files are named `<scenario>_<policy>_seed<N>.jsonl`
    (`shared.timeline.run_file_name`).
    """
    head, sep, base = name.rpartition("/")
    for mine, other in (("_dqoes_seed", "_default_seed"), ("_default_seed", "_dqoes_seed")):
        if mine in base:
            left, _, right = base.rpartition(mine)
            want = f"{head}{sep}{left}{other}{right}"
            if want in candidates:
                return want
    return None


def first_pick(names: Sequence[str]) -> str:
    """The run to open first: the newest DQoES run that has a default counterpart, else the newest.

    `names` are newest first (as `dashboard.ui.list_runs` gives them).
    """
    for name in names:
        if "_dqoes_seed" in name.rpartition("/")[2] and counterpart(name, names):
            return name
    return names[0]


def short_name(name: str, dirs: Sequence[str]) -> str:
    """A run's name as listed: relative to the run folder it was found in, else as it is."""
    for d in dirs:
        base = str(Path(d))
        if name.startswith(base.rstrip("/") + "/"):
            return name[len(base.rstrip("/")) + 1 :]
    return name
