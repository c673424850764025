"""Which objective governs each container, and which containers there are.

Objectives reach a worker three ways: a container's own (the manager's
hand-over for it), its service's (a selector every matching container follows)
and its labels. This layer takes the manager's hand-overs, follows containers
as the runtime starts and stops them, resolves the objective in force for each
(own > service > label, `shared.core.objectives.resolve`) and gives it to the
controller; a container that loses its objective has its limit released by the
next round (rounds.py).
"""

from __future__ import annotations

from typing import Literal

from services.worker.base import WorkerBase, as_fraction, log
from services.worker.statefiles import save_originals
from services.worker.training import is_training
from shared.core.objectives import BatchWindow, Objective, resolve
from shared.core.types import workload_of
from shared.runtime.base import RuntimeContainer, RuntimeEvent
from shared.schema import ObjectiveAssign, ServiceObjective


class Governing(WorkerBase):
    """The worker's objectives and containers: hand-overs in, the objective in force out."""

    def on_objective(self, msg: ObjectiveAssign) -> None:
        """A hand-over from the manager; revisions only move forward, except when the manager insists.

        A lower revision than the one held is an old message arriving late and
        is ignored, once. The manager re-sends what its store holds while the
        worker reports something else, so the same lower revision arriving a
        second time means the store says so: the worker takes it (a revision
        from nowhere, such as a forged 2^62, cannot freeze an objective).
        """
        prev = self.assigned.get(msg.container)
        if prev is not None and msg.revision < prev.revision:
            key = (msg.container, msg.revision)
            if key not in self._stale_seen:
                self._stale_seen[key] = msg
                if len(self._stale_seen) > 4096:  # bounded: the oldest go first
                    del self._stale_seen[next(iter(self._stale_seen))]
                log.debug("ignoring stale objective for %s (revision %d < %d)",
                          msg.container, msg.revision, prev.revision)
                return
            self.refusals.log("objective-back", "objective for %s taken back to revision %d (held %d): "
                              "the manager's store says so", msg.container, msg.revision, prev.revision)
        self._stale_seen.pop((msg.container, msg.revision), None)
        self._objective_arrived.set()
        self.assigned[msg.container] = msg
        if msg.container in self.ctrl.containers:
            self._govern(msg.container)

    def on_service_objective(self, msg: ServiceObjective) -> None:
        """A service objective from the manager (None: taken back): every matching container, present
        and future, is governed by it unless it has its own. An older revision than the one held is
        ignored (the manager sends the current one again while this node reports another)."""
        prev = self.service_objectives.get(msg.selector)
        if prev is not None and msg.revision < prev.revision:
            return
        self._objective_arrived.set()
        if msg.objective_s is None:
            self.service_objectives.pop(msg.selector, None)
        else:
            self.service_objectives[msg.selector] = msg
        for name in list(self.ctrl.containers):
            self._govern(name)

    def on_runtime_event(self, ev: RuntimeEvent) -> None:
        if ev.kind == "started":
            self._add(ev.container)
        elif self.training is not None and self.training.remove(ev.container.name):
            pass
        else:
            name = ev.container.name
            # Nothing per container outlives it (1,000 starts and stops leave nothing behind).
            for table in (self.last_batch_at, self.throttled_ratio, self.models, self.label_objectives,
                          self.assigned, self.labels, self.resolved, self.windows, self.request_rates):
                table.pop(name, None)
            self.by_id.pop(ev.container.id[:12], None)
            for gone in self.left:
                gone(name)
            if self.originals.pop(name, None) is not None or self.originals_file:
                save_originals(self.originals_file, self.originals)
            for key in [k for k in self._stale_seen if k[0] == name]:
                del self._stale_seen[key]
            if self.ctrl.remove(name, self.clock()):
                log.info("container %s left; its CPU is released", name)
        self.wake.set()

    def _add(self, c: RuntimeContainer) -> None:
        if self.training is not None and is_training(c):
            self.training.add(c)
            return
        if c.name in self.ctrl.containers:
            return
        if c.label_error:
            log.warning("container %s: %s (objective label ignored)", c.name, c.label_error)
        self.models[c.name] = c.model
        self.by_id[c.id[:12]] = c.name
        self.label_objectives[c.name] = (c.objective_s, c.alpha)
        self.labels[c.name] = dict(c.labels)
        if c.name not in self.originals:  # after a crash the file still has the true original
            self.originals[c.name] = c.limit
            save_originals(self.originals_file, self.originals)
        self.ctrl.add(c.name, self.clock(), limit=as_fraction(c.limit), workload=workload_of(c.model))
        self._govern(c.name, quiet=True)
        for joined in self.joined:
            joined(c)
        r = self.resolved.get(c.name)
        o = None if r is None else r.objective
        log.info("container %s joined (objective %s)", c.name,
                 "none" if o is None or r is None else f"{o.objective_s:g} s from its {r.source}"
                 + (f" {r.selector}" if r.selector else ""))

    def _objective_source(self, name: str) -> Literal["target", "label"]:
        """Where the objective in force comes from: "target" (the objective store, which wins: the
        container's own or its service's) or "label" (the container's dqoes.objective_s label)."""
        r = self.resolved.get(name)
        return "label" if r is None or r.source == "label" else "target"

    def _govern(self, name: str, *, quiet: bool = False) -> None:
        """Resolve which objective governs a container (own > service > label) and apply it."""
        a = self.assigned.get(name)
        own = None if a is None or a.objective_s is None else Objective(a.objective_s, a.alpha, a.percentile,
                                                                        a.window_s)
        services = {sel: Objective(m.objective_s, m.alpha, m.percentile, m.window_s)
                    for sel, m in self.service_objectives.items() if m.objective_s is not None}
        label_s, label_alpha = self.label_objectives.get(name, (None, None))
        label = None if label_s is None else Objective(label_s, label_alpha)
        r = resolve(own, services, self.labels.get(name, {}), label)
        prev = self.resolved.get(name)
        self.resolved[name] = r
        o = r.objective
        if o is not None and o.percentile is not None and name not in self.polled:
            self.windows.setdefault(name, BatchWindow())
        else:
            self.windows.pop(name, None)
        shape = None if o is None else (o.percentile, o.window_s)
        before = None if prev is None or prev.objective is None else (prev.objective.percentile,
                                                                       prev.objective.window_s)
        if prev is not None and shape != before:
            for retune in self.retuned:
                retune(name)
        self._set_objective(name, None if o is None else o.objective_s, None if o is None else o.alpha)

    def _set_objective(self, name: str, objective_s: float | None, alpha: float | None) -> None:
        was_managed = name in self.ctrl.containers and self.ctrl.containers[name].managed
        try:
            self.ctrl.set_objective(name, objective_s, self.clock(), alpha)
        except (KeyError, ValueError) as e:
            self.refusals.log("objective", "objective for %s refused: %s", name, e)
            return
        if was_managed and objective_s is None:
            # Unmanaged now: nothing will move its limit again, so release it.
            self._release.add(name)
            log.info("objective for %s cleared: unmanaged, its CPU limit is released", name)
        self.wake.set()
