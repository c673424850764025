"""The messages of training jobs (FlowCon), as typed structs; version 3 added them and changed no field
of an older type (their wire contract: `shared.schema`).

Why apart: the training side (services/training, the worker's training loop, placement) builds and
reads only these, and they grow with FlowCon's needs, not with the inference messages'.
"""

from __future__ import annotations

from typing import ClassVar

from shared.checked import Checked
from shared.fields import Count, Count1, Finite, Ident, NonNeg, Positive, Text, UnixS
from shared.messages import Message


class Progress(Message, frozen=True, kw_only=True):
    """Training job -> its worker: the evaluation value E after a step or an epoch.

    `value` is E in the job's own unit (a loss: finite, >= 0); `epoch` and
    `step` count from 0; `cpu_s` is the job's own CPU time so far (0.0: not
    measured); `at` is when it was measured (absent on the wire: the
    envelope's ts). A job whose loss is not finite publishes nothing for that
    step: decoding refuses such a value.
    """

    TYPE: ClassVar[str] = "progress"
    NAME: ClassVar[str] = "progress"
    FROM_TS: ClassVar[str | None] = "at"

    job: Ident
    node: Ident
    value: NonNeg
    epoch: Count
    step: Count = 0
    eval_fn: Text | None = None
    model: Text | None = None
    cpu_s: NonNeg = 0.0
    at: UnixS | None = None


class JobDone(Message, frozen=True, kw_only=True):
    """Training job -> its worker: finished (`ok`) or gave up (`ok` false, `reason`)."""

    TYPE: ClassVar[str] = "job_done"
    NAME: ClassVar[str] = "job_done"

    job: Ident
    node: Ident
    epochs: Count
    duration_s: NonNeg
    value: NonNeg | None = None
    ok: bool = True
    reason: Text = ""


class TrainingJobState(Checked, frozen=True, kw_only=True):
    """One training job in a worker's training state. `limit` is a fraction of the node."""

    NAME: ClassVar[str] = "training_job_state"

    job: Ident
    stage: Text
    model: Text | None = None
    value: NonNeg | None = None
    progress: NonNeg | None = None
    growth: NonNeg | None = None
    cpu_cores: NonNeg | None = None
    limit: Positive | None = None
    stale: bool = False


class TrainingState(Message, frozen=True, kw_only=True):
    """Worker -> manager and dashboard: the training side of a node after a round (Algorithm 4's input).

    `training_share` is the fraction of the node training jobs may use under
    the worker's CPU split (docs/guide/training.md); `alpha` FlowCon's threshold
    (-1: every job completing).
    """

    TYPE: ClassVar[str] = "training_state"
    NAME: ClassVar[str] = "training_state"

    node: Ident
    policy: Text
    cores: Positive
    round: Count
    at: UnixS
    interval_s: Positive
    training_share: Positive
    jobs: tuple[TrainingJobState, ...]
    alpha: Finite | None = None
    free_competition: bool = False


class Launch(Message, frozen=True, kw_only=True):
    """Manager -> worker (request): start training job `job` of `model` on this node."""

    TYPE: ClassVar[str] = "launch"
    NAME: ClassVar[str] = "launch"

    job: Ident
    model: Text
    epochs: Count1 | None = None
    image: Text | None = None
    threads: Count1 | None = None
    seed: Count = 0


class LaunchReply(Message, frozen=True, kw_only=True):
    """Worker -> manager: whether the job started."""

    TYPE: ClassVar[str] = "launch_reply"
    NAME: ClassVar[str] = "launch_reply"

    ok: bool
    node: Ident
    job: Ident
    error: Text = ""
