"""The cgroup runtime: plain local processes in cgroups, for machines without Docker.

Why: the controller and the worker can be exercised on real CPU quotas with
nothing but root and a cgroup filesystem (v1, hybrid or v2). Each workload is
a process this runtime spawns into its own group <parent>/<name>; its limit
is the group's quota file, its CPU use the group's usage counter, so the
numbers mean exactly what they mean for a Docker container.

Unlike the Docker runtime this one owns its "containers": close() raises
their limits (a process left at a small quota can take very long to exit),
kills them and removes the groups it created. Only processes spawned by
this runtime are listed or limited; anything else is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared import children
from shared.runtime import cgroupfs
from shared.runtime.base import (
    ALPHA_LABEL,
    KIND_LABEL,
    MANAGED_LABEL,
    MODEL_LABEL,
    NODE_LABEL,
    OBJECTIVE_LABEL,
    LaunchSpec,
    RealClock,
    RuntimeContainer,
    RuntimeEvent,
    RuntimeFailure,
)

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
EXIT_WAIT_S = 3.0
"""How long close() waits for a process after SIGTERM before SIGKILL."""


@dataclass(frozen=True, slots=True)
class PlannedProcess:
    """A workload the runtime starts by itself, `start_after_s` seconds after `start()`."""

    name: str
    argv: tuple[str, ...]
    start_after_s: float = 0.0
    objective_s: float | None = None
    alpha: float | None = None
    model: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    """Extra labels (e.g. dqoes.kind=training)."""


@dataclass(slots=True)
class _Spawned:
    container: RuntimeContainer
    group: cgroupfs.Group
    process: asyncio.subprocess.Process
    watcher: asyncio.Task[None] | None = None
    running: bool = True


class CgroupRuntime(RealClock):
    """Processes spawned by this runtime, each in <root>/<parent>/<name>, limited by quota files.

    `cores` defaults to os.cpu_count(); limits are fractions of it.
    """

    def __init__(
        self,
        node: str,
        cores: float | None = None,
        root: str | Path = cgroupfs.DEFAULT_ROOT,
        parent: str = "dqoes",
        plan: Sequence[PlannedProcess] = (),
        cpu_weights: bool = False,
    ) -> None:
        """`plan`: workloads to start on their own schedule once started (`dqoes up --runtime cgroup`);
        `cpu_weights`: each limit also sets the group's CPU weight from it (`cgroupfs.weight_for_share`)."""
        self.node = node
        self.cpu_weights = cpu_weights
        self.cores: float = float(cores or os.cpu_count() or 1)
        self.root = Path(root)
        self.parent = parent.strip("/")
        self._parent_group: cgroupfs.Group | None = None
        self._created_parent = False
        self._spawned: dict[str, _Spawned] = {}
        self._subscribers: set[_Subscription] = set()
        self._closed = False
        self._plan = tuple(sorted(plan, key=lambda p: (p.start_after_s, p.name)))
        self._launcher: asyncio.Task[int] | None = None

    # ---- Runtime protocol ------------------------------------------------------

    async def start(self) -> None:
        try:
            version = cgroupfs.cpu_version(self.root)
        except OSError as e:
            raise RuntimeFailure(
                f"the cgroup runtime found no cpu controller under {self.root}"
            ) from e
        group = cgroupfs.group_at(self.root, self.parent, version)
        self._created_parent = not cgroupfs.exists(group)
        try:
            group = cgroupfs.create_group(self.root, self.parent)
            # Creating it is not enough when it existed: check we can move processes in.
            for d in group.dirs():
                procs = d / "cgroup.procs"
                if not os.access(procs if procs.exists() else d, os.W_OK):
                    raise PermissionError(13, "not writable", str(procs))
        except OSError as e:
            raise RuntimeFailure(
                f"the cgroup runtime needs root: cannot write {group.cpu_dir}"
            ) from e
        self._parent_group = group
        log.info(
            "cgroup runtime for node %s: %g cores, cgroup v%d under %s",
            self.node,
            self.cores,
            version,
            group.cpu_dir,
        )
        if self._plan:
            self._launcher = asyncio.create_task(self._launch(), name=f"cgroup-plan-{self.node}")

    async def _launch(self) -> int:
        """Start each planned workload at its time; returns how many started."""
        t0 = asyncio.get_running_loop().time()
        started = 0
        for p in self._plan:
            wait_s = t0 + p.start_after_s - asyncio.get_running_loop().time()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            try:
                await self.spawn(p.name, p.argv, objective_s=p.objective_s, alpha=p.alpha, model=p.model,
                                 labels=dict(p.labels))
                started += 1
            except RuntimeFailure as e:
                log.warning("container %s not started: %s", p.name, e)
        return started

    async def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        objective_s: float | None = None,
        alpha: float | None = None,
        model: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> RuntimeContainer:
        """Start `argv` as managed workload `name` in its own group (no limit until set_limit)."""
        if self._parent_group is None or self._closed:
            raise RuntimeFailure("cgroup runtime not started")
        if not _NAME.match(name):
            raise RuntimeFailure(f"bad workload name {name!r}: letters, digits, '.', '_', '-'")
        if name in self._spawned and self._spawned[name].running:
            raise RuntimeFailure(f"a workload named {name} is already running")
        rel = f"{self.parent}/{name}"
        try:
            group = cgroupfs.create_group(self.root, rel)
            cgroupfs.write_quota_cores(group, None)
        except OSError as e:
            raise RuntimeFailure(f"cannot create cgroup {rel}: {e}") from e
        procs_files = [str(d / "cgroup.procs") for d in group.dirs()]

        def join_group() -> None:  # runs in the child between fork and exec
            pid = str(os.getpid())
            for path in procs_files:
                with open(path, "w") as f:
                    f.write(pid)

        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=None if env is None else {**os.environ, **env},
                stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=children.die_with_parent(then=join_group),  # gone with the worker
                start_new_session=True,  # its own process group: close() kills children too
            )
        except (OSError, subprocess.SubprocessError) as e:
            cgroupfs.remove_group(group)
            raise RuntimeFailure(f"cannot start {name}: {e}") from e

        labels = {**(labels or {}), MANAGED_LABEL: "true", NODE_LABEL: self.node}
        for key, value in (
            (OBJECTIVE_LABEL, objective_s),
            (ALPHA_LABEL, alpha),
            (MODEL_LABEL, model),
        ):
            if value is not None:
                labels[key] = str(value)
        container = RuntimeContainer(
            name=name,
            id=str(group.cpu_dir),
            node=self.node,
            limit=None,
            objective_s=objective_s,
            alpha=alpha,
            model=model,
            labels=labels,
        )
        entry = _Spawned(container, group, process)
        self._spawned[name] = entry
        entry.watcher = asyncio.get_running_loop().create_task(self._watch(entry))
        log.debug("spawned %s (pid %d) in %s", name, process.pid, group.cpu_dir)
        self._publish(RuntimeEvent("started", container))
        return container

    async def launch(self, spec: LaunchSpec) -> RuntimeContainer:
        """A training job as a process of this Python (`python -m services.training`); no images here."""
        if spec.image is not None:
            raise RuntimeFailure(f"unknown image {spec.image!r}: the cgroup runtime runs processes, not images")
        return await self.spawn(spec.job, spec.argv(self.node, sys.executable), model=spec.model,
                                labels={KIND_LABEL: "training"})

    async def containers(self) -> list[RuntimeContainer]:
        return [self._current(e) for e in self._spawned.values() if e.running]

    async def cpu_totals_s(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for name, entry in self._spawned.items():
            if entry.running:
                try:
                    totals[name] = cgroupfs.usage_s(entry.group)
                except OSError as e:
                    log.debug("no CPU total for %s: %s", name, e)
        return totals

    async def throttling(self) -> dict[str, cgroupfs.Throttling]:
        out: dict[str, cgroupfs.Throttling] = {}
        for name, entry in self._spawned.items():
            if entry.running:
                try:
                    out[name] = cgroupfs.throttling(entry.group)
                except OSError as e:
                    log.debug("no throttling counters for %s: %s", name, e)
        return out

    async def set_limit(self, name: str, limit: float | None) -> float | None:
        entry = self._spawned.get(name)
        if entry is None or not entry.running:
            raise RuntimeFailure(f"no managed process named {name}")
        if limit is not None and (not math.isfinite(limit) or limit <= 0):
            raise RuntimeFailure(
                f"bad limit {limit!r} for {name}: must be a positive fraction of the node"
            )
        previous: list[float | None] = []  # the quota before, when it could be read
        if self.cpu_weights:
            with contextlib.suppress(OSError, ValueError):
                previous.append(cgroupfs.read_quota_cores(entry.group))
        try:
            cores = cgroupfs.write_quota_cores(
                entry.group, None if limit is None else limit * self.cores
            )
        except OSError as e:
            raise RuntimeFailure(f"cannot limit {name}: {e}") from e
        if self.cpu_weights:
            try:
                cgroupfs.write_weight(entry.group, cgroupfs.weight_for_share(
                    entry.group.version, None if cores is None else cores / self.cores))
            except OSError as e:
                # A limit is its quota and its weight together: put the quota back.
                restored = "left as set"
                if previous:
                    with contextlib.suppress(OSError):
                        cgroupfs.write_quota_cores(entry.group, previous[0])
                        restored = "back at no limit" if previous[0] is None else f"back at {previous[0]} cores"
                raise RuntimeFailure(f"cannot weight {name}: {e}; its quota is {restored}") from e
        in_force = None if cores is None else cores / self.cores
        log.debug("%s: limit %s (%s cores)", name, in_force, cores)
        return in_force

    def events(self) -> _Subscription:
        """Events from now on: "started" for each spawn, "stopped" when a process exits."""
        sub = _Subscription(self)
        self._subscribers.add(sub)
        return sub

    async def close(self) -> None:
        """Kill the processes this runtime spawned (limits raised first) and remove its groups."""
        if self._closed:
            return
        self._closed = True
        if self._launcher is not None:
            self._launcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._launcher
        for entry in self._spawned.values():
            if entry.running:
                with contextlib.suppress(OSError):
                    cgroupfs.write_quota_cores(entry.group, None)
                _signal_group(entry.process.pid, signal.SIGTERM)
        for entry in self._spawned.values():
            try:
                await asyncio.wait_for(entry.process.wait(), EXIT_WAIT_S)
            except TimeoutError:
                _signal_group(entry.process.pid, signal.SIGKILL)
                await entry.process.wait()
            # Children that left the process group still sit in the cgroup.
            with contextlib.suppress(OSError):
                for pid in cgroupfs.pids(entry.group):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if entry.watcher is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await entry.watcher
        for entry in self._spawned.values():
            await _remove_when_empty(entry.group)
        if self._parent_group is not None and self._created_parent:
            cgroupfs.remove_group(self._parent_group)
        for sub in list(self._subscribers):
            sub.end()

    # ---- internals ---------------------------------------------------------------

    def _current(self, entry: _Spawned) -> RuntimeContainer:
        """The container with the limit read back from its group."""
        try:
            cores = cgroupfs.read_quota_cores(entry.group)
        except OSError:
            return entry.container
        limit = None if cores is None else cores / self.cores
        return dataclasses.replace(entry.container, limit=limit)

    async def _watch(self, entry: _Spawned) -> None:
        code = await entry.process.wait()
        entry.running = False
        log.debug("%s exited with %s", entry.container.name, code)
        self._publish(RuntimeEvent("stopped", entry.container))
        if not self._closed:
            await _remove_when_empty(entry.group)

    def _publish(self, event: RuntimeEvent) -> None:
        for sub in self._subscribers:
            sub.queue.put_nowait(event)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _remove_when_empty(group: cgroupfs.Group, wait_s: float = 2.0) -> None:
    """rmdir the group, retrying briefly: the kernel empties it just after the exit."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            if cgroupfs.remove_group(group):
                return
        except OSError as e:
            log.debug("cannot remove %s: %s", group.cpu_dir, e)
            return
        if loop.time() >= deadline:
            log.debug("cgroup %s still busy; left in place", group.cpu_dir)
            return
        await asyncio.sleep(0.05)


class _Subscription:
    """One events() iterator; registered at once so no spawn after events() is missed."""

    _END = object()

    def __init__(self, runtime: CgroupRuntime) -> None:
        self._rt = runtime
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> RuntimeEvent:
        item = await self.queue.get()
        if item is self._END:
            self.queue.put_nowait(self._END)
            raise StopAsyncIteration
        return item

    def end(self) -> None:
        self._rt._subscribers.discard(self)
        self.queue.put_nowait(self._END)

    async def aclose(self) -> None:
        self.end()
