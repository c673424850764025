"""How a container's finished batches become observations of its curve.

- The cores a batch ran at are its limit when the limit bound it (it used at least BINDING of it),
  else the CPU it actually got (CPU-seconds / latency); threads that follow the limit use only the
  whole cores of a limit above one.
- A container that got less than its limit while the node had idle CPU is saturated: more CPU
  beyond what it used does not help (`sat_cores`).
- The first batch (warm-up, which loads the model) counts WARMUP_WEIGHT; older batches fade by a
  half-life in batches, and a second memory of at least `half_life_s` seconds is used instead
  while it foresees the container's batches better (`weigh_memories`).
- A batch that straddled a limit change is read as the batch it would have been under the new
  limit, or dropped when a limit did not hold it (`observe_straddled`).
- A request server (its source reads a request rate) is observed at its limit, in the cores spare over
  its load (`take_load`): it uses only what its requests cost, so what it leaves unused is no ceiling,
  and the CPU it got says nothing of its latency; its queue does.
Each observation then passes the drift watch (`guards.take`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from shared.core.learned.curve import Curve, Foresight
from shared.core.learned.guards import Spell, take
from shared.core.learned.settings import Memory
from shared.core.types import BatchObs, ContainerView

BINDING = 0.85
"""A batch that used at least this share of its limit was held by it."""
WARMUP_WEIGHT = 0.3
"""The weight of a container's first batch (it loads the model), against 1 for every later one."""
CEILING_MARGIN = 1.05
"""A ceiling is set this much above the CPU rate a batch left its limit at (rates vary batch to batch)."""
BUSY_NODE = 0.9
"""Below this share of the node in use by its managed containers, the node had room for anyone."""
STRADDLE_WEIGHT = 0.5
"""A straddling batch read as under the new limit weighs at most this (times its share under it)."""
LOAD_SMOOTHING = 0.3
"""The weight of the latest window's CPU a request in a request server's running average."""
SPARE_MIN = 0.05
"""A request server's window under a limit less than this share above its load is not placed on its
line: its queue was growing, and the spare cores are too small to be read."""
SWITCH_EVIDENCE = 0.02
"""A container's fit changes memory once the other foresaw its batches better by this share of both
memories' squared errors (about 4 % of the mean squared error)."""


def decay(memory: Memory, latency_s: float) -> tuple[float, float]:
    """What each memory (in batches; in seconds) keeps of its past as one more batch of `latency_s`
    comes in."""
    per_batch = 1.0 / memory.half_life_batches
    return 0.5**per_batch, 0.5 ** (min(per_batch, latency_s / memory.half_life_s)
                                   if memory.half_life_s > 0 else per_batch)


def observe(v: ContainerView, curve: Curve, cores: float, node_busy: float, memory: Memory, horizon_s: float,
            spell_of: Callable[[BatchObs], Spell] | None) -> None:
    """Take a container's batches of this round into its curve. `node_busy`: the managed containers'
    CPU, a fraction of the node; `horizon_s`: how old a memory's foresight may be; `spell_of(b)`: the
    node's spell check for batch b (None: no spell guard)."""
    if v.request_rate_per_s is not None:
        take_load(v, curve, cores)
        observe_windows(v, curve, cores, memory, spell_of)
        return
    for b in v.batches:
        d = decay(memory, b.latency_s)
        spell = spell_of(b) if spell_of is not None else None
        if not b.clean:
            observe_straddled(b, curve, cores, d, spell)
            continue
        weigh_memories(curve, b, cores, d[1], horizon_s)
        curve.timing.last_clean_s = b.finished_at_s
        curve.timing.batch_s = b.latency_s
        got, held, rate = cores_got(b, v, curve, cores)
        if got is None:
            continue
        if held:
            if rate is not None and curve.sat_cores is not None and rate > curve.sat_cores:
                curve.sat_cores = None  # it used more than its ceiling: the ceiling was wrong
        elif rate is not None and b.index > 0:
            limit_cores = batch_limit_cores(b, curve, cores)
            if may_show_ceiling(limit_cores) and had_room(node_busy, cores, limit_cores, rate):
                # It left CPU it could have had unused: a ceiling of its own (a warm-up
                # batch, which loads the model, says nothing about it).
                curve.sat_cores = max(curve.sat_cores or 0.0, rate * CEILING_MARGIN)
        take(curve, math.log(got), math.log(b.latency_s), WARMUP_WEIGHT if b.index == 0 else 1.0, d,
             b.finished_at_s - b.latency_s, spell)


def take_load(v: ContainerView, curve: Curve, cores: float) -> None:
    """A request server's load from its rate and the CPU it used over the last interval: the CPU a
    request costs is averaged over intervals its limit did not bind; the load is the current rate at
    that cost, and at least what it used where its limit bound (its queue then hides the rest)."""
    rate, load = v.request_rate_per_s, curve.load
    if rate is None or v.cpu_share is None:
        return
    used = v.cpu_share * cores
    limit_cores = v.limit * cores if v.limit is not None else cores
    bound = used >= BINDING * limit_cores
    if rate > 0 and used > 0 and not bound:
        per = used / rate
        load.cpu_per_request_s = per if load.cpu_per_request_s is None else (
            LOAD_SMOOTHING * per + (1 - LOAD_SMOOTHING) * load.cpu_per_request_s)
    cores_busy = rate * load.cpu_per_request_s if load.cpu_per_request_s is not None else used
    load.cores = max(cores_busy, used) if bound else cores_busy
    curve.fit = None


def observe_windows(v: ContainerView, curve: Curve, cores: float, memory: Memory,
                    spell_of: Callable[[BatchObs], Spell] | None) -> None:
    """A request server's windows, each at the limit it ran under (the whole node without one), placed
    at the cores spare over its load. A window that straddled a change, or ran with (almost) nothing
    spare, is not placed: it mixes limits, or its queue was still growing."""
    for b in v.batches:
        if not b.clean:
            continue
        limit_cores = batch_limit_cores(b, curve, cores)
        got = cores if limit_cores is None else limit_cores
        spare = got - curve.load.cores
        curve.timing.last_clean_s = b.finished_at_s
        curve.timing.batch_s = b.span_s if b.span_s is not None else b.latency_s
        if spare < SPARE_MIN * got:
            continue
        d = decay(memory, curve.timing.batch_s)
        spell = spell_of(b) if spell_of is not None else None
        take(curve, math.log(spare), math.log(b.latency_s), WARMUP_WEIGHT if b.index == 0 else 1.0, d,
             b.finished_at_s - curve.timing.batch_s, spell)


def observe_straddled(b: BatchObs, curve: Curve, cores: float, decay: tuple[float, float],
                      spell: Spell | None = None) -> None:
    """A batch that ran partly under the previous limit, read as the batch it would have been.

    With t1 seconds under c1 cores and t2 under c2, its work would have taken
    t1 (c1/c2)^k + t2 under c2 alone; c1 is the cores the batch used before the
    change (its CPU-seconds less c2 t2, over t1), not the limit then. Used only when both
    limits held the batch (it used at least BINDING of what it was allowed), weighted by the
    share it spent under the new limit: one batch sooner to see a change. `spell`: as for `take`.
    """
    if b.limit is None or b.prev_limit is None or b.cpu_s is None:
        return
    start = b.finished_at_s - b.latency_s
    t1, t2 = b.since_s - start, b.finished_at_s - b.since_s
    if t1 <= 0 or t2 <= 0:
        return
    c1, c2 = curve.at_limit(b.prev_limit * cores), curve.at_limit(b.limit * cores)
    if b.cpu_s < BINDING * (c1 * t1 + c2 * t2):
        return
    # The first part may itself have run under several limits (a newcomer's share halved twice
    # within one long batch): what it used there, net of the second part, says how many cores it
    # had on average, where the last limit before the change alone would misread it.
    used_before = (b.cpu_s - c2 * t2) / t1
    if used_before <= 0:
        return
    fit = curve.solve()
    k = fit.k if fit is not None else curve.prior.k_mean
    equiv = t1 * (used_before / c2) ** k + t2
    take(curve, math.log(c2), math.log(equiv), STRADDLE_WEIGHT * t2 / b.latency_s, decay, start, spell)


def batch_limit_cores(b: BatchObs, curve: Curve, cores: float) -> float | None:
    """A batch's limit in the cores it can use: threads that follow it use only its whole cores above one."""
    return None if b.limit is None else curve.at_limit(b.limit * cores)


def cores_got(b: BatchObs, v: ContainerView, curve: Curve, cores: float) -> tuple[float | None, bool, float | None]:
    """(the cores a clean batch ran at, whether its limit held it, the CPU rate it used): the limit
    where it held the batch (it used at least BINDING of it), else the rate; None where neither is known."""
    limit_cores = batch_limit_cores(b, curve, cores)
    if v.request_rate_per_s is not None:  # a request server: its limit (or the node) is what counts
        return (cores if limit_cores is None else limit_cores), True, None
    rate = None
    if b.cpu_s is not None:
        rate = b.cpu_s / b.latency_s
    elif v.cpu_share is not None:
        rate = v.cpu_share * cores
    if limit_cores is not None and (rate is None or rate >= BINDING * limit_cores):
        return limit_cores, True, rate
    if rate is not None and rate > 0:
        return rate, False, rate
    return None, False, rate


def may_show_ceiling(limit_cores: float | None) -> bool:
    """Whether a batch that used less than this limit may show a ceiling of the container's own.

    Not under a limit of one core or less: every workload runs at least one thread, which can use a
    whole core, so what it left of such a limit the node held (on a 16-core host at 0.94 busy, a
    ResNet-50 on one thread used 0.94 of a 0.85-core limit in the median batch and under 0.85 of it in
    up to one batch in seven, and read as a ceiling, that judged it unable to reach a band it was in)."""
    return limit_cores is None or limit_cores > 1.0 + 1e-9


def had_room(node_busy: float, cores: float, limit_cores: float | None, rate: float) -> bool:
    """Whether a container that used less than its limit could have had more: the node's managed
    containers (`node_busy`, a fraction of it) were clearly below full, or left idle at least half
    of what it left unused.

    Under limits that sum to at most the node, CFS only starves a container below its quota when
    other work overcommits the node, and then little is idle. A full node (every core handed out)
    with one container held by its own threads below its limit is the case a fixed threshold on
    `node_busy` missed (a 16-core host's run: 0.94 busy, a ResNet-50 on one thread at 1.55 cores of
    limit, never seen as at its ceiling)."""
    if node_busy < BUSY_NODE:
        return True
    return limit_cores is not None and (1.0 - node_busy) * cores >= 0.5 * (limit_cores - rate)


def weigh_memories(curve: Curve, b: BatchObs, cores: float, decay: float, horizon_s: float) -> None:
    """Score both memories on a clean batch under the limit set last, against what each foresaw at
    most `horizon_s` before; the fit follows the one that foresees better, with a margin either way."""
    sw = curve.switch
    seen = sw.foresight
    if seen is None or b.limit is None or not math.isclose(b.limit * cores, seen.cores, rel_tol=1e-4):
        return
    if b.finished_at_s - seen.at_s > horizon_s:
        sw.foresight = foresee(curve, seen.cores, b.finished_at_s)
    y = math.log(b.latency_s)
    short, long = (y - seen.short) ** 2, (y - seen.long) ** 2
    sw.evidence = sw.evidence * decay + short - long
    sw.spread = sw.spread * decay + short + long
    if sw.long_active != (sw.evidence > 0) and abs(sw.evidence) > SWITCH_EVIDENCE * sw.spread:
        sw.long_active = not sw.long_active
        curve.fit = None


def foresee(curve: Curve, cores: float, now_s: float) -> Foresight | None:
    """What each memory expects of the batches at `cores` (None while both are the same memory, or
    either has no fit). The one in use is the curve's own fit, solved once a round already."""
    if curve.sums.long == curve.sums.short:
        return None
    active, other = curve.solve(), curve.solve_memory(not curve.switch.long_active)
    if active is None or other is None:
        return None
    short, long = (other, active) if curve.switch.long_active else (active, other)
    a, b = curve.predict_limit(cores, short), curve.predict_limit(cores, long)
    return None if a is None or b is None else Foresight(cores, a[0], b[0], now_s)
