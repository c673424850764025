"""Measures of a run: how many containers a policy keeps satisfied, read the same way everywhere.

The simulator, `dqoes up`, the real-node experiment and the dashboard all
report a run's level with these functions, so a count printed by one is the
count printed by the others. Pure: series in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def plateau(series: list[tuple[float, int]], start_s: float, end_s: float, samples: int = 61) -> int:
    """Lower median of a step function |S|(t) sampled evenly over [start_s, end_s].

    One instant of a noisy system is a coin flip at the band edges; the
    paper reads the level its figures settle at. Lower median: a tie counts
    against the policy.
    """
    if not series:
        return 0
    vals = []
    j = -1
    for k in range(samples):
        t = start_s + (end_s - start_s) * k / max(1, samples - 1)
        while j + 1 < len(series) and series[j + 1][0] <= t:
            j += 1
        vals.append(series[j][1] if j >= 0 else 0)
    vals.sort()
    return vals[(len(vals) - 1) // 2]


def time_mean(series: list[tuple[float, int]], start_s: float, end_s: float) -> float | None:
    """Time-weighted mean of a step function |S|(t) over [start_s, end_s] (each value holds until the next).

    Where the plateau reads one level, this says how much of the time a count was reached: on a
    real node whose count moves by several from one sample to the next, the plateau of a short
    window is one draw. None without a value in the window or before it.
    """
    if end_s <= start_s:
        return None
    total = 0.0
    covered = 0.0
    for i, (t, v) in enumerate(series):
        nxt = series[i + 1][0] if i + 1 < len(series) else end_s
        lo, hi = max(t, start_s), min(nxt, end_s)
        if hi > lo:
            total += v * (hi - lo)
            covered += hi - lo
    return total / covered if covered > 0 else None


def converged(series: list[tuple[float, int]]) -> tuple[int | None, float | None]:
    """First round (1-based) after which |S| never changed again; None if it moved last round."""
    if not series:
        return None, None
    last_change = 0
    for i in range(1, len(series)):
        if series[i][1] != series[i - 1][1]:
            last_change = i
    if last_change == len(series) - 1 and len(series) > 1:
        return None, None
    return last_change + 1, series[last_change][0]


SETTLED_MOVE = 0.05
"""A limit moving by less than this (relative) is noise-level trimming, not a change of allocation."""


def limit_move(old: float | None, new: float | None) -> float:
    """How far a limit moved, relative to the larger of the two (setting or clearing one: 1.0)."""
    if old == new:
        return 0.0
    if old is None or new is None:
        return 1.0
    return abs(new - old) / max(old, new)


def rounds_to_settle(rounds: list[tuple[float, float]], after_s: float, move: float = SETTLED_MOVE) -> tuple[int, float]:
    """How many rounds after `after_s` (the last arrival, departure or objective change) still
    moved a limit by more than `move`, and the seconds until the last of them.

    `rounds`: one node's (time, largest relative limit move) per round, in
    time order. Rounds that move nothing (a policy polling for data) do not
    count: a policy that rounds every second is not penalised for rounding
    often, only for moving limits. (0, 0.0): nothing moved after the event
    but in the round that answered it.
    """
    moved = [t for t, m in rounds if t > after_s and m > move]
    if not moved:
        return 0, 0.0
    return len(moved), moved[-1] - after_s


def rounds_after_each_change(rounds: list[tuple[float, float]], changes_s: list[float],
                             move: float = SETTLED_MOVE) -> list[int]:
    """For each change on a node (arrival, departure, objective or curve change), the rounds after
    it, and before the node's next change, that still moved a limit by more than `move`.

    `rounds` as for rounds_to_settle; `changes_s`: the node's change times (several at one
    instant are one change). The round that answers a change (at its instant) is not counted.
    """
    times = sorted(set(changes_s))
    out = []
    for i, at in enumerate(times):
        until = times[i + 1] if i + 1 < len(times) else math.inf
        out.append(sum(1 for t, m in rounds if at < t < until and m > move))
    return out


def settle_summary(logs: Mapping[str, list[tuple[float, float]]], own_moves: Mapping[str, int],
                   changes_s: Mapping[str, list[float]], after_s: float) -> dict[str, float]:
    """A run's settling figures: per node (`logs`: node -> its rounds, as for rounds_to_settle) the
    rounds and seconds after `after_s`; per container the rounds that moved its own limit after its own
    arrival or change (`own_moves`); per change on a node (`changes_s`: node -> change times) the rounds
    before the next."""
    settles = [rounds_to_settle(log, after_s) for log in logs.values() if log]
    per_change = [k for n, log in logs.items() for k in rounds_after_each_change(log, changes_s[n])]
    return {
        "rounds_max": max((r for r, _ in settles), default=0),
        "rounds_mean": round(sum(r for r, _ in settles) / len(settles), 3) if settles else 0.0,
        "seconds_max": round(max((x for _, x in settles), default=0.0), 3),
        "container_rounds_max": max(own_moves.values(), default=0),
        "container_rounds_mean": round(sum(own_moves.values()) / len(own_moves), 3) if own_moves else 0.0,
        "change_rounds_mean": round(sum(per_change) / len(per_change), 3) if per_change else 0.0,
        "change_rounds_max": max(per_change, default=0),
        "changes_settled_within_3": round(sum(1 for k in per_change if k <= 3) / len(per_change), 3)
        if per_change else 1.0,
    }


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def band_chances(mean_log_s: float, sd_log: float, slow_log_s: float, fast_log_s: float) -> tuple[float, float]:
    """(P(met), P(in band)) of one batch whose log latency is normal(mean_log_s, sd_log), for a band
    [fast_log_s, slow_log_s] in log seconds: met below its slow edge, in band between its edges."""
    if sd_log <= 0:
        met = 1.0 if mean_log_s <= slow_log_s else 0.0
        return met, met if mean_log_s >= fast_log_s else 0.0
    met = normal_cdf((slow_log_s - mean_log_s) / sd_log)
    return met, max(0.0, met - normal_cdf((fast_log_s - mean_log_s) / sd_log))


def lower_median_count(chances: list[float]) -> int:
    """Lower median of how many of independent events happen, each with its own chance.

    A run's count is the lower median over time of how many containers are met (or in band) on a
    node (`plateau`); with noise each container is met at a given limit with some chance, so the
    same statistic of an allocation is the lower median of this Poisson-binomial count."""
    dist = [1.0]
    for p in chances:
        p = min(1.0, max(0.0, p))
        nxt = [0.0] * (len(dist) + 1)
        for k, q in enumerate(dist):
            nxt[k] += q * (1 - p)
            nxt[k + 1] += q * p
        dist = nxt
    total = 0.0
    for k, q in enumerate(dist):
        total += q
        if total >= 0.5 - 1e-12:
            return k
    return len(dist) - 1
