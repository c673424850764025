"""The worker's training side: FlowCon (or default) for the node's training containers.

Why beside the inference controller and not inside it: training jobs report a
different signal (evaluation values, `Progress`) and are governed by a
policy of another kind (`registry.names("training")`). A container labelled
`dqoes.kind=training` belongs here; every other managed container stays with
the inference controller. Both share the node; how its CPU is split between
the two kinds (docs/guide/training.md, "Inference and training on one node"):

- `inference-first` (default): inference containers have latency objectives,
  so they keep what their policy gives them; training jobs share the rest.
  Each round the training side reads the inference containers' limits (their
  measured use where they have none), and FlowCon's limits, fractions of
  the training share, become fractions of the node:
  limit_node = limit x training_share, with the training share never below
  one core, so training always moves.
- `shared`: no split; FlowCon's limits are fractions of the whole node.

Bad input never stops the worker: a refused value (NaN, infinite, negative,
missing) or a job going quiet is one log line; the job keeps its list and
limit (shared/core/training.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable

from shared import subjects
from shared.core.training import TrainingDecision, TrainingPolicy, TrainingTracker
from shared.runtime.base import KIND_LABEL, LaunchSpec, Runtime, RuntimeContainer, RuntimeFailure
from shared.scenarios.training import POOL
from shared.schema import (
    JobDone,
    Launch,
    LaunchReply,
    Message,
    Progress,
    TrainingJobState,
    TrainingState,
)

log = logging.getLogger(__name__)

Publish = Callable[[str, Message], Awaitable[None]]
SPLITS = ("inference-first", "shared")
LOG_EVERY_S = 60.0


def is_training(c: RuntimeContainer) -> bool:
    return c.labels.get(KIND_LABEL) == "training"


class TrainingSide:
    """One node's training jobs: a tracker, a training policy, limits through the runtime."""

    def __init__(self, node: str, runtime: Runtime, policy: TrainingPolicy, publish: Publish, *,
                 split: str = "inference-first", stale_after_s: float = 60.0,
                 wall: Callable[[], float] = time.time) -> None:
        if split not in SPLITS:
            raise ValueError(f"training split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.node = node
        self.runtime = runtime
        self.policy = policy
        self.publish = publish
        self.split = split
        self.wall = wall
        self.clock = runtime.now_s
        self.tracker = TrainingTracker(node, runtime.cores, stale_after_s=stale_after_s)
        self.models: dict[str, str | None] = {}
        self.limits: dict[str, float | None] = {}
        self.values: dict[str, float] = {}
        self.next_round_at_s = 0.0
        self.due = False
        self.rounds = 0
        self.refused = 0
        self.training_share = 1.0
        self.last: TrainingDecision | None = None
        self.done: dict[str, JobDone] = {}
        self._last_warned: dict[str, float] = {}

    # -- events -----------------------------------------------------------------

    @property
    def jobs(self) -> tuple[str, ...]:
        return self.tracker.jobs

    def add(self, c: RuntimeContainer) -> bool:
        if not self.tracker.start(c.name, self.clock(), limit=c.limit):
            return False
        self.models[c.name] = c.model
        self.limits[c.name] = c.limit
        self.due = True
        log.info("training job %s joined (%s)", c.name, c.model or "model unknown")
        return True

    def remove(self, name: str) -> bool:
        if not self.tracker.stop(name):
            return False
        self.limits.pop(name, None)
        self.values.pop(name, None)
        self.due = True
        log.info("training job %s left; its CPU is released", name)
        return True

    def on_progress(self, msg: Progress) -> None:
        if msg.node != self.node:
            return
        if msg.job not in self.tracker.jobs:
            # A value from a job the runtime has not reported (or no longer has): not ours to govern.
            self._warn(msg.job, f"progress from {msg.job}, which is not a training job on this node; ignored")
            return
        why = self.tracker.record_value(msg.job, msg.value, self.clock())
        if why is not None:
            self.refused += 1
            self._warn(msg.job, why)
            return
        self.values[msg.job] = msg.value
        if msg.model and not self.models.get(msg.job):
            self.models[msg.job] = msg.model

    def on_done(self, msg: JobDone) -> None:
        if msg.node != self.node:
            return
        self.done[msg.job] = msg
        log.info("training job %s reports done after %d epochs (%.1f s)%s", msg.job, msg.epochs, msg.duration_s,
                 "" if msg.ok else f": {msg.reason}")

    async def launch(self, msg: Launch, nats_url: str, nats_creds: str | None = None) -> LaunchReply:
        """Start a job the manager placed here; the reply says whether it runs (never raises)."""
        def no(error: str) -> LaunchReply:
            log.warning("training job %s not started: %s", msg.job, error)
            return LaunchReply(ok=False, node=self.node, job=msg.job, error=error)

        if msg.model not in POOL:
            return no(f"unknown model {msg.model!r} (choose from {', '.join(POOL)})")
        start = getattr(self.runtime, "launch", None)
        if start is None:
            return no(f"this node's runtime cannot start jobs ({type(self.runtime).__name__})")
        if msg.job in self.tracker.jobs:
            return no(f"a training job named {msg.job} is already running here")
        spec = LaunchSpec(job=msg.job, model=msg.model, nats_url=nats_url, nats_creds=nats_creds, epochs=msg.epochs,
                          threads=msg.threads,
                          seed=msg.seed, image=msg.image)
        try:
            await start(spec)
        except RuntimeFailure as e:
            return no(str(e))
        log.info("training job %s (%s) started on request", msg.job, msg.model)
        return LaunchReply(ok=True, node=self.node, job=msg.job)

    def _warn(self, job: str, text: str) -> None:
        """One log line per job per minute: a job sending garbage every step cannot flood the log."""
        now = self.wall()
        if now - self._last_warned.get(job, -math.inf) >= LOG_EVERY_S:
            self._last_warned[job] = now
            log.warning("%s", text)

    # -- rounds -----------------------------------------------------------------

    def is_due(self, now_s: float) -> bool:
        return bool(self.jobs) and (self.due or now_s >= self.next_round_at_s)

    def wait_s(self, time_scale: float = 1.0) -> float:
        if not self.jobs:
            return math.inf
        return 0.0 if self.due else max(0.0, (self.next_round_at_s - self.clock()) / time_scale)

    def share_for_training(self, inference_reserved: float) -> float:
        """The fraction of the node training may use: what inference leaves, at least one core."""
        if self.split == "shared":
            return 1.0
        floor = min(1.0, 1.0 / self.runtime.cores)
        return max(floor, min(1.0, 1.0 - inference_reserved))

    async def step(self, inference_reserved: float = 0.0) -> TrainingDecision | None:
        now = self.clock()
        if not self.is_due(now):
            return None
        for job in self.tracker.newly_stale(now):
            log.warning("training job %s sent no value for %.0f s: it keeps its list and limit until it reports",
                        job, self.tracker.stale_after_s)
        try:
            totals = await self.runtime.cpu_totals_s()
        except RuntimeFailure as e:
            log.warning("could not read CPU counters: %s", e)
            totals = {}
        now = self.clock()
        view = self.tracker.view(now, {k: v for k, v in totals.items() if k in self.tracker.jobs})
        decision = self.policy.decide(view)
        self.tracker.apply(decision)
        self.training_share = self.share_for_training(inference_reserved)
        self.rounds += 1
        self.due = False
        self.next_round_at_s = now + decision.interval_s
        self.last = decision
        await self._apply(decision)
        await self.publish(subjects.training(self.node), self.state())
        return decision

    def node_limit(self, limit: float | None) -> float | None:
        """A training limit (fraction of the training share) as a fraction of the node."""
        if limit is None:
            return None
        return min(1.0, limit * self.training_share)

    async def _apply(self, d: TrainingDecision) -> None:
        async def one(name: str, new: float | None) -> None:
            if self.limits.get(name) == new:
                return
            try:
                actual = await self.runtime.set_limit(name, new)
            except RuntimeFailure as e:
                log.warning("limit for training job %s not applied: %s", name, e)
                return
            self.limits[name] = actual

        await asyncio.gather(*(one(j.name, self.node_limit(j.new_limit)) for j in d.jobs))

    def state(self) -> TrainingState:
        d = self.last
        jobs = []
        if d is not None:
            for j in d.jobs:
                if j.name not in self.tracker.jobs:
                    continue
                jobs.append(TrainingJobState(
                    job=j.name, stage=j.stage, model=self.models.get(j.name), value=self.values.get(j.name),
                    progress=_ok(j.progress), growth=_ok(j.growth), cpu_cores=_ok(j.cpu_cores),
                    limit=self.limits.get(j.name), stale=self.tracker.is_stale(j.name)))
        known = {j.job for j in jobs}
        for name in self.tracker.jobs:  # joined since the last round
            if name not in known:
                jobs.append(TrainingJobState(job=name, stage="NL" if self.policy.name == "flowcon" else "-",
                                             model=self.models.get(name), limit=self.limits.get(name)))
        return TrainingState(
            node=self.node, policy=self.policy.name, cores=self.runtime.cores, round=self.rounds, at=self.wall(),
            interval_s=d.interval_s if d else self.policy.initial_interval_s,
            training_share=self.training_share, jobs=tuple(jobs),
            alpha=d.alpha if d is not None and d.alpha is not None and math.isfinite(d.alpha) else None,
            free_competition=bool(d and d.free_competition),
        )


def _ok(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) and x >= 0 else None
