"""The manager's part of FlowCon: where a submitted training job goes (Algorithm 4), and starting it.

Why here: placement needs every worker's view, and only the manager has it.
Each worker publishes its training state (`dqoes.training.<node>`) after
every training round; the manager keeps the latest per worker (stale
between rounds, as the paper's heartbeats are) plus the jobs it placed on a
worker since that worker's last report, and asks the configured training
policy's placement (`registry.place_training`: Algorithm 4 for FlowCon,
spread for default) for a node. Then it asks that worker to start the job
(`dqoes.launch.<node>`, request/reply) and answers the client in JSON,
naming the node. Every refusal is `{"ok": false, "error": "..."}` and changes
nothing.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from shared.core import registry
from shared.core.training import JobReport, WorkerReport
from shared.public import parse_submit, target_reply_error, target_reply_ok
from shared.scenarios.training import POOL
from shared.schema import Launch, LaunchReply, SchemaError, TrainingState

log = logging.getLogger(__name__)

LaunchFn = Callable[[str, Launch], Awaitable[LaunchReply]]
"""(node, request) -> the worker's reply; raises TimeoutError/ConnectionError when none comes."""
PENDING_FOR_S = 120.0
"""A placed job not yet in its worker's report counts as pending for at most this long."""


@dataclass
class _Worker:
    report: WorkerReport
    heard_wall_s: float
    pending: dict[str, float] = field(default_factory=dict)
    """Jobs placed here since the last report that did not list them yet: name -> wall time placed."""


class Placer:
    """Training placement on the manager. `policy` is a training policy name (its placement is used)."""

    def __init__(self, policy: str = "flowcon", *, stale_after_s: float = 15.0,
                 wall: Callable[[], float] = time.time) -> None:
        registry.training_spec(policy)
        self.policy = policy
        self.stale_after_s = stale_after_s
        self.wall = wall
        self.workers: dict[str, _Worker] = {}
        self.accepted = 0
        self.rejected = 0
        self._names = itertools.count(1)

    def on_training_state(self, ts: TrainingState) -> None:
        report = WorkerReport(ts.node, ts.at, ts.cores, tuple(
            JobReport(j.job, j.stage, j.growth) for j in ts.jobs))
        w = self.workers.get(ts.node)
        pending = {} if w is None else {n: t for n, t in w.pending.items() if n not in {j.name for j in report.jobs}}
        self.workers[ts.node] = _Worker(report, self.wall(), pending)

    def on_node_alive(self, node: str, cores: float) -> None:
        """A worker with no training report yet (its node state arrived): placeable, with no jobs."""
        w = self.workers.get(node)
        if w is None:
            self.workers[node] = _Worker(WorkerReport(node, self.wall(), cores, ()), self.wall())
        else:
            w.heard_wall_s = max(w.heard_wall_s, self.wall())

    def live(self) -> dict[str, _Worker]:
        now = self.wall()
        out = {}
        for n, w in self.workers.items():
            if now - w.heard_wall_s <= self.stale_after_s:
                w.pending = {j: t for j, t in w.pending.items() if now - t <= PENDING_FOR_S}
                out[n] = w
        return out

    def choose(self, workers: dict[str, _Worker]) -> tuple[str, str]:
        reports = {n: w.report for n, w in workers.items()}
        pending = {n: len(w.pending) for n, w in workers.items()}
        return registry.place_training(self.policy, reports, pending)

    def _job_name(self, model: str, taken: Iterable[str]) -> str:
        used = set(taken)
        while True:
            name = f"{model}-{next(self._names):03d}"
            if name not in used:
                return name

    async def submit(self, payload: bytes, launch: LaunchFn) -> bytes:
        """Handle one `dqoes.submit` request; the JSON reply (never raises)."""
        def no(error: str) -> bytes:
            self.rejected += 1
            log.info("submit refused: %s", error)
            return target_reply_error(error)

        try:
            req = parse_submit(payload)
        except SchemaError as e:
            return no(str(e))
        if req.model not in POOL:
            return no(f"unknown model {req.model!r} (choose from {', '.join(POOL)})")
        workers = self.live()
        if not workers:
            return no("no worker is reporting: nowhere to place a job")
        if req.node is not None:
            if req.node not in workers:
                return no(f"node {req.node!r} is not there (known: {', '.join(sorted(workers)) or 'none'})")
            node, why = req.node, "asked for"
        else:
            node, why = self.choose(workers)
        taken = [j.name for w in workers.values() for j in w.report.jobs] + [p for w in workers.values()
                                                                            for p in w.pending]
        name = req.name or self._job_name(req.model, taken)
        if name in taken:
            return no(f"a job named {name!r} is already running")
        msg = Launch(job=name, model=req.model, epochs=req.epochs, image=req.image, threads=req.threads,
                     seed=req.seed)
        try:
            reply = await launch(node, msg)
        except (TimeoutError, ConnectionError) as e:
            return no(f"worker {node} did not answer the launch request ({e or type(e).__name__})")
        if not reply.ok:
            return no(f"worker {node} refused: {reply.error}")
        workers[node].pending[name] = self.wall()
        self.accepted += 1
        log.info("training job %s (%s) placed on %s by %s: %s", name, req.model, node, self.policy, why)
        return target_reply_ok(job=name, node=node, model=req.model, policy=self.policy, why=why)
