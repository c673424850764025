"""Scenarios: the cluster, the models and the containers of one experiment.

A scenario is plain data (frozen dataclasses). It comes from a built-in (the
paper's six experiments, see `shared.scenarios.builtin`) or from a user's TOML/JSON
file whose schema is docs/reference/scenarios.md. Loading validates everything and
reports the first problem as one line naming the field, so a typo never
becomes a traceback or, worse, a silently different experiment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shared.core import registry
from shared.core.dqoes import DQoESParams
from shared.core.profiles import BUILTIN_PROFILES, ModelProfile


class ScenarioError(ValueError):
    """A scenario that cannot be run; the message names the field."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cores: float


@dataclass(frozen=True, slots=True)
class Change:
    """Something that happens to a running container at `at_s` (scenario seconds).

    `objective_s`: a client sets a new objective. `work_factor`: the
    container's latency curve changes: every batch from then on needs this
    many times its profile's CPU work (a noisy neighbour, a heavier input mix;
    1.0 is the profile itself). Either or both.
    """

    at_s: float
    objective_s: float | None = None
    work_factor: float | None = None


@dataclass(frozen=True, slots=True)
class NodeSpells:
    """Spells in which every container on a node runs slower at the CPU it gets (memory bandwidth,
    caches or another tenant shared by the whole host): on each node, independently, they start
    after gaps drawn exponentially with mean `every_s`, last a duration and slow every batch's
    progress by a factor, each drawn uniformly from its range (docs/design/simulator.md)."""

    every_s: float
    duration_s: tuple[float, float]
    factor: tuple[float, float]

    def schedule(self, seed: int | None, node: str, end_s: float) -> tuple[tuple[float, float, float], ...]:
        """(start, end, factor) of each spell on `node` before `end_s`, drawn from (seed, node) alone,
        one after another, never overlapping."""
        rng = random.Random(f"spells:{seed}:{node}")
        out = []
        t = rng.expovariate(1.0 / self.every_s)
        while t < end_s:
            length = rng.uniform(*self.duration_s)
            out.append((t, t + length, rng.uniform(*self.factor)))
            t += length + rng.expovariate(1.0 / self.every_s)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    name: str
    model: str
    objective_s: float | None
    submit_at_s: float = 0.0
    node: str | None = None
    duration_s: float | None = None
    threads: int | None = None
    cpus: float | None = None
    """Initial CPU limit in cores (like `docker run --cpus`); None: none."""
    alpha: float | None = None
    changes: tuple[Change, ...] = ()
    """What happens to it later, in time order."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    nodes: tuple[NodeSpec, ...]
    containers: tuple[ContainerSpec, ...]
    profiles: Mapping[str, ModelProfile]
    duration_s: float
    controller: DQoESParams = field(default_factory=DQoESParams)
    """The DQoES parameters the scenario implies (its `settings` over the defaults): the band
    and T_R every measure of the run uses."""
    noise_sigma: float = 0.03
    noise_rho: float = 0.0
    """Lag-one correlation of a container's log noise from batch to batch (0: independent)."""
    node_spells: NodeSpells | None = None
    """Slow spells common to all of a node's containers; None: none."""
    description: str = ""
    seed: int | None = None
    objective_rule: str = ""
    """How random objectives were drawn, for the record."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The `controller` table as the file gave it: policy parameters by name. Every policy the
    scenario runs under takes the fields it has (`shared.core.registry.params_for`); a field
    not given keeps each policy's own default."""

    def policy_settings(self) -> dict[str, Any]:
        """What every policy run on this scenario is configured with: the `controller` table, and
        any DQoES parameter set in code rather than in a file (a built-in's `controller`)."""
        out = dict(self.settings)
        for f in dataclasses.fields(DQoESParams):
            v = getattr(self.controller, f.name)
            if f.name not in out and v != f.default:
                out[f.name] = v
        return out

    def profile_of(self, c: ContainerSpec) -> ModelProfile:
        p = self.profiles[c.model]
        return p.with_threads(c.threads) if c.threads is not None else p

    def spells_of(self, node: str, seed: int | None) -> tuple[tuple[float, float, float], ...]:
        """The slow spells of `node` in a run of this scenario with `seed` ((start, end, factor))."""
        return () if self.node_spells is None else self.node_spells.schedule(seed, node, self.duration_s)

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


# -- random objectives -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectiveRule:
    """Random objectives relative to each model's fastest-possible latency.

    As the paper does, each model is first "run alone owning the node": its
    fastest latency f. With probability `unachievable_fraction` the objective is
    f * U(low_unachievable, 1), below f and unachievable even alone; otherwise
    f * U(1, high), achievable alone, and whether it is achievable among the
    others depends on them and on the policy.
    """

    unachievable_fraction: float = 0.2
    low_unachievable: float = 0.5
    high: float = 20.0

    def draw(self, fastest_s: float, rng: random.Random) -> float:
        if rng.random() < self.unachievable_fraction:
            k = rng.uniform(self.low_unachievable, 1.0)
        else:
            k = rng.uniform(1.0, self.high)
        return round(fastest_s * k, 1)

    def describe(self) -> str:
        return (
            f"objective = fastest-alone latency x k; k ~ U({self.low_unachievable}, 1) "
            f"with probability {self.unachievable_fraction} (unachievable), else k ~ U(1, {self.high})"
        )


# -- parsing -----------------------------------------------------------------


def _get(d: Mapping[str, Any], key: str, where: str, *, required: bool = True, default: Any = None) -> Any:
    if key not in d:
        if required:
            raise ScenarioError(f"{where}{key}: missing required field")
        return default
    return d[key]


def _num(v: Any, path: str, *, positive: bool = False, nonneg: bool = False, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ScenarioError(f"{path}: must be a number, got {v!r}")
    if not math.isfinite(v):
        raise ScenarioError(f"{path}: must be finite, got {v!r}")
    if integer and int(v) != v:
        raise ScenarioError(f"{path}: must be an integer, got {v!r}")
    if positive and v <= 0:
        raise ScenarioError(f"{path}: must be > 0, got {v!r}")
    if nonneg and v < 0:
        raise ScenarioError(f"{path}: must be >= 0, got {v!r}")
    return int(v) if integer else float(v)


def _str(v: Any, path: str) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ScenarioError(f"{path}: must be a non-empty string, got {v!r}")
    return v


def _check_keys(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ScenarioError(f"{where}{k}: unknown field (allowed: {', '.join(sorted(allowed))})")


def parse_controller(d: Mapping[str, Any], where: str = "controller.") -> tuple[DQoESParams, dict[str, Any]]:
    """The controller table: parameters of any registered policy, by name, each validated.

    Returns the DQoES parameters it implies and the table itself (what other
    policies read their own fields from).
    """
    if not isinstance(d, Mapping):
        raise ScenarioError(f"{where.rstrip('.')}: must be a table")
    allowed = {f for n in registry.names() for f in registry.param_names(n)}
    _check_keys(d, allowed, where)
    settings: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, str | bool):
            settings[k] = v
        else:
            settings[k] = _num(v, where + k)
    for name in registry.names():
        try:
            registry.params_for(name, settings)
        except ValueError as e:
            raise ScenarioError(f"{where.rstrip('.')}: {e}") from None
    return registry.params_for("dqoes", settings), settings


def parse_profile(d: Mapping[str, Any], where: str) -> ModelProfile:
    allowed = {"name", "work_cpu_s", "threads", "overhead_s", "efficiency", "warmup_factor",
               "batch_images", "resolution_px", "source", "follows_limit"}
    _check_keys(d, allowed, where)
    follows = d.get("follows_limit", False)
    if not isinstance(follows, bool):
        raise ScenarioError(f"{where}follows_limit: must be true or false, got {follows!r}")
    name = _str(_get(d, "name", where), where + "name")
    eff = d.get("efficiency", [])
    if not isinstance(eff, list) or not all(isinstance(p, list | tuple) and len(p) == 2 for p in eff):
        raise ScenarioError(f"{where}efficiency: must be a list of [limit_cores, multiplier] pairs")
    pts = tuple(
        (_num(a, f"{where}efficiency[{i}][0]", positive=True), _num(b, f"{where}efficiency[{i}][1]", positive=True))
        for i, (a, b) in enumerate(eff)
    )
    try:
        return ModelProfile(
            name=name,
            work_cpu_s=_num(_get(d, "work_cpu_s", where), where + "work_cpu_s", positive=True),
            threads=int(_num(d.get("threads", 1), where + "threads", positive=True, integer=True)),
            overhead_s=_num(d.get("overhead_s", 0.0), where + "overhead_s", nonneg=True),
            efficiency=pts,
            warmup_factor=_num(d.get("warmup_factor", 1.0), where + "warmup_factor", positive=True),
            batch_images=int(_num(d.get("batch_images", 100), where + "batch_images", positive=True, integer=True)),
            resolution_px=int(_num(d.get("resolution_px", 224), where + "resolution_px", positive=True, integer=True)),
            source=str(d.get("source", "scenario file")),
            follows_limit=follows,
        )
    except ValueError as e:
        raise ScenarioError(f"{where.rstrip('.')}: {e}") from None


def parse_profiles(data: Mapping[str, Any], where: str = "") -> dict[str, ModelProfile]:
    """The `models` of a profiles file (what `dqoes calibrate` writes), validated, by name.

    A profiles file holds `models` (the same tables as a scenario's) and may
    hold a `calibration` record and a `description`, which are not read here.
    """
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}profiles: the document must be a table/object")
    _check_keys(data, {"models", "calibration", "description"}, where)
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise ScenarioError(f"{where}models: a profiles file needs a non-empty list of model tables")
    out: dict[str, ModelProfile] = {}
    for i, m in enumerate(models):
        if not isinstance(m, Mapping):
            raise ScenarioError(f"{where}models[{i}]: must be a table")
        p = parse_profile(m, f"{where}models[{i}].")
        out[p.name] = p
    return out


def _read_document(p: Path) -> Any:
    try:
        text = p.read_bytes()
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read ({e.strerror})") from None
    try:
        if p.suffix.lower() == ".json":
            return json.loads(text)
        return tomllib.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        kind = "JSON" if p.suffix.lower() == ".json" else "TOML"
        raise ScenarioError(f"{p}: not valid {kind}: {str(e).splitlines()[0]}") from None


def load_profiles_file(path: str | Path) -> dict[str, ModelProfile]:
    """Model profiles from a TOML/JSON profiles file (e.g. written by `dqoes calibrate --out`)."""
    p = Path(path)
    return parse_profiles(_read_document(p), f"{p}: ")


def parse_scenario(
    data: Mapping[str, Any],
    *,
    seed: int | None = None,
    base_profiles: Mapping[str, ModelProfile] = BUILTIN_PROFILES,
    default_name: str = "scenario",
    base_dir: str | Path | None = None,
) -> Scenario:
    """Build and validate a scenario from a decoded TOML/JSON document.

    Profiles: `base_profiles`, then those of the file named by `profiles`
    (relative to `base_dir`), then the document's own `models`.
    """
    if not isinstance(data, Mapping):
        raise ScenarioError("scenario: the document must be a table/object")
    _check_keys(
        data,
        {"name", "description", "duration_s", "noise_sigma", "noise_rho", "node_spells", "seed", "controller", "nodes",
         "models", "containers", "generate", "objective_rule", "profiles"},
        "",
    )
    name = _str(data.get("name", default_name), "name")
    duration = _num(_get(data, "duration_s", ""), "duration_s", positive=True)
    sigma = _num(data.get("noise_sigma", 0.03), "noise_sigma", nonneg=True)
    rho = _num(data.get("noise_rho", 0.0), "noise_rho", nonneg=True)
    if rho >= 1.0:
        raise ScenarioError(f"noise_rho: must be < 1 (a lag-one correlation), got {rho!r}")
    spells = _parse_spells(data["node_spells"]) if "node_spells" in data else None
    if seed is None and "seed" in data:
        seed = int(_num(data["seed"], "seed", integer=True))
    controller, settings = parse_controller(data.get("controller", {}))

    profiles: dict[str, ModelProfile] = dict(base_profiles)
    if "profiles" in data:
        ref = _str(data["profiles"], "profiles")
        path = Path(ref) if base_dir is None else Path(base_dir) / ref
        try:
            profiles.update(load_profiles_file(path))
        except ScenarioError as e:
            raise ScenarioError(f"profiles: {e}") from None
    models = data.get("models", [])
    if not isinstance(models, list):
        raise ScenarioError("models: must be a list of model tables")
    for i, m in enumerate(models):
        if not isinstance(m, Mapping):
            raise ScenarioError(f"models[{i}]: must be a table")
        p = parse_profile(m, f"models[{i}].")
        profiles[p.name] = p

    raw_nodes = _get(data, "nodes", "")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ScenarioError("nodes: must be a non-empty list of node tables")
    nodes: list[NodeSpec] = []
    for i, n in enumerate(raw_nodes):
        w = f"nodes[{i}]."
        if not isinstance(n, Mapping):
            raise ScenarioError(f"nodes[{i}]: must be a table")
        _check_keys(n, {"name", "cores"}, w)
        nodes.append(NodeSpec(_str(_get(n, "name", w), w + "name"), _num(_get(n, "cores", w), w + "cores", positive=True)))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ScenarioError("nodes: node names must be unique")

    containers: list[ContainerSpec] = []
    raw = data.get("containers", [])
    if not isinstance(raw, list):
        raise ScenarioError("containers: must be a list of container tables")
    for i, c in enumerate(raw):
        if not isinstance(c, Mapping):
            raise ScenarioError(f"containers[{i}]: must be a table")
        containers.append(_parse_container(c, f"containers[{i}].", profiles, nodes, duration))

    rule_text = str(data.get("objective_rule", ""))
    if "generate" in data:
        gen = data["generate"]
        if not isinstance(gen, Mapping):
            raise ScenarioError("generate: must be a table")
        extra, rule_text = _generate(gen, profiles, nodes, seed, start=len(containers))
        containers.extend(extra)

    if not containers:
        raise ScenarioError("containers: the scenario has no containers (give containers or generate)")
    cnames = [c.name for c in containers]
    dup = {x for x in cnames if cnames.count(x) > 1}
    if dup:
        raise ScenarioError(f"containers: duplicate container name {sorted(dup)[0]!r}")
    return Scenario(
        name=name,
        nodes=tuple(nodes),
        containers=tuple(containers),
        profiles=profiles,
        duration_s=duration,
        controller=controller,
        settings=settings,
        noise_sigma=sigma,
        noise_rho=rho,
        node_spells=spells,
        description=str(data.get("description", "")),
        seed=seed,
        objective_rule=rule_text,
    )


def _parse_spells(d: Any) -> NodeSpells:
    w = "node_spells."
    if not isinstance(d, Mapping):
        raise ScenarioError("node_spells: must be a table")
    _check_keys(d, {"every_s", "duration_s", "factor"}, w)
    every = _num(_get(d, "every_s", w), w + "every_s", positive=True)

    def span(key: str, low: float) -> tuple[float, float]:
        v = _get(d, key, w)
        if not isinstance(v, list | tuple) or len(v) != 2:
            raise ScenarioError(f"{w}{key}: must be [low, high]")
        lo, hi = (_num(x, f"{w}{key}", positive=True) for x in v)
        if not low <= lo <= hi:
            raise ScenarioError(f"{w}{key}: must be [low, high] with {low} <= low <= high, got {list(v)!r}")
        return lo, hi

    return NodeSpells(every, span("duration_s", 0.0), span("factor", 1.0))


def _parse_container(
    c: Mapping[str, Any], w: str, profiles: Mapping[str, ModelProfile], nodes: Sequence[NodeSpec], duration: float
) -> ContainerSpec:
    _check_keys(c, {"name", "model", "objective_s", "submit_at_s", "node", "duration_s", "threads", "cpus", "alpha",
                    "changes"}, w)
    name = _str(_get(c, "name", w), w + "name")
    model = _str(_get(c, "model", w), w + "model")
    if model not in profiles:
        raise ScenarioError(f"{w}model: unknown model {model!r} (known: {', '.join(sorted(profiles))})")
    obj = c.get("objective_s")
    objective = None if obj is None else _num(obj, w + "objective_s", positive=True)
    submit = _num(c.get("submit_at_s", 0.0), w + "submit_at_s", nonneg=True)
    if submit >= duration:
        raise ScenarioError(f"{w}submit_at_s: {submit} is not before the end of the run ({duration} s)")
    node = c.get("node")
    node_names = [n.name for n in nodes]
    if node is not None:
        node = _str(node, w + "node")
        if node not in node_names:
            raise ScenarioError(f"{w}node: unknown node {node!r} (nodes: {', '.join(node_names)})")
    dur = c.get("duration_s")
    dur_v = None if dur is None else _num(dur, w + "duration_s", positive=True)
    threads = c.get("threads")
    threads_v = None if threads is None else int(_num(threads, w + "threads", positive=True, integer=True))
    cpus = c.get("cpus")
    cpus_v = None if cpus is None else _num(cpus, w + "cpus", positive=True)
    if cpus_v is not None:
        room = nodes[node_names.index(node)].cores if node else max(n.cores for n in nodes)
        where = f"node {node}" if node else "the largest node"
        if cpus_v > room:
            raise ScenarioError(f"{w}cpus: {cpus_v:g} cores requested but {where} has only {room:g}")
    alpha = c.get("alpha")
    alpha_v = None
    if alpha is not None:
        alpha_v = _num(alpha, w + "alpha", positive=True)
        if alpha_v >= 1:
            raise ScenarioError(f"{w}alpha: must be in (0, 1), got {alpha_v!r}")
    raw_changes = c.get("changes", [])
    if not isinstance(raw_changes, list):
        raise ScenarioError(f"{w}changes: must be a list of tables with at_s and objective_s and/or work_factor")
    changes = []
    for i, ch in enumerate(raw_changes):
        cw = f"{w}changes[{i}]."
        if not isinstance(ch, Mapping):
            raise ScenarioError(f"{w}changes[{i}]: must be a table")
        _check_keys(ch, {"at_s", "objective_s", "work_factor"}, cw)
        at = _num(_get(ch, "at_s", cw), cw + "at_s", nonneg=True)
        if at < submit:
            raise ScenarioError(f"{cw}at_s: {at:g} is before the container is submitted ({submit:g} s)")
        obj_v = None if ch.get("objective_s") is None else _num(ch["objective_s"], cw + "objective_s", positive=True)
        wf = None if ch.get("work_factor") is None else _num(ch["work_factor"], cw + "work_factor", positive=True)
        if obj_v is None and wf is None:
            raise ScenarioError(f"{cw[:-1]}: give objective_s and/or work_factor")
        changes.append(Change(at, obj_v, wf))
    changes.sort(key=lambda x: x.at_s)
    return ContainerSpec(name, model, objective, submit, node, dur_v, threads_v, cpus_v, alpha_v, tuple(changes))


def _generate(
    gen: Mapping[str, Any], profiles: Mapping[str, ModelProfile], nodes: Sequence[NodeSpec], seed: int | None, start: int
) -> tuple[list[ContainerSpec], str]:
    w = "generate."
    _check_keys(gen, {"containers", "models", "submit_window_s", "submit_every_s", "threads",
                      "unachievable_fraction", "objective_factor_max", "prefix"}, w)
    count = int(_num(_get(gen, "containers", w), w + "containers", positive=True, integer=True))
    models = gen.get("models", ["resnet50"])
    if not isinstance(models, list) or not models:
        raise ScenarioError(f"{w}models: must be a non-empty list of model names")
    for i, m in enumerate(models):
        if m not in profiles:
            raise ScenarioError(f"{w}models[{i}]: unknown model {m!r} (known: {', '.join(sorted(profiles))})")
    window = gen.get("submit_window_s", [0, 0])
    if not (isinstance(window, list) and len(window) == 2):
        raise ScenarioError(f"{w}submit_window_s: must be [start, end]")
    lo = _num(window[0], w + "submit_window_s[0]", nonneg=True)
    hi = _num(window[1], w + "submit_window_s[1]", nonneg=True)
    if hi < lo:
        raise ScenarioError(f"{w}submit_window_s: end {hi} is before start {lo}")
    every = gen.get("submit_every_s")
    every_v = None if every is None else _num(every, w + "submit_every_s", nonneg=True)
    threads = gen.get("threads")
    threads_v = None if threads is None else int(_num(threads, w + "threads", positive=True, integer=True))
    uf = _num(gen.get("unachievable_fraction", 0.2), w + "unachievable_fraction", nonneg=True)
    if uf > 1:
        raise ScenarioError(f"{w}unachievable_fraction: must be in [0, 1], got {uf}")
    rule = ObjectiveRule(unachievable_fraction=uf, high=_num(gen.get("objective_factor_max", 20.0), w + "objective_factor_max", positive=True))
    prefix = str(gen.get("prefix", "c"))
    specs = generate_containers(
        count, list(models), profiles, nodes, seed if seed is not None else 1,
        submit_window_s=(lo, hi), submit_every_s=every_v, threads=threads_v, rule=rule, prefix=prefix, start=start,
    )
    return specs, rule.describe()


def generate_containers(
    count: int,
    models: Sequence[str],
    profiles: Mapping[str, ModelProfile],
    nodes: Sequence[NodeSpec],
    seed: int,
    *,
    submit_window_s: tuple[float, float] = (0.0, 0.0),
    submit_every_s: float | None = None,
    threads: int | None = None,
    rule: ObjectiveRule | None = None,
    prefix: str = "c",
    start: int = 0,
) -> list[ContainerSpec]:
    """Random models, objectives and submission times, reproducible from the seed.

    The fastest-alone latency is taken on the smallest node, where a container
    may land under spread placement.
    """
    rule = rule or ObjectiveRule()
    rng = random.Random(f"generate:{seed}")
    cores = min(n.cores for n in nodes)
    out = []
    for i in range(count):
        model = models[rng.randrange(len(models))]
        p = profiles[model]
        if threads is not None:
            p = p.with_threads(threads)
        objective = rule.draw(p.fastest_s(cores), rng)
        if submit_every_s is not None:
            submit = submit_window_s[0] + i * submit_every_s
        else:
            submit = round(rng.uniform(*submit_window_s), 2)
        out.append(ContainerSpec(f"{prefix}{start + i + 1:02d}", model, objective, submit, threads=threads))
    return out


def load_scenario_file(
    path: str | Path, seed: int | None = None, base_profiles: Mapping[str, ModelProfile] = BUILTIN_PROFILES
) -> Scenario:
    p = Path(path)
    return parse_scenario(_read_document(p), seed=seed, default_name=p.stem, base_profiles=base_profiles,
                          base_dir=p.parent)


def with_seed(s: Scenario, seed: int) -> Scenario:
    return replace(s, seed=seed)


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """The file form of a scenario (parse_scenario reads it back to an equal Scenario).

    Generated containers are written out one by one, so the file describes
    the run exactly, whatever the seed it is loaded with.
    """
    out: dict[str, Any] = {
        "name": s.name,
        "description": s.description,
        "duration_s": s.duration_s,
        "noise_sigma": s.noise_sigma,
        "controller": s.policy_settings(),
        "nodes": [{"name": n.name, "cores": n.cores} for n in s.nodes],
        "models": [
            {"name": m.name, "work_cpu_s": m.work_cpu_s, "threads": m.threads, "overhead_s": m.overhead_s,
             "efficiency": [list(pt) for pt in m.efficiency], "warmup_factor": m.warmup_factor,
             "batch_images": m.batch_images, "resolution_px": m.resolution_px, "source": m.source,
             **({"follows_limit": True} if m.follows_limit else {})}
            for m in s.profiles.values()
        ],
        "containers": [],
    }
    if s.noise_rho:
        out["noise_rho"] = s.noise_rho
    if s.node_spells is not None:
        sp = s.node_spells
        out["node_spells"] = {"every_s": sp.every_s, "duration_s": list(sp.duration_s), "factor": list(sp.factor)}
    if s.seed is not None:
        out["seed"] = s.seed
    if s.objective_rule:
        out["objective_rule"] = s.objective_rule
    for c in s.containers:
        d: dict[str, Any] = {"name": c.name, "model": c.model, "submit_at_s": c.submit_at_s}
        for k in ("objective_s", "node", "duration_s", "threads", "cpus", "alpha"):
            v = getattr(c, k)
            if v is not None:
                d[k] = v
        if c.changes:
            d["changes"] = [
                {k: v for k, v in (("at_s", ch.at_s), ("objective_s", ch.objective_s), ("work_factor", ch.work_factor))
                 if v is not None}
                for ch in c.changes
            ]
        out["containers"].append(d)
    return out
