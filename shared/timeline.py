"""Timeline files: one experiment run as JSON lines, written by the simulator
(and by recorders of live runs), read by the dashboard.

Each line is an object with a "kind": one "meta" first (scenario, policy,
seed, nodes, containers), then "round" (one node's round: classes, Q values,
interval) and "container" (one container in that round: class, q, limit,
latency, CPU share) lines in time order, and one "result" last (the run's
summary, as `dqoes experiment run --json` prints it). Format version 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

FORMAT_VERSION = 1


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    with tmp.open("wb") as f:
        for row in rows:
            if row.get("kind") == "meta":
                row = {**row, "format": FORMAT_VERSION}
            f.write(orjson.dumps(row))
            f.write(b"\n")
    tmp.replace(p)
    return p


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows of a timeline file; a torn last line (a run still writing) is skipped."""
    with Path(path).open("rb") as f:
        yield from parse_lines(f)


def parse_lines(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON objects among timeline lines; blank, torn or non-object lines are skipped."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            yield row


def run_file_name(scenario: str, policy: str, seed: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in scenario)
    return f"{safe}_{policy}_seed{seed}.jsonl"
