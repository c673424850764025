"""Replay a recorded real run through a policy: what it would have decided with other settings.

Why: a run on a real node takes ten minutes a policy and never repeats exactly
(the machine, its neighbours, the noise); the batches it recorded do. `dqoes
experiment real` writes every batch the workloads reported and every round the
worker published; this module feeds the batches, at their times, to a fresh
policy in a `NodeController` and runs its rounds when the worker ran them.

Replayed with the settings the run used, the decisions come out as recorded
(which checks that the record holds everything the policy read). The record
stamps a batch when the recorder received it, which on a busy node can fall on
the other side of a round from when the worker read it; each round names the
latest batch the worker had read, and the replay follows that. The worker
reads a batch as of when it finished (the workload's stamp), and so does the
replay where the record keeps that stamp (`finished_s`; records before 27 Nov
2026 do not, and replay at the receipt stamp). With other
settings it answers "would the limits have moved": the policy reads each batch
under the limit actually in force then (its latency came from that limit) and
decides from the limits it set itself, with the objectives the worker had at
each round (one changed mid-run takes effect at the round it started). It is
open loop: how batches would have run under limits that were never set is not
known, so it says nothing about how many containers would have been met.

A worker records its parameters in every state; the replay says which of its
own differ from the run's and which the record predates (a parameter added to
the policy since, replayed at its default unless set), so that a replay that
disagrees with its run says why before anyone suspects the record.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from experiments.common import batch_finished_s, read_record, record_stem
from shared.core import registry
from shared.core.controller import NodeController
from shared.core.policy import numeric_params
from shared.core.types import workload_of

LOOKAHEAD_S = 1.0
"""How long after a round the recorder may have stamped a batch the worker had read before it."""
SAME_LIMIT = 1e-4
"""Limits closer than this (relative) are the same limit: a runtime rounds what it applies (Docker to
a billionth of a core, the worker's record to a millionth of the node)."""


def load_run(run_dir: str | Path, policy: str) -> tuple[list[dict[str, Any]], float]:
    """The rows `dqoes experiment real --out DIR` recorded for `policy`, and the node's cores."""
    d = Path(run_dir)
    summary, rows_path = d / "summary.json", d / f"{record_stem(policy)}.jsonl"
    if not summary.is_file():
        raise ValueError(f"{summary}: no such file (a directory written by `dqoes experiment real --out`)")
    if not rows_path.is_file():
        raise ValueError(f"{rows_path}: no such file (was {policy} one of the run's policies?)")
    try:
        d = json.loads(summary.read_text())
        # Records from before batches carried their model and images: the summary says what each ran.
        models = {c["name"]: c.get("model") for c in d.get("containers", []) if isinstance(c, Mapping)}
        cores = float(d["cores"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{summary}: not a summary `dqoes experiment real` writes ({type(e).__name__}: {e})") from None
    if not (math.isfinite(cores) and cores > 0):
        raise ValueError(f"{summary}: cores must be a positive number, got {d['cores']!r}")
    rows = [{**r, "model": models.get(r.get("container")), "images": d.get("batch")}
            if r.get("kind") == "batch" and "model" not in r else r for r in read_record(rows_path)]
    return rows, cores


def replay(rows: Iterable[Mapping[str, Any]], policy: str, cores: float,
           settings: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Feed the recorded batches and rounds to `policy` (with `settings`); count the changes it makes.

    Per container: `recorded` changes the run made, `replayed` changes the policy makes from its own
    limits, and `agree` the rounds where it chose the limit the run set. `changes` lists the
    replayed changes (time, container, old and new limit, reason).
    """
    settings = dict(settings or {})
    registry.check_names(policy, settings)
    built = registry.build(policy, settings)
    ctl = NodeController("replay", cores, built)
    rows = list(rows)
    batches = [(r["t_s"], 0, r) for r in rows if r.get("kind") == "batch"]
    rounds = [(r["t_s"], 1, r) for r in rows if r.get("kind") == "decision"]
    states = [r for r in rows if r.get("kind") == "state"]
    run_params = next((dict(r["params"]) for r in states if isinstance(r.get("params"), Mapping)), None)
    if not rounds:
        raise ValueError("the record has no rounds (decision rows): nothing to replay")
    objectives = _objectives_by_round(states)
    first: dict[str, float] = {}
    for _, seen_then in objectives:
        for name, (objective_s, _alpha) in seen_then.items():
            first.setdefault(name, objective_s)
    run_limit: dict[str, float | None] = {}
    own: dict[str, float | None] = {}
    cpu_total: dict[str, float] = {}
    last_t = 0.0
    per = {n: {"recorded": 0, "replayed": 0, "agree": 0, "rounds": 0} for n in first}
    changes: list[dict[str, Any]] = []
    events = sorted(batches + rounds, key=lambda e: (e[0], e[1]))
    models = {r["container"]: r.get("model") for _, _, r in reversed(batches)}  # as a label would give it
    taken: set[int] = set()
    pending: dict[str, list[tuple[float, Mapping[str, Any]]]] = {}
    for i, (t, _, r) in enumerate(events):
        if r["kind"] == "batch":
            if i not in taken and r["container"] in ctl.containers:
                pending.setdefault(r["container"], []).append((t, r))
            continue
        seen = r["containers"]
        now = _in_force(objectives, r.get("round", 0))
        for name, c in seen.items():
            if name not in ctl.containers and name in first:
                objective_s, alpha = now.get(name, (first[name], None))
                ctl.add(name, t, objective_s=objective_s, alpha=alpha, cpu_total_s=0.0, limit=c["old_limit"],
                        workload=workload_of(models.get(name)))
                cpu_total[name] = 0.0
                run_limit[name] = own[name] = c["old_limit"]
            elif c.get("cpu_share") is not None and name in cpu_total:
                # What it used since the last round (one added now has its baseline here, at 0).
                cpu_total[name] += c["cpu_share"] * (t - last_t) * cores
        for gone in [n for n in ctl.containers if n not in seen]:
            ctl.remove(gone, t)
            pending.pop(gone, None)  # one that comes back under the name starts afresh
        for name, (objective_s, alpha) in now.items():
            if name in ctl.containers:
                ctl.set_objective(name, objective_s, t, alpha)  # as the worker had it at this round
        last_t = t
        for name, tr in ctl.containers.items():
            fed = tr.new_latency_s if tr.new_latency_s is not None else tr.last_latency_s
            _feed(ctl, name, _seen_by_worker(name, seen[name].get("latency_s"), fed, t, i, events, taken, pending),
                  run_limit.get(name), t)
        since = {}
        for name, tr in ctl.containers.items():
            since[name] = (tr.limit_since_s, tr.prev_limit, tr.older)
            in_force = seen[name]["old_limit"]
            if _same(own[name], in_force):
                own[name] = in_force  # the same limit, as the runtime rounded it
            tr.limit = own[name]  # it decides from the limits it set
        decision = ctl.run_round(t, cpu_total)
        for cd in decision.containers:
            rec, tr, count = seen[cd.name], ctl.containers[cd.name], per[cd.name]
            count["rounds"] += 1
            if _same(cd.new_limit, rec["new_limit"]):
                count["agree"] += 1
            if not _same(cd.new_limit, cd.old_limit) and cd.old_limit is not None:
                count["replayed"] += 1
                changes.append({"t_s": t, "container": cd.name, "old_limit": cd.old_limit,
                                "new_limit": cd.new_limit, "reason": cd.reason})
            own[cd.name] = cd.new_limit
            # What the next batches ran under, and when that limit came: as the run had it.
            tr.limit = run_limit[cd.name] = rec["new_limit"]
            tr.limit_since_s, tr.prev_limit, tr.older = since[cd.name]
            if rec["old_limit"] is not None and not _same(rec["new_limit"], rec["old_limit"]):
                count["recorded"] += 1
                tr.limit_changed(t, rec["old_limit"])
    total_rounds = sum(c["rounds"] for c in per.values())
    return {
        "stamps": stamps([r for _, _, r in batches], [r for _, _, r in rounds]),
        "policy": policy, "settings": settings, "cores": cores, "rounds": len(rounds),
        "containers": per,
        "recorded_changes": sum(c["recorded"] for c in per.values()),
        "replayed_changes": sum(c["replayed"] for c in per.values()),
        "agreement": sum(c["agree"] for c in per.values()) / total_rounds if total_rounds else math.nan,
        "changes": changes,
        **_against_run(run_params, numeric_params(built.params)),
    }


def stamps(batches: list[Mapping[str, Any]], rounds: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How late the record received its batches, from records that say when each finished (else None).

    `lag_*_s`: receipt less end (median, 99th percentile, most); `after_round`: batches received
    after a round that followed their end; `after_moving_round`: of those, after one that moved
    their container's limit, the only ones whose limit a receipt stamp would misplace."""
    timed = [b for b in batches if b.get("finished_s") is not None]
    if not timed:
        return None
    lags = sorted(b["t_s"] - b["finished_s"] for b in timed)
    moved = [(r["t_s"], {n for n, c in r["containers"].items() if not _same(c["new_limit"], c["old_limit"])})
             for r in rounds]
    # For each batch, what the rounds between its end and its receipt moved (one scan of the rounds).
    crossed = [(b["container"], [names for t, names in moved if b["finished_s"] < t < b["t_s"]]) for b in timed]
    return {"batches": len(timed), "lag_median_s": lags[(len(lags) - 1) // 2],
            "lag_p99_s": lags[int(0.99 * (len(lags) - 1))], "lag_max_s": lags[-1],
            "after_round": sum(1 for _, between in crossed if between),
            "after_moving_round": sum(1 for name, between in crossed if any(name in n for n in between))}


def _against_run(run: Mapping[str, Any] | None, replayed: Mapping[str, float]) -> dict[str, Any]:
    """What the replay ran with against what the run's worker recorded (its first state): the
    parameters set otherwise, and those the record does not have (added to the policy since)."""
    if run is None:
        return {"run_params": None, "unlike_run": {}, "not_in_record": []}
    unlike = {n: {"run": float(run[n]), "replay": v} for n, v in replayed.items()
              if n in run and not math.isclose(float(run[n]), v, rel_tol=1e-9, abs_tol=1e-12)}
    return {"run_params": dict(run), "unlike_run": unlike, "not_in_record": sorted(n for n in replayed if n not in run)}


def _objectives_by_round(states: Iterable[Mapping[str, Any]]) -> list[tuple[int, dict[str, tuple[float, float | None]]]]:
    """(round, {container: (objective, alpha)}) from the recorded states, in the order of rounds.

    A state carries the number of the last round the worker ran; an objective changed between two
    rounds starts the next one at once, so the first state that reports round R shows the
    objectives that round R decided for."""
    out: dict[int, dict[str, tuple[float, float | None]]] = {}
    for s in states:
        seen = {name: (float(c["objective_s"]), c.get("alpha"))
                for name, c in s.get("containers", {}).items() if c.get("objective_s") is not None}
        out.setdefault(int(s.get("round", 0)), seen)
    return sorted(out.items())


def _in_force(objectives: list[tuple[int, dict[str, tuple[float, float | None]]]],
              round_no: int) -> dict[str, tuple[float, float | None]]:
    """The objectives at round `round_no`: those of the first state at or after it, else the last."""
    for r, seen in objectives:
        if r >= round_no:
            return seen
    return objectives[-1][1] if objectives else {}


def _seen_by_worker(name: str, latency_s: float | None, fed: float | None, t: float, at: int,
                    events: list[tuple[float, int, Mapping[str, Any]]], taken: set[int],
                    pending: dict[str, list[tuple[float, Mapping[str, Any]]]]) -> list[tuple[float, Mapping[str, Any]]]:
    """The batches of `name` the worker had read by the round at `t` (the `at`-th event) that the
    replay has not fed yet (`fed`: the latency of the latest it fed).

    The record stamps a batch when the recorder received it and a round when the worker ran it;
    on a busy node the two race (a batch the worker read and acted on was stamped 10 ms after the
    round it started). The round says which batch was the container's latest (its `latency_s`):
    every batch up to that one, one stamped up to LOOKAHEAD_S after the round included, and none
    after it. Where the record has no such batch (or the round no latency), the stamps decide."""
    queue = pending.get(name, [])
    if latency_s is not None:
        if fed is not None and math.isclose(fed, latency_s, rel_tol=1e-12):
            return []  # its latest is a batch already fed: the worker read none of these yet
        for j, (_, r) in enumerate(queue):
            if math.isclose(r["latency_s"], latency_s, rel_tol=1e-12):
                pending[name] = queue[j + 1 :]
                return queue[: j + 1]
        ahead = []
        for k in range(at + 1, len(events)):
            t_k, kind, r = events[k]
            if t_k > t + LOOKAHEAD_S:
                break
            if kind == 0 and r["container"] == name and k not in taken:
                ahead.append(k)
                if math.isclose(r["latency_s"], latency_s, rel_tol=1e-12):
                    taken.update(ahead)  # read before the round: fed now, at the round's time
                    pending[name] = []
                    return queue + [(t, events[x][2]) for x in ahead]
    pending[name] = []
    return queue


def _feed(ctl: NodeController, name: str, batches: list[tuple[float, Mapping[str, Any]]],
          limit: float | None, t: float) -> None:
    """Give the controller these batches of `name`, each under the run's limit then, no later than `t`."""
    tr = ctl.containers[name]
    for tb, r in batches:
        tr.limit = limit  # the run's limit in force (the one before it, for a batch that finished before)
        workload = workload_of(r.get("model"), r.get("images"))
        # Stamped, as the worker stamps it, when it finished (records since 27 Nov say when).
        at = batch_finished_s(r, min(tb, t))
        ctl.record_latency(name, r["latency_s"], at, r.get("cpu_s"), workload,
                           follows_limit=bool(r.get("follows_limit", False)))


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isclose(a, b, rel_tol=SAME_LIMIT))


def render(res: Mapping[str, Any]) -> str:
    """A table for people: limit changes per container, recorded and replayed."""
    settings = ", ".join(f"{k}={v:g}" for k, v in res["settings"].items()) or "its defaults"
    lines = [f"{res['policy']} replayed with {settings} over {res['rounds']} recorded rounds "
             f"({res['cores']:g} cores): it chose the run's limit in {res['agreement']:.1%} of container-rounds",
             "", "| container | limit changes in the run | replayed | rounds agreeing |", "|---|---|---|---|"]
    for name, c in sorted(res["containers"].items()):
        lines.append(f"| {name} | {c['recorded']} | {c['replayed']} | {c['agree']}/{c['rounds']} |")
    lines.append(f"| all | {res['recorded_changes']} | {res['replayed_changes']} | |")
    st = res.get("stamps")
    if st is None:
        lines.append("\nThe record stamps batches only when it received them (records before 27 Nov 2026): "
                     "replayed at those stamps.")
    else:
        lines.append(f"\nBatches received {st['lag_median_s'] * 1000:.0f} ms after they finished (median; 99th "
                     f"percentile {st['lag_p99_s'] * 1000:.0f} ms, most {st['lag_max_s'] * 1000:.0f} ms); "
                     f"{st['after_round']} of {st['batches']} after a round that followed their end, "
                     f"{st['after_moving_round']} after one that moved their limit. Replayed as of when they finished.")
    if res.get("run_params") is None:
        lines.append("\nThe record does not say the run's parameters (its worker did not keep them then).")
    else:
        if res["unlike_run"]:
            lines.append("\nSet unlike the run: " + ", ".join(
                f"{n}={d['replay']:g} (the run: {d['run']:g})" for n, d in sorted(res["unlike_run"].items())) + ".")
        if res["not_in_record"]:
            lines.append("\nNot in the record (added to the policy since the run): " + ", ".join(res["not_in_record"])
                         + ". Replayed at the defaults unless set; set each (NAME=VALUE) to the value that does "
                         "what the policy did then to replay the run as it ran.")
    return "\n".join(lines)
