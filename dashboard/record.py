"""Record a live cluster as a timeline file, so a live run opens in the recorded view.

Why: the recorded view reads the simulator's timeline format
(`shared.timeline`); writing live node states in that same format, with the
same rows the live view draws (`dashboard.data.state_rows`), lets a live run
be looked at again, compared with another, or with a simulated one.

The file is written as it goes (a torn last line is skipped by readers), so
a long recording holds almost nothing in memory. The meta line comes first,
written once the nodes have had `meta_after_s` to say who they are: scenario
"live", the policy, the NATS URL, nodes with their cores and containers with
model and objective. The result line comes last, with the simulator's
measure: the plateau of |S| per node over the final window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from dashboard.data import CONTAINER_COLUMNS, ROUND_COLUMNS, as_dict, state_rows
from dashboard.live import DecisionLog, probe
from shared import auth, subjects
from shared.aio import wait_event
from shared.bus import Bus, BusError, Incoming
from shared.core.measures import plateau
from shared.schema import DecisionMsg, NodeState
from shared.timeline import FORMAT_VERSION

log = logging.getLogger(__name__)

FINAL_WINDOW_S = 120.0


class Recorder:
    """Turns node states and decisions into timeline lines written to `out`.

    Time axis: `t_s` is seconds since `started_at` (unix s).
    """

    def __init__(
        self,
        out: IO[bytes],
        *,
        url: str = "",
        label: str = "live",
        started_at: float | None = None,
        meta_after_s: float = 2.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.out = out
        self.url = url
        self.label = label
        self.wall = wall
        self.started_at = wall() if started_at is None else started_at
        self.meta_after_s = meta_after_s
        self.decisions = DecisionLog()
        self.latest: dict[str, NodeState] = {}
        self.series: dict[str, list[tuple[float, int]]] = {}
        self.met_series: dict[str, list[tuple[float, int]]] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.states = 0
        self.lines = 0
        self._first_state_wall: float | None = None
        self._buffer: list[dict[str, Any]] = []
        self._meta_written = False

    def on_decision(self, msg: DecisionMsg) -> None:
        self.decisions.add(msg)

    def on_state(self, ns: NodeState) -> None:
        self.states += 1
        self.latest[ns.node] = ns
        t_s = ns.at - self.started_at
        d = self.decisions.for_round(ns.node, ns.round)
        round_row, rows = state_rows(
            ns, self.states, t_s, d.listener if d else "", d.event if d else None
        )
        self.series.setdefault(ns.node, []).append((t_s, ns.satisfied))
        if ns.met is not None:
            self.met_series.setdefault(ns.node, []).append((t_s, ns.met))
        for c in ns.containers:
            self.models[c.container] = {
                "model": c.model,
                "objective_s": c.objective_s,
                "node": ns.node,
            }
        self._emit(as_dict(ROUND_COLUMNS, round_row, "round"))
        for r in rows:
            self._emit(as_dict(CONTAINER_COLUMNS, r, "container"))
        if self._first_state_wall is None:
            self._first_state_wall = self.wall()
        self.tick()

    def tick(self) -> None:
        """Write the meta line (and what waited for it) once the nodes had time to show up."""
        if (
            not self._meta_written
            and self._first_state_wall is not None
            and self.wall() - self._first_state_wall >= self.meta_after_s
        ):
            self._write_meta()

    def _emit(self, row: dict[str, Any]) -> None:
        if self._meta_written:
            self._write(row)
        else:
            self._buffer.append(row)

    def _write(self, row: dict[str, Any]) -> None:
        self.out.write(orjson.dumps(row) + b"\n")
        self.lines += 1

    def _write_meta(self) -> None:
        self._meta_written = True
        self._write(self.meta())
        for row in self._buffer:
            self._write(row)
        self._buffer.clear()

    def policy(self) -> str:
        policies = sorted({ns.policy for ns in self.latest.values()})
        return policies[0] if len(policies) == 1 else ", ".join(policies)

    def meta(self) -> dict[str, Any]:
        return {
            "kind": "meta",
            "format": FORMAT_VERSION,
            "scenario": "live",
            "policy": self.policy(),
            "seed": None,
            "label": self.label,
            "nats_url": auth.redact(self.url),
            "started_at": self.started_at,
            "nodes": {n: ns.cores for n, ns in sorted(self.latest.items())},
            "containers": dict(sorted(self.models.items())),
        }

    def result(self, end_t_s: float | None = None) -> dict[str, Any]:
        """The summary: plateaus of met and in band (|S|) per node over the final window, as the simulator
        reports them (met absent when the workers do not report it)."""
        end = end_t_s if end_t_s is not None else self.wall() - self.started_at
        begin = min((s[0][0] for s in self.series.values() if s), default=0.0)
        window = min(FINAL_WINDOW_S, max(0.0, end - begin) / 10)
        start = end - window
        per_node = {n: plateau(self.series.get(n, []), start, end) for n in sorted(self.latest)}
        met = {n: plateau(self.met_series[n], start, end) for n in sorted(self.latest) if n in self.met_series}
        return {
            "kind": "result",
            "scenario": "live",
            "policy": self.policy(),
            "seed": None,
            "label": self.label,
            "containers": sum(len(ns.containers) for ns in self.latest.values()),
            "nodes": len(self.latest),
            **({"met_final": sum(met.values()), "met_per_node": met} if met else {}),
            "satisfied_final": sum(per_node.values()),
            "satisfied_per_node": per_node,
            "satisfied_at_end": sum(ns.satisfied for ns in self.latest.values()),
            "final_window_s": round(window, 3),
            "recorded_s": round(end, 3),
            "states": self.states,
        }

    def finish(self) -> dict[str, Any]:
        if not self._meta_written:
            self._write_meta()
        res = self.result()
        self._write(res)
        self.out.flush()
        return res


async def record(
    url: str,
    out: str | Path,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    label: str = "live",
    connect_timeout_s: float = 5.0,
) -> dict[str, Any]:
    """Record the cluster at `url` into `out` until `duration_s` wall seconds pass or `stop` is set.

    Returns the result line. Raises `shared.bus.BusError` if NATS cannot be reached.
    """
    problem = await asyncio.to_thread(probe, url)
    if problem is not None:  # a refused port is known at once; the client would wait
        raise BusError(f"cannot connect to NATS at {auth.redact(url)} ({problem})")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    bus = await Bus.connect(url, "dqoes-record", connect_timeout_s=connect_timeout_s)
    stop = stop or asyncio.Event()
    with path.open("wb") as f:
        rec = Recorder(f, url=url, label=label)

        def on_state(msg: NodeState, _: Incoming) -> None:
            rec.on_state(msg)

        def on_decision(msg: DecisionMsg, _: Incoming) -> None:
            rec.on_decision(msg)

        try:
            await bus.subscribe(subjects.DECISIONS_ALL, on_decision, expect=DecisionMsg)
            await bus.subscribe(subjects.STATE_ALL, on_state, expect=NodeState)
            log.info("recording %s into %s", url, path)
            t_end = None if duration_s is None else time.monotonic() + duration_s
            while not stop.is_set():
                left = None if t_end is None else t_end - time.monotonic()
                if left is not None and left <= 0:
                    break
                await wait_event(stop, 0.5 if left is None else min(0.5, left))
                rec.tick()
                f.flush()
        finally:
            await bus.close()
            result = rec.finish()
    log.info("recorded %d node states (%d lines) into %s", rec.states, rec.lines, path)
    return result
