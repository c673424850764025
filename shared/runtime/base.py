"""The runtime interface: where a node's containers live and how their CPU is limited.

One small async interface, several implementations chosen by the caller
(`sim`: simulated containers on a scaled clock; `docker`: a real engine;
`cgroup`: plain processes in cgroups). The worker only ever talks to this
interface, and one contract test suite (tests/contract) runs against every
implementation.

Units: limits are fractions of the node (1.0 = every core), as the control
core uses them; an implementation converts to its own (Docker NanoCpus or
CpuQuota, cgroup cpu.max or cfs_quota_us). CPU use is cumulative CPU-seconds,
like cpuacct.usage, so the controller computes per-interval shares itself.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from shared import auth
from shared.core.profiles import ModelProfile
from shared.runtime.cgroupfs import Throttling

__all__ = ["Throttling"]

MANAGED_LABEL = "dqoes.managed"
"""Only containers carrying this label with value "true" are ever touched."""
NODE_LABEL = "dqoes.node"
OBJECTIVE_LABEL = "dqoes.objective_s"
ALPHA_LABEL = "dqoes.alpha"
MODEL_LABEL = "dqoes.model"
KIND_LABEL = "dqoes.kind"
""""training" marks a training job (governed by the worker's training policy); absent: inference."""


class RealClock:
    """The capabilities of a runtime of real processes: wall-clock time, no foreknowledge."""

    time_scale: float = 1.0

    def now_s(self) -> float:
        return time.monotonic()

    def expected(self) -> list[str]:
        return []

    def latency_curve(self, name: str) -> ModelProfile | None:
        return None


class RuntimeFailure(Exception):
    """A runtime operation failed (engine gone, container vanished, bad state).

    The message is one line a log can carry; the worker logs it and goes on.
    """


@dataclass(frozen=True, slots=True)
class RuntimeContainer:
    """A managed container as the runtime sees it."""

    name: str
    """The name DQoES knows it by (Docker name without the leading '/')."""
    id: str
    """The runtime's own id (Docker full id, cgroup path, simulated name)."""
    node: str
    limit: float | None = None
    """CPU limit in force, fraction of the node; None: none."""
    objective_s: float | None = None
    """From the container's labels, if it carries one."""
    alpha: float | None = None
    model: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    label_error: str | None = None
    """Why an objective/alpha label was ignored (malformed), for one log line."""
    address: str | None = None
    """Where the container's own ports answer (Docker: its IP, or 127.0.0.1 on the host network);
    None: the runtime does not know (the worker then uses the dqoes.latency.host label or 127.0.0.1)."""
    published_ports: Mapping[int, int] = field(default_factory=dict)
    """Container port -> port on 127.0.0.1, for a container without an address of its own."""


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """A container started (joins the pool) or stopped (leaves it, releasing its CPU)."""

    kind: Literal["started", "stopped"]
    container: RuntimeContainer


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """A training job to start on this node (`dqoes submit` -> manager -> worker -> runtime)."""

    job: str
    model: str
    nats_url: str
    epochs: int | None = None
    threads: int | None = None
    seed: int = 0
    image: str | None = None
    """Docker: the image (None: the runtime's default); the cgroup runtime runs no images."""
    nats_creds: str | None = None
    """A credentials file on this machine (the worker's): processes get the file's path on their
    command line, never the key (ps shows command lines)."""

    @property
    def creds_file(self) -> str | None:
        """The credentials file on this machine: `nats_creds`, else the one the URL names."""
        return self.nats_creds or auth.creds_of(self.nats_url)

    def argv(self, node: str, python: str = "python", *, creds_at: str | None = None) -> list[str]:
        """The training process's command line (`python -m services.training ...`).

        `creds_at`: where the process finds the credentials file when that is not
        `creds_file` (a container: where the file is mounted)."""
        out = [python, "-m", "services.training", "--name", self.job, "--node", node, "--model", self.model,
               "--seed", str(self.seed)]
        plain = auth.without_credentials(self.nats_url)
        creds = creds_at or self.creds_file
        out += ["--nats", plain] + (["--creds", creds] if creds else [])
        if self.epochs is not None:
            out += ["--epochs", str(self.epochs)]
        if self.threads is not None:
            out += ["--threads", str(self.threads)]
        return out


class Launcher(Protocol):
    """A runtime that can start a training job itself (cgroup, Docker); the simulated one cannot."""

    async def launch(self, spec: LaunchSpec) -> RuntimeContainer:
        """Start it, labelled as a training job; RuntimeFailure (one line) if it cannot."""


class Runtime(Protocol):
    """What the worker needs from wherever its containers run.

    Capabilities are part of the interface, known once `start()` returned and
    before the controller is built: `cores` (the node's CPU capacity),
    `now_s()` (the clock the controller runs on: monotonic seconds, or
    scenario seconds for the simulated runtime), `time_scale` (clock seconds
    per wall second), `expected()` (containers announced but not started yet)
    and `latency_curve(name)` (what the runtime knows of a container's latency
    curve: the simulated runtime knows every one, real runtimes none).
    """

    node: str
    cores: float
    time_scale: float

    def now_s(self) -> float:
        """The controller's clock, in seconds."""

    def expected(self) -> list[str]:
        """Containers known to be coming that are not running yet (objectives may be set ahead)."""

    def latency_curve(self, name: str) -> ModelProfile | None:
        """The container's true latency curve where the runtime knows it, else None."""

    async def start(self) -> None:
        """Connect; after this `cores` is known and `containers()` and `events()` work."""

    async def containers(self) -> list[RuntimeContainer]:
        """The managed containers running now."""

    async def cpu_totals_s(self) -> dict[str, float]:
        """Cumulative CPU-seconds of each managed running container, by name."""

    async def throttling(self) -> dict[str, Throttling]:
        """Cumulative CFS throttling counters of each managed running container, by name.

        A container missing from the answer was not measured (the simulated
        runtime measures none).
        """

    async def set_limit(self, name: str, limit: float | None) -> float | None:
        """Apply a limit (fraction of the node, None: none); return the limit now in force.

        Raises RuntimeFailure when it cannot be applied; nothing else changes then.
        """

    def events(self) -> AsyncIterator[RuntimeEvent]:
        """Start/stop events of managed containers, as they happen."""

    async def close(self) -> None:
        """Release connections; never stops or changes containers it did not start.

        (The cgroup runtime starts its processes itself and ends them here.)"""
