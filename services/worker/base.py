"""A node's worker as built: what it holds, the policy in force, and what `dqoes control` changes.

The worker's logic is one class, `services.worker.logic.Worker`, written in
layers so that each module stays readable on its own; this is the bottom one.
`WorkerBase` sets up every table the worker keeps (per container, per service,
per round) and restores what an operator changed on this node's last worker
(services/worker/statefiles.py); its methods put a policy and its parameters
in force, on start-up and on a `dqoes control` message. The layers above it:
governing.py (objectives and containers), reporting.py (the node state),
rounds.py (a round and its limits), logic.py (events and loops).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from services.worker.statefiles import load_originals, restored_params, restored_switch, write_json
from services.worker.training import TrainingSide
from shared import subjects
from shared.core.controller import NodeController
from shared.core.objectives import BatchWindow, Resolved
from shared.core.policy import Policy, numeric_params, unknown_params
from shared.ratelog import RateLimitedLog
from shared.runtime.base import Runtime, RuntimeContainer, Throttling
from shared.schema import (
    ControlMsg,
    ControlReply,
    Message,
    NodeState,
    ObjectiveAssign,
    ServiceObjective,
)

log = logging.getLogger("services.worker.logic")  # one name for the worker's logic, whichever layer logs

Publish = Callable[[str, Message], Awaitable[None]]


class WorkerBase:
    """One node's controller, wired to a runtime and a publish function: its state and its policy."""

    def __init__(
        self,
        node: str,
        runtime: Runtime,
        controller: NodeController,
        publish: Publish,
        *,
        state_interval_s: float = 2.0,
        wall: Callable[[], float] = time.time,
        training: TrainingSide | None = None,
        originals_file: str | None = None,
        params_file: str | None = None,
        params_key: Mapping[str, Any] | None = None,
        policy_factory: Callable[[str], Policy] | None = None,
    ) -> None:
        self.node = node
        self.policy_factory = policy_factory
        """Builds a registered policy by name for `dqoes control policy=NAME` (ValueError: refused;
        None: this worker cannot switch)."""
        self.switched_to: str | None = None
        """The policy `dqoes control` switched this node to (restored ones included); None: its own."""
        self.params_file = params_file
        """Where what `dqoes control` changed is kept, so that a restarted worker keeps it (None: not)."""
        self.params_key = json.loads(json.dumps(dict(params_key or {}), default=str))  # as the file has it
        """The configuration the changes were made on (policy and flags): see `restored_params`."""
        self.controlled: dict[str, float] = {}
        """Every parameter `dqoes control` changed on this node (restored ones included), by name."""
        self.originals_file = originals_file
        """Where the limits containers had before this node's worker first saw them are kept, so a
        worker restarted after a crash still knows them (`restore_limits`, --on-stop restore)."""
        self.originals: dict[str, float | None] = load_originals(originals_file)
        self.restarted = bool(self.originals)
        """The last worker of this node left limits in force (it crashed, or stopped with `keep`): its
        originals file is still there, and the first round waits for the stored objectives."""
        self.training = training
        """Training containers (label dqoes.kind=training) and their policy; None: this worker has none."""
        self.runtime = runtime
        self.ctrl = controller
        self.publish = publish
        self.state_interval_s = state_interval_s
        self.wall = wall
        self.clock: Callable[[], float] = runtime.now_s
        self.time_scale: float = runtime.time_scale
        self.models: dict[str, str | None] = {}
        self.by_id: dict[str, str] = {}
        self.assigned: dict[str, ObjectiveAssign] = {}
        self.label_objectives: dict[str, tuple[float | None, float | None]] = {}
        self.service_objectives: dict[str, ServiceObjective] = {}
        """Objectives for services (selector -> the manager's hand-over): every matching container."""
        self.labels: dict[str, Mapping[str, str]] = {}
        self.resolved: dict[str, Resolved] = {}
        """The objective governing each container and where it comes from (own > service > label)."""
        self.windows: dict[str, BatchWindow] = {}
        """Recent batches of containers with a percentile objective and NATS latency events."""
        self.request_rates: dict[str, float] = {}
        """Requests per second over each polled container's last window."""
        self.retuned: list[Callable[[str], None]] = []
        """Called with a container whose objective's percentile or window changed (the poller)."""
        self.rounds = 0
        self.latencies = 0
        self.ignored_latencies = 0
        self.forged_latencies = 0
        """Latency events dropped because the body named another container than the subject."""
        self._latency_prefix = subjects.latency_of_node(node)[:-1]
        self.limit_changes = 0
        self.round_observers: list[Callable[[float], None]] = []
        self.joined: list[Callable[[RuntimeContainer], None]] = []
        """Called with each inference container that joins (the latency poller reads its labels)."""
        self.left: list[Callable[[str], None]] = []
        """Called with the name of each inference container that leaves."""
        self.polled: set[str] = set()
        """Containers whose latency the worker reads itself (a `prometheus` or `promql` source): their
        NATS latency events are ignored, and only `unmeasured` makes them stale."""
        self.unmeasured: set[str] = set()
        """Polled containers whose source gave no value for its last window (unreachable, nothing in it)."""
        """Called with the wall seconds each round took (the metrics histogram)."""
        self.last_state: NodeState | None = None
        """The node state last published (immutable; what /metrics reads from its own thread)."""
        self.last_batch_at: dict[str, float] = {}
        self.throttled_ratio: dict[str, float] = {}
        self._throttle_prev: dict[str, Throttling] = {}
        self._release: set[str] = set()
        self.wake = asyncio.Event()
        self._stale_seen: dict[tuple[str, int], ObjectiveAssign] = {}
        self._objective_arrived = asyncio.Event()
        self.refusals = RateLimitedLog(log, logging.WARNING)
        """Refused control messages and objectives: one line per 5 s per kind, with a count."""
        self._next_state_wall = 0.0
        self._stopping = False
        restored_policy = restored_switch(params_file, self.params_key)
        if restored_policy:
            error = self._switch_policy(restored_policy)
            if error:
                log.warning("policy set by control in %s not restored: %s", params_file, error)
            else:
                log.info("restored the policy set by control before this worker started: %s", restored_policy)
        restored = restored_params(params_file, self.params_key)
        if restored:
            error = self._set_params(restored)
            if error:
                log.warning("parameters set by control in %s not restored: %s", params_file, error)
                Path(str(params_file)).unlink(missing_ok=True)
            else:
                self.controlled = restored
                log.info("restored the parameters set by control before this worker started: %s",
                         ", ".join(f"{k}={v:g}" for k, v in sorted(restored.items())))

    def on_control(self, msg: ControlMsg) -> ControlReply:
        """An operator's parameter read or change, checked against the policy in force.

        Names must be fields of the policy's parameters dataclass and values
        must pass its checks; otherwise nothing changes and the reply says
        why. A message that asks for nothing is a read.
        """
        asked = msg.asked()
        before = self.ctrl.policy
        switch = msg.policy is not None and msg.policy != before.name
        error = self._switch_policy(str(msg.policy)) if switch else ""
        if not error and asked:
            error = self._set_params(asked)
            if error and switch:  # nothing changes: the policy in force stays
                self.ctrl.policy = before
        if error:
            self.refusals.log("control", "control message refused: %s", error)
        elif asked or switch:
            if switch:
                self.switched_to = self.ctrl.policy.name
                self.controlled = {}  # parameters set on the policy before do not carry over
                log.info("policy now %s (was %s), set by control", self.ctrl.policy.name, before.name)
            self.controlled.update({k: float(v) for k, v in asked.items()})
            if self.params_file:
                write_json(self.params_file, {"key": self.params_key, "changed": self.controlled,
                                               "policy": self.switched_to}, "the parameters set by control")
            self.ctrl.next_round_at_s = self.clock()
            self.wake.set()
        changed = () if error else tuple(sorted(asked)) + (("policy",) if switch else ())
        return ControlReply(node=self.node, policy=self.ctrl.policy.name, ok=not error, error=error,
                            params=self.params_in_force(), changed=changed)

    def _switch_policy(self, name: str) -> str:
        """Put the registered policy `name` in force from the next round; the error ("" if none)."""
        if self.policy_factory is None:
            return "this worker cannot switch policies"
        try:
            policy = self.policy_factory(name)
        except ValueError as e:
            return str(e)
        self.ctrl.policy = policy
        self.ctrl.next_round_at_s = self.clock()
        return ""

    def _set_params(self, asked: Mapping[str, float]) -> str:
        """Set the policy's parameters by name; the error ("" if none), and then nothing changes."""
        policy = self.ctrl.policy
        problem = unknown_params(policy.name, policy.params, asked)
        if problem:
            return problem
        try:
            current = dataclasses.asdict(policy.params)
            typed = {k: int(v) if isinstance(current[k], int) and not isinstance(current[k], bool)
                     and float(v).is_integer() else v for k, v in asked.items()}
            bad = [k for k in typed if isinstance(current[k], bool)]
            if bad:
                raise ValueError(f"{bad[0]} is a switch, not a number")
            params = dataclasses.replace(policy.params, **typed)
        except (ValueError, TypeError) as e:
            return str(e)
        policy.set_params(params)
        self.ctrl.next_round_at_s = self.clock()
        log.info("parameters now %s", params)
        return ""

    def params_in_force(self) -> dict[str, float]:
        return numeric_params(self.ctrl.policy.params)


def as_fraction(limit: float | None) -> float | None:
    """A runtime limit as the controller holds it (fractions in (0, 1])."""
    if limit is None or not math.isfinite(limit) or limit <= 0:
        return None
    return min(1.0, limit)
