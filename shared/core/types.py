"""Values the control core passes around: what a policy sees and what it decides.

Every policy (DQoES, default Swarm, the oracle, later allocators) is driven by the
same `NodeController` through the same two types, so the live worker and the
simulator can never drift apart: `NodeView` in, `Decision` out.

Units: CPU is a fraction of the node's capacity (1.0 = the whole node, the
paper's T_R), times are seconds, latencies are seconds per batch.

The value types are frozen msgspec Structs: a round at 1,000 containers builds
some 4,000 of them, and a Struct is built in about a fifth of the time of a
frozen dataclass (docs/decisions/msgspec-messages.md). They are built positionally or by
keyword, compared, hashed and copied with `msgspec.structs.replace`.
"""

from __future__ import annotations

import math
from enum import StrEnum

import msgspec


class Cls(StrEnum):
    """DQoES classes: better than the objective, satisfied, worse."""

    G = "G"
    S = "S"
    B = "B"


# Each `Cls.G` is a lookup on the Enum's class (about 0.1 us here); a round at 1,000 containers makes
# several a container, so the hot paths use these.
CLS_G, CLS_S, CLS_B = Cls.G, Cls.S, Cls.B


def classify(objective_s: float, latency_s: float, alpha: float) -> Cls:
    """Algorithm 1, lines 6-15: q = o - p; G if q > alpha*o, B if q < -alpha*o, else S."""
    slack_s = objective_s - latency_s
    if slack_s > alpha * objective_s:
        return CLS_G
    if slack_s < -alpha * objective_s:
        return CLS_B
    return CLS_S


def is_satisfied(objective_s: float | None, latency_s: float | None, alpha: float) -> bool:
    """In band: the latency lies inside the +-alpha band around its objective (the paper's S)."""
    if objective_s is None or latency_s is None:
        return False
    return classify(objective_s, latency_s, alpha) is CLS_S


def is_met(objective_s: float | None, latency_s: float | None, alpha: float) -> bool:
    """Met, as a client counts: the latency is at or under (1 + alpha) x the objective.

    Every in-band container is met; so is one faster than its band (class G).
    """
    if objective_s is None or latency_s is None:
        return False
    return classify(objective_s, latency_s, alpha) is not CLS_B


def workload_of(model: str | None, images: int | None = None) -> str | None:
    """The key replicas share: the model and, once a batch has reported it, the images per batch
    ("resnet50@100"); the model alone ("resnet50") where only a label gives it. None: unknown."""
    if not model:
        return None
    return model if images is None else f"{model}{WORKLOAD_SEP}{images}"


WORKLOAD_SEP = "@"
"""Between the model and the images per batch in a workload key."""


class BatchObs(msgspec.Struct, frozen=True):
    """One finished batch as the controller saw it arrive, stamped when it finished.

    `limit` is the limit in force when it finished (fraction of the node,
    None: none). `clean` is False for a batch that started before the change
    that brought that limit: it ran partly under `prev_limit`, until `since_s`. `index` counts the
    container's batches from 0 (the first ones are warm-up). `cpu_s` is the
    CPU the batch used when the container measured it, else None.
    """

    latency_s: float
    finished_at_s: float
    limit: float | None
    clean: bool
    index: int
    cpu_s: float | None = None
    since_s: float = -math.inf
    """When `limit` came into force (inside the batch when it is not clean; infinite: not known, a
    batch read after two changes that followed its end)."""
    prev_limit: float | None = None
    """The limit before that (what the first part of a straddling batch ran under)."""
    span_s: float | None = None
    """A window's percentile (a polled source): the window it sums up, which is what must lie under
    one limit for it to be clean; None: a batch, whose span is its latency."""


def check_fraction(value: float | None, what: str, *, allow_zero: bool = False) -> None:
    """Reject a CPU fraction that is not a finite number in (0, 1] (or [0, 1])."""
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero) or value > 1.0:
        raise ValueError(f"{what} must be a fraction of the node in (0, 1], got {value!r}")


class ContainerView(msgspec.Struct, frozen=True):
    """One managed container as the controller sees it at the start of a round.

    `latency_s` is the latest batch latency completed since the previous round
    (None: no new batch). `last_latency_s` and `prev_cls` carry what was known
    before, so a container without a new batch keeps its class.
    `cpu_share` is the CPU it used over the last interval (fraction of the node),
    None before there are two counter readings.
    """

    name: str
    objective_s: float
    alpha: float
    latency_s: float | None
    last_latency_s: float | None
    cpu_share: float | None
    limit: float | None
    prev_cls: Cls | None = None
    prev_slack_s: float | None = None
    batches: tuple[BatchObs, ...] = ()
    """Every batch finished since the previous round, oldest first (the latest is `latency_s`)."""
    workload: str | None = None
    """What it runs, as its batches report it (model and images per batch): containers with the same
    workload on a node are replicas. None: not reported."""
    follows_limit: bool = False
    """Its intra-op threads follow its limit (max(1, floor(limit cores))), as its batches report: above
    one core, only whole cores add threads."""
    request_rate_per_s: float | None = None
    """Requests a second in its latest window, where it serves requests (a polled source reads the rate
    beside the percentile); None: a batch workload."""


class NodeView(msgspec.Struct, frozen=True):
    """Everything a policy may look at for one node and one round."""

    node: str
    cores: float
    now_s: float
    containers: tuple[ContainerView, ...]
    # Why the round runs now rather than on its interval: "added", "removed",
    # "objective", or None for a scheduled round.
    event: str | None = None


class ContainerDecision(msgspec.Struct, frozen=True):
    """What a round concluded for one container. `cls` None: no batch yet (pending)."""

    name: str
    cls: Cls | None
    slack_s: float | None
    latency_s: float | None
    cpu_share: float | None
    old_limit: float | None
    new_limit: float | None
    reason: str
    planned_limit: float | None = None
    """The limit its plan holds where `new_limit` lays a move for the rest of one batch over it (a late
    batch's rescue, or CPU lent to one); None: the plan is `new_limit`. Settling is read on plans."""

    @property
    def plan(self) -> float | None:
        return self.new_limit if self.planned_limit is None else self.planned_limit

    @property
    def changed(self) -> bool:
        return self.old_limit != self.new_limit


class Decision(msgspec.Struct, frozen=True):
    """One round's outcome on one node; `interval_s` is the delay to the next round."""

    node: str
    now_s: float
    policy: str
    containers: tuple[ContainerDecision, ...]
    slack_sum_g_s: float
    slack_sum_b_s: float
    satisfied: int
    interval_s: float
    listener: str = ""
    event: str | None = None
    extra: dict[str, float] = msgspec.field(default_factory=dict)
    met: int = 0
    """Containers at or under (1 + alpha) x their objective (S and G)."""

    @property
    def counts(self) -> dict[str, int]:
        out = {"G": 0, "S": 0, "B": 0, "pending": 0}
        for c in self.containers:
            out[c.cls.value if c.cls else "pending"] += 1
        return out

    @property
    def changes(self) -> tuple[ContainerDecision, ...]:
        return tuple(c for c in self.containers if c.changed)
