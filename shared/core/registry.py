"""Every allocation policy, by name: the one place a policy is chosen.

The worker, the simulator, `dqoes experiment`, `dqoes up`, the dashboard and
the benchmarks list and build policies only through this module, so adding a
policy is one module (its parameters dataclass, the policy, a `SPEC`) plus
one line in `SPECS` below (docs/design/architecture.md, "Adding a policy").

Settings reach a policy as a plain mapping (a scenario's `controller` table,
a worker's flags, an operator's control message): each policy takes the
fields its parameters dataclass has and ignores the rest, so one scenario
file configures every policy it is run under, and a bad value is refused by
the dataclass with a message naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from shared.core import baselines, dqoes, flowcon, learned, oracle, training_baseline
from shared.core.policy import Policy, PolicyContext, PolicySpec, unknown_params
from shared.core.training import TrainingPolicy, WorkerReport

SPECS: tuple[PolicySpec, ...] = (
    dqoes.SPEC,
    baselines.SPEC,
    oracle.SPEC,
    learned.SPEC,
)
REGISTRY: dict[str, PolicySpec] = {s.name: s for s in SPECS}

TRAINING_SPECS: tuple[PolicySpec, ...] = (
    flowcon.SPEC,
    training_baseline.SPEC,
)
"""Policies of training jobs (kind "training"): a separate table, so "default" names the
baseline of each kind (no limits, spread placement) without the two colliding."""
TRAINING_REGISTRY: dict[str, PolicySpec] = {s.name: s for s in TRAINING_SPECS}
KINDS = ("inference", "training")


def _table(kind: str) -> dict[str, PolicySpec]:
    if kind == "inference":
        return REGISTRY
    if kind == "training":
        return TRAINING_REGISTRY
    raise ValueError(f"unknown policy kind {kind!r} (choose from {', '.join(KINDS)})")


def names(kind: str = "inference") -> tuple[str, ...]:
    """Registered policy names of one kind, in registration order."""
    return tuple(_table(kind))


def all_names() -> tuple[str, ...]:
    """Every policy name of every kind, once each (for --policy choices)."""
    return tuple(dict.fromkeys([*REGISTRY, *TRAINING_REGISTRY]))


def training_spec(name: str) -> PolicySpec:
    """The registered training policy `name`; ValueError listing the choices if there is none."""
    try:
        return TRAINING_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown training policy {name!r} (choose from {', '.join(TRAINING_REGISTRY)})") from None


def build_training(name: str, settings: Mapping[str, Any] | None = None) -> TrainingPolicy:
    """A fresh training policy for one node; settings it lacks fields for are ignored."""
    s = training_spec(name)
    known = {f.name for f in dataclasses.fields(s.params_type)}
    try:
        params = s.params_type(**{k: v for k, v in (settings or {}).items() if k in known})
    except TypeError as e:
        raise ValueError(f"{name}: {e}") from None
    return s.factory(params, PolicyContext())


def place_training(name: str, reports: Mapping[str, WorkerReport],
                   pending: Mapping[str, int] | None = None) -> tuple[str, str]:
    """Where training policy `name` puts a new job: (node, why). ValueError with no workers."""
    s = training_spec(name)
    assert s.placement is not None
    return s.placement(reports, pending)


def spec(name: str) -> PolicySpec:
    """The registered policy `name`; ValueError listing the choices if there is none."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (choose from {', '.join(REGISTRY)})") from None


def param_names(name: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(spec(name).params_type))


def check_names(name: str, asked: Iterable[str]) -> None:
    """ValueError naming what in `asked` is not one of policy `name`'s parameters (`params_for` ignores
    such names, so that one settings table can serve several policies)."""
    problem = unknown_params(name, spec(name).params_type, asked)
    if problem:
        raise ValueError(problem)


def params_for(name: str, settings: Mapping[str, Any] | None = None) -> Any:
    """Policy `name`'s parameters from `settings` (fields it lacks are ignored). ValueError if bad."""
    s = spec(name)
    known = set(param_names(name))
    try:
        return s.params_type(**{k: v for k, v in (settings or {}).items() if k in known})
    except TypeError as e:  # a wrong type the dataclass could not even compare
        raise ValueError(f"{name}: {e}") from None


def build(name: str, settings: Mapping[str, Any] | None = None, context: PolicyContext | None = None) -> Policy:
    """A fresh policy for one node."""
    return spec(name).factory(params_for(name, settings), context or PolicyContext())


def label(name: str) -> str:
    """How a policy is named for people; an unregistered name (an old recording) as it is."""
    s = REGISTRY.get(name)
    return s.label if s is not None else name


def describe(kind: str = "inference") -> str:
    """One line per policy of a kind, for --help."""
    specs = _table(kind).values()
    width = max(len(s.name) for s in specs)
    return "\n".join(f"  {s.name:<{width}}  {s.summary}" for s in specs)
