"""What every allocation policy is: its parameters, its one method, and how it reports.

Why one module: the worker, the simulator, the CLI, the dashboard and the
benchmarks drive every policy (DQoES, default Swarm, the oracle, our own
allocators) through the same `NodeController`, so a policy is a small thing:
a parameters dataclass, `decide(view) -> Decision`, and `set_params` for an
operator's change at runtime. `build_decision` is the one way a policy turns
its per-container limits into a `Decision`, so the classification every
policy reports (G/S/B, the class sums, |S|) is computed in one place and
policies differ only in the limits they choose.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from shared.core.bounds import MAX_INTERVAL_S, MIN_INTERVAL_S
from shared.core.classification import Classification
from shared.core.profiles import ModelProfile
from shared.core.types import ContainerDecision, Decision, NodeView


def check_open_fraction(value: Any, name: str) -> None:
    """A number strictly between 0 and 1 (alpha, beta)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and 0 < value < 1
    ):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")


def check_interval(value: Any, name: str = "initial_interval_s") -> None:
    """A control interval in seconds: finite, within [MIN_INTERVAL_S, MAX_INTERVAL_S]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and MIN_INTERVAL_S <= value <= MAX_INTERVAL_S
    ):
        raise ValueError(f"{name} must be a number of seconds in [{MIN_INTERVAL_S:g}, {MAX_INTERVAL_S:g}], "
                         f"got {value!r}")


def check_total_resource(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and 0 < value <= 1
    ):
        raise ValueError(f"total_resource must be in (0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class BaseParams:
    """What every policy has: the band it reports by and its (initial) interval."""

    alpha: float = 0.10
    """Tolerance band: a container is in band when |objective - latency| <= alpha * objective."""
    initial_interval_s: float = 10.0
    """Seconds between rounds (the adaptive policies' starting interval)."""

    def __post_init__(self) -> None:
        check_open_fraction(self.alpha, "alpha")
        check_interval(self.initial_interval_s)


class Policy(Protocol):
    """What every allocation policy offers the controller."""

    name: str

    @property
    def params(self) -> Any: ...

    @property
    def alpha(self) -> float: ...

    @property
    def initial_interval_s(self) -> float: ...

    def decide(self, view: NodeView) -> Decision: ...

    def set_params(self, params: Any) -> None: ...

    def wants_round(self, name: str, latency_s: float, now_s: float) -> bool:
        """Asked for every batch between rounds: True makes a round due at once."""


CurveLookup = Callable[[str], ModelProfile | None]
"""A container's latency curve by its name, or None where it is not known."""


def no_curves(name: str) -> ModelProfile | None:
    return None


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may be given besides its parameters.

    `curve_of` looks up a container's latency curve: the simulator and the
    simulated runtime know every one (that knowledge is what makes the oracle
    an oracle); on real runtimes it is a calibrated profile, when the operator
    gives one, or nothing. `noise_sd` is the spread (log sd) of each batch's
    work where it is known, in the simulator; 0 elsewhere.
    """

    curve_of: CurveLookup = no_curves
    noise_sd: float = 0.0


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """One registered policy: how it is named, described, configured and built."""

    name: str
    label: str
    """How people call it on a page or in a table ("DQoES", "default Swarm")."""
    summary: str
    """One line for --help and the dashboard."""
    params_type: type
    """Its parameters dataclass (every field has a default and is validated when built)."""
    factory: Callable[[Any, PolicyContext], Any]
    """(params, context) -> a fresh policy for one node."""
    needs_curves: bool = False
    """True: meaningless without every container's latency curve (the oracle)."""
    kind: str = "inference"
    """What it governs: "inference" (latency objectives, `decide(NodeView)`) or "training"
    (evaluation values, `decide(TrainingView)`, shared/core/training.py)."""
    placement: Callable[..., tuple[str, str]] | None = None
    """Training policies: (worker reports, pending placements) -> (node, why), run on the manager."""


class PolicyBase:
    """The parts every policy shares: `alpha` and `initial_interval_s` read from its params."""

    name = ""
    params: Any

    @property
    def alpha(self) -> float:
        return float(self.params.alpha)

    @property
    def initial_interval_s(self) -> float:
        return float(self.params.initial_interval_s)

    def set_params(self, params: Any) -> None:
        """An operator's change at runtime (validated by the params dataclass itself)."""
        self.params = params

    def wants_round(self, name: str, latency_s: float, now_s: float) -> bool:
        """Most policies wait for their interval (or the controller's own events)."""
        return False


def unknown_params(policy: str, params: Any, asked: Iterable[str]) -> str | None:
    """Why `asked` cannot all be set on `params` (a policy's parameters dataclass, or its type): the
    names it lacks, then the ones it has, in its own order; None when it has them all."""
    names = [f.name for f in dataclasses.fields(params)]
    unknown = sorted(set(asked) - set(names))
    if not unknown:
        return None
    return f"policy {policy} has no parameter {', '.join(unknown)} (it has: {', '.join(names)})"


def numeric_params(params: Any) -> dict[str, float]:
    """A parameters dataclass's numbers by name (switches left out), as a worker publishes them in its
    state and a record keeps them."""
    return {k: float(v) for k, v in dataclasses.asdict(params).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


def decisions_from(
    view: NodeView,
    cl: Classification,
    updates: Mapping[str, tuple[float | None, str]],
    planned: Mapping[str, float] | None = None,
) -> tuple[ContainerDecision, ...]:
    """Join a classification with per-container (new limit, reason) pairs, and the plan's limit of those
    whose new limit is laid over it for one batch (`planned`)."""
    planned = planned or {}
    out = []
    for c in cl.items:
        v = c.view
        new, why = updates[v.name]
        # Positional: this loop is the hot path at 1,000 containers.
        out.append(
            ContainerDecision(
                v.name,
                c.cls,
                c.slack_s,
                v.latency_s if c.fresh else v.last_latency_s,
                v.cpu_share,
                v.limit,
                new,
                why,
                planned.get(v.name),
            )
        )
    return tuple(out)


def build_decision(
    policy: str,
    view: NodeView,
    cl: Classification,
    updates: Mapping[str, tuple[float | None, str]],
    *,
    interval_s: float,
    listener: str = "fixed",
    extra: Mapping[str, float] | None = None,
    planned: Mapping[str, float] | None = None,
) -> Decision:
    """The round's Decision from the classification and each container's (new limit, reason); `planned`:
    the plan's limits of containers whose new limit lasts one batch (ContainerDecision.planned_limit)."""
    return Decision(
        node=view.node,
        now_s=view.now_s,
        policy=policy,
        containers=decisions_from(view, cl, updates, planned),
        slack_sum_g_s=cl.slack_sum_g_s,
        slack_sum_b_s=cl.slack_sum_b_s,
        satisfied=cl.satisfied,
        met=cl.met,
        interval_s=interval_s,
        listener=listener,
        event=view.event,
        extra=dict(extra or {}),
    )
