"""The Docker runtime: a node's managed containers on a real Docker engine.

Why it looks the way it does:
- Only containers labelled `dqoes.managed=true` are listed, measured or
  changed; `set_limit` refuses anything else, so a worker can share a node
  with containers it must never touch.
- CPU use comes from the cgroup files (instant) rather than stats() (1-2 s a
  call); the host's /sys/fs/cgroup must be visible at `cgroup_root`.
- A container's CPU limit is set in the mode it already uses: NanoCpus
  (`docker run --cpus`, compose `cpus:`, swarm `--limit-cpu`) or
  CpuPeriod/CpuQuota (everything else). Mixing them is an HTTP 409, and
  NanoCpus cannot be cleared, so "no limit" there means "all the node's
  cores". The SDK's update() has no nano_cpus: NanoCpus goes through the
  low-level client's POST /containers/{id}/update.
- With `cpu_weights`, each limit also sets the container's CPU shares from
  it (`cgroupfs.weight_for_share`; no limit: the default 1024), so that on a
  full node a large limit is delivered as fully as a small one; Docker takes
  shares in cgroup v1 units and converts them to cpu.weight on v2.
- The SDK blocks; every call runs on a small dedicated thread pool (the event
  stream on its own thread), so the asyncio loop never waits on the engine.
- events() outlives the daemon: when dockerd goes away it logs one line,
  retries with backoff and on reconnect reports what started or stopped
  meanwhile, instead of ending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from shared.core import bounds
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

TRAINING_IMAGE = "dqoes-workload"
"""The image a training job runs when the request names none (`make images` builds it)."""
JOB_CREDS = "/run/dqoes/nats.creds"
"""Where a training container finds its credentials file (mounted read-only from the worker's)."""

log = logging.getLogger(__name__)

T = TypeVar("T")

PERIOD_US = cgroupfs.PERIOD_US
MIN_QUOTA_US = cgroupfs.MIN_QUOTA_US
MIN_NANO_CPUS = 10_000_000
"""Docker refuses NanoCpus below 0.01 CPU."""
WATCHED_ACTIONS = ("start", "die", "stop", "destroy")
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Waits between reconnection attempts; the last one repeats."""

_ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def parse_labels(labels: Mapping[str, str]) -> tuple[float | None, float | None, str | None]:
    """(objective_s, alpha, error) from a container's labels; a malformed value is None plus a reason."""
    errors: list[str] = []

    def number(key: str) -> float | None:
        raw = labels.get(key)
        if raw is None or raw == "":
            return None
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            errors.append(f"{key}={raw!r} is not a positive number")
            return None
        return value

    objective_s = number(OBJECTIVE_LABEL)
    if objective_s is not None and (problem := bounds.objective_problem(objective_s)) is not None:
        errors.append(f"{OBJECTIVE_LABEL}={labels[OBJECTIVE_LABEL]!r}: {problem}")
        objective_s = None
    alpha = number(ALPHA_LABEL)
    if alpha is not None and alpha >= 1:
        errors.append(f"{ALPHA_LABEL}={labels[ALPHA_LABEL]!r} is not in (0, 1)")
        alpha = None
    return objective_s, alpha, "; ".join(errors) or None


def address_of(info: Mapping[str, Any]) -> tuple[str, dict[int, int]]:
    """(address, published ports) where the worker reaches an inspected container's own ports.

    Its IP on its first network with one (the worker on the host, or on the same network); a
    container without one (host network, or only published ports) answers on 127.0.0.1, through
    the host ports its TCP ports are published on."""
    settings = info.get("NetworkSettings") or {}
    ips = [settings.get("IPAddress")] + [n.get("IPAddress") for n in (settings.get("Networks") or {}).values()
                                         if isinstance(n, Mapping)]
    ip = next((x for x in ips if isinstance(x, str) and x), None)
    if ip:
        return ip, {}
    published: dict[int, int] = {}
    for key, bindings in (settings.get("Ports") or {}).items():
        port, _, proto = str(key).partition("/")
        if proto not in ("", "tcp") or not port.isdigit() or not bindings:
            continue
        host_ports = [b.get("HostPort") for b in bindings if isinstance(b, Mapping)]
        first = next((int(p) for p in host_ports if isinstance(p, str) and p.isdigit()), None)
        if first is not None:
            published[int(port)] = first
    return "127.0.0.1", published


class DockerRuntime(RealClock):
    """Containers of one Docker engine, limited through Docker's own update API.

    It manages the running containers labelled `dqoes.managed=true` whose
    `dqoes.node` label is absent or names this node. With
    `require_node_label` an absent label no longer counts: only containers
    labelled for this node are seen. Several logical nodes sharing one engine
    (the compose demo) need that, or each of them would claim every
    unlabelled managed container.

    `cores` defaults to the engine's NCPU; limits are fractions of it.
    `cgroup_root` is where the host's cgroup tree is visible (for CPU use).
    """

    def __init__(
        self,
        node: str,
        cores: float | None = None,
        label: str = MANAGED_LABEL,
        cgroup_root: str | Path = cgroupfs.DEFAULT_ROOT,
        docker_url: str | None = None,
        timeout_s: float = 10.0,
        require_node_label: bool = False,
        cpu_weights: bool = False,
    ) -> None:
        self.node = node
        self.require_node_label = require_node_label
        self.cpu_weights = cpu_weights
        self.cores: float = float(cores) if cores else 0.0
        self.label = label
        self.cgroup_root = Path(cgroup_root)
        self.docker_url = docker_url
        self.timeout_s = timeout_s
        self._api: docker.APIClient | None = None
        self._engine_cpus = 0
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dqoes-docker")
        self._groups: dict[str, cgroupfs.Group] = {}
        self._streams: set[_EventStream] = set()
        self._baseline: dict[str, RuntimeContainer] | None = None
        self._closed = False

    # ---- plumbing ----------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise RuntimeFailure("docker runtime is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    def _client(self) -> docker.APIClient:
        if self._api is None:
            raise RuntimeFailure("docker runtime not started (call start() first)")
        return self._api

    def _connect(self) -> docker.APIClient:
        if self.docker_url:
            return docker.APIClient(
                base_url=self.docker_url, version="auto", timeout=self.timeout_s
            )
        return docker.from_env(timeout=self.timeout_s).api

    def _managed_filter(self) -> dict[str, Any]:
        if self.require_node_label:  # the engine ANDs label filters
            return {"label": [f"{self.label}=true", f"{NODE_LABEL}={self.node}"]}
        return {"label": f"{self.label}=true"}

    # ---- Runtime protocol ----------------------------------------------------

    async def start(self) -> None:
        def connect() -> tuple[docker.APIClient, int]:
            api = self._connect()
            return api, int(api.info().get("NCPU") or 0)

        try:
            self._api, self._engine_cpus = await self._call(connect)
        except _ENGINE_ERRORS as e:
            raise RuntimeFailure(f"docker engine unreachable: {_one_line(e)}") from e
        if not self.cores:
            self.cores = float(self._engine_cpus or 1)
        try:
            cgroupfs.detect_layout(self.cgroup_root)
        except OSError as e:
            raise RuntimeFailure(
                f"no cgroup cpu controller under {self.cgroup_root}: mount the host's /sys/fs/cgroup there"
            ) from e
        log.info(
            "docker runtime for node %s: %g cores, label %s=true", self.node, self.cores, self.label
        )

    async def launch(self, spec: LaunchSpec) -> RuntimeContainer:
        """Start a training job as a container of `spec.image` on this engine, labelled for this node."""
        return await self._call(self._launch, spec)

    def _launch(self, spec: LaunchSpec) -> RuntimeContainer:
        api = self._client()
        image = spec.image or TRAINING_IMAGE
        labels = {self.label: "true", NODE_LABEL: self.node, KIND_LABEL: "training", MODEL_LABEL: spec.model}
        try:
            api.inspect_image(image)
        except docker.errors.ImageNotFound:
            raise RuntimeFailure(f"unknown image {image!r} on node {self.node}") from None
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            raise RuntimeFailure(f"docker engine unreachable: {_one_line(e)}") from e
        # The job's credentials file, mounted read-only: the key itself never goes on a command line.
        creds = spec.creds_file
        binds = {str(Path(creds).resolve()): {"bind": JOB_CREDS, "mode": "ro"}} if creds else None
        try:
            created = api.create_container(
                image, command=spec.argv(self.node, creds_at=JOB_CREDS if creds else None), name=spec.job,
                labels=labels, detach=True,
                environment={"DQOES_NODE": self.node, "DQOES_JOB_NAME": spec.job},
                host_config=api.create_host_config(network_mode="host", init=True, auto_remove=True, binds=binds),
            )
            api.start(created["Id"])
        except (docker.errors.APIError, requests.exceptions.RequestException) as e:
            raise RuntimeFailure(f"cannot start training job {spec.job}: {_one_line(e)}") from e
        return RuntimeContainer(name=spec.job, id=created["Id"], node=self.node, model=spec.model, labels=labels)

    async def containers(self) -> list[RuntimeContainer]:
        found = await self._call(self._list_running)
        self._baseline = found
        return list(found.values())

    async def cpu_totals_s(self) -> dict[str, float]:
        return await self._call(self._cpu_totals_s)

    async def throttling(self) -> dict[str, cgroupfs.Throttling]:
        return await self._call(self._throttling)

    async def set_limit(self, name: str, limit: float | None) -> float | None:
        if limit is not None and (not math.isfinite(limit) or limit <= 0):
            raise RuntimeFailure(
                f"bad limit {limit!r} for {name}: must be a positive fraction of the node"
            )
        return await self._call(self._set_limit, name, limit)

    def events(self) -> _EventStream:
        """Start following the engine now; iterate the result for RuntimeEvents.

        The first report compares the engine with the last containers() answer
        (or, without one, with what runs when this is called), so nothing that
        changes in between is lost.
        """
        stream = _EventStream(self, asyncio.get_running_loop(), self._baseline)
        self._streams.add(stream)
        return stream

    async def close(self) -> None:
        """Stop following events and drop the connection; containers keep running as they are."""
        if self._closed:
            return
        for stream in list(self._streams):
            await stream.aclose()
        self._closed = True
        api, self._api = self._api, None
        if api is not None:
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(self._pool, api.close)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- blocking work (pool threads) ------------------------------------------

    def _list_running(self, api: docker.APIClient | None = None) -> dict[str, RuntimeContainer]:
        """Managed running containers by id."""
        return {cid: c for cid, (c, _) in self._list_running_detail(api).items()}

    def _list_running_detail(
        self, api: docker.APIClient | None = None
    ) -> dict[str, tuple[RuntimeContainer, str]]:
        """Managed running containers by id, with State.StartedAt (list + inspect each)."""
        api = api or self._client()
        try:
            summaries = api.containers(filters={**self._managed_filter(), "status": "running"})
            found: dict[str, tuple[RuntimeContainer, str]] = {}
            for s in summaries:
                try:
                    info = api.inspect_container(s["Id"])
                except docker.errors.NotFound:
                    continue  # gone between list and inspect
                if info["State"].get("Running"):
                    c = self._describe(info)
                    if c.node == self.node:  # labelled for another node: that worker's
                        found[info["Id"]] = (c, info["State"].get("StartedAt", ""))
            return found
        except _ENGINE_ERRORS as e:
            raise RuntimeFailure(f"docker engine unreachable: {_one_line(e)}") from e

    def _describe(self, info: Mapping[str, Any]) -> RuntimeContainer:
        labels = dict(info["Config"].get("Labels") or {})
        objective_s, alpha, label_error = parse_labels(labels)
        address, published = address_of(info)
        return RuntimeContainer(
            name=info["Name"].lstrip("/"),
            id=info["Id"],
            node=labels.get(NODE_LABEL) or self.node,
            limit=self._limit_of(info["HostConfig"]),
            objective_s=objective_s,
            alpha=alpha,
            model=labels.get(MODEL_LABEL),
            labels=labels,
            label_error=label_error,
            address=address,
            published_ports=published,
        )

    def _limit_of(self, host_config: Mapping[str, Any]) -> float | None:
        """The limit in force as a fraction of the node, from HostConfig."""
        nano = host_config.get("NanoCpus") or 0
        if nano > 0:
            return nano / 1e9 / self.cores
        quota_us = host_config.get("CpuQuota") or 0
        period_us = host_config.get("CpuPeriod") or PERIOD_US
        if quota_us > 0:
            return quota_us / period_us / self.cores
        return None

    def _group(self, container_id: str, pid: int | None) -> cgroupfs.Group:
        group = self._groups.get(container_id)
        if group is None or not cgroupfs.exists(group):
            group = cgroupfs.docker_group(self.cgroup_root, container_id, pid)
            self._groups[container_id] = group
        return group

    def _cpu_totals_s(self) -> dict[str, float]:
        api = self._client()
        try:
            summaries = api.containers(filters={**self._managed_filter(), "status": "running"})
        except _ENGINE_ERRORS as e:
            raise RuntimeFailure(f"docker engine unreachable: {_one_line(e)}") from e
        totals: dict[str, float] = {}
        live = set()
        for s in summaries:
            cid, name = s["Id"], s["Names"][0].lstrip("/")
            live.add(cid)
            try:
                totals[name] = cgroupfs.usage_s(self._group(cid, None))
            except OSError:
                # Not at the usual places: ask the engine for its pid once.
                try:
                    pid = api.inspect_container(cid)["State"].get("Pid")
                    totals[name] = cgroupfs.usage_s(self._group(cid, pid))
                except (docker.errors.NotFound, OSError) as e:
                    log.debug("no CPU total for %s: %s", name, _one_line(e))
        for cid in set(self._groups) - live:
            del self._groups[cid]
        return totals

    def _throttling(self) -> dict[str, cgroupfs.Throttling]:
        """cpu.stat of each managed running container whose cgroup is already known or found."""
        api = self._client()
        try:
            summaries = api.containers(filters={**self._managed_filter(), "status": "running"})
        except _ENGINE_ERRORS as e:
            raise RuntimeFailure(f"docker engine unreachable: {_one_line(e)}") from e
        out: dict[str, cgroupfs.Throttling] = {}
        for s in summaries:
            cid, name = s["Id"], s["Names"][0].lstrip("/")
            try:
                out[name] = cgroupfs.throttling(self._group(cid, None))
            except OSError:
                try:
                    pid = api.inspect_container(cid)["State"].get("Pid")
                    out[name] = cgroupfs.throttling(self._group(cid, pid))
                except (docker.errors.NotFound, OSError) as e:
                    log.debug("no throttling counters for %s: %s", name, _one_line(e))
        return out

    def _set_limit(self, name: str, limit: float | None) -> float | None:
        api = self._client()
        try:
            info = api.inspect_container(name)
        except docker.errors.NotFound as e:
            raise RuntimeFailure(f"no container named {name}") from e
        except _ENGINE_ERRORS as e:
            raise RuntimeFailure(f"docker engine unreachable: {_one_line(e)}") from e
        # inspect also accepts id prefixes: insist on the exact name (or full id).
        if info["Name"].lstrip("/") != name and info["Id"] != name:
            raise RuntimeFailure(f"no container named {name}")
        labels = info["Config"].get("Labels") or {}
        if labels.get(self.label) != "true":
            raise RuntimeFailure(f"refusing to change {name}: it is not labelled {self.label}=true")
        if labels.get(NODE_LABEL) not in (None, "", self.node):
            raise RuntimeFailure(f"refusing to change {name}: it belongs to node {labels[NODE_LABEL]}")
        if self.require_node_label and labels.get(NODE_LABEL) != self.node:
            raise RuntimeFailure(f"refusing to change {name}: it is not labelled {NODE_LABEL}={self.node}")
        if not info["State"].get("Running"):
            raise RuntimeFailure(f"container {name} is not running")

        cid, host_config = info["Id"], info["HostConfig"]
        try:
            if (host_config.get("NanoCpus") or 0) > 0:
                # NanoCpus mode: stay in it; "no limit" is every core of the node.
                max_cores = min(self.cores, self._engine_cpus or self.cores)
                limit_cores = max_cores if limit is None else min(limit * self.cores, max_cores)
                nano_cpus = max(MIN_NANO_CPUS, round(limit_cores * 1e9))
                in_force: float | None = nano_cpus / 1e9 / self.cores
                data: dict[str, int] = {"NanoCpus": nano_cpus}
                if self.cpu_weights:
                    data["CpuShares"] = _shares_for(None if limit is None else in_force)
                res = api._post_json(api._url("/containers/{0}/update", cid), data=data)
                api._result(res, True)
                log.debug("%s: NanoCpus=%d (limit %.4f)", name, nano_cpus, in_force)
                return in_force
            quota_us = cgroupfs.quota_us_for(None if limit is None else limit * self.cores)
            in_force = None if quota_us < 0 else quota_us / PERIOD_US / self.cores
            shares = {"cpu_shares": _shares_for(in_force)} if self.cpu_weights else {}
            api.update_container(cid, cpu_period=PERIOD_US, cpu_quota=quota_us, **shares)
            log.debug("%s: CpuQuota=%d/%d (limit %s)", name, quota_us, PERIOD_US, in_force)
            return in_force
        except docker.errors.NotFound as e:
            raise RuntimeFailure(f"container {name} vanished") from e
        except _ENGINE_ERRORS as e:
            raise RuntimeFailure(f"cannot limit {name}: {_one_line(e)}") from e


def _shares_for(limit: float | None) -> int:
    """A container's CPU shares (cgroup v1 units, as Docker takes them) for a limit in force."""
    return cgroupfs.weight_scale(1).raw_for(cgroupfs.weight_for_share(1, limit))


def engine_name(docker_url: str | None = None, timeout_s: float = 10.0) -> str:
    """The engine's name, `docker info` Name: its host's hostname, and a Swarm node's hostname.

    What a worker calls its node when it is given none: inside a container the
    hostname is the container's id, not the host's, while the engine reached
    through the mounted socket is the host's own. RuntimeFailure if unreachable.
    """
    try:
        api = (docker.APIClient(base_url=docker_url, version="auto", timeout=timeout_s) if docker_url
               else docker.from_env(timeout=timeout_s).api)
        try:
            name = api.info().get("Name")
        finally:
            api.close()
    except _ENGINE_ERRORS as e:
        raise RuntimeFailure(f"cannot ask the docker engine its name: {_one_line(e)}") from e
    if not isinstance(name, str) or not name:
        raise RuntimeFailure("the docker engine reports no name")
    return name


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return " ".join(text.split())[:300]


class _EventStream:
    """One events() subscription: a thread reads the engine's event stream into
    an asyncio queue; an asyncio task keeps it connected and deduplicates.

    The containers known to run (with their StartedAt) are kept here, so that
    every "started" is followed by at most one "stopped" (docker sends die,
    stop and destroy for one exit), and a reconnect can report what changed
    while the daemon was away, restarts included.
    """

    _END = object()

    def __init__(
        self,
        runtime: DockerRuntime,
        loop: asyncio.AbstractEventLoop,
        baseline: dict[str, RuntimeContainer] | None,
    ) -> None:
        self._rt = runtime
        self._loop = loop
        self._out: asyncio.Queue[Any] = asyncio.Queue()
        self._raw: asyncio.Queue[Any] = asyncio.Queue()
        # id -> (container, StartedAt); StartedAt "" when it came from containers().
        self._known: dict[str, tuple[RuntimeContainer, str]] | None = (
            {cid: (c, "") for cid, c in baseline.items()} if baseline is not None else None
        )
        self._created_at = datetime.now(UTC)
        self._stream: Any = None
        self._stopping = threading.Event()
        self._task = loop.create_task(self._run(), name="dqoes-docker-events")

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> RuntimeEvent:
        item = await self._out.get()
        if item is self._END:
            self._out.put_nowait(self._END)  # later calls end too
            raise StopAsyncIteration
        return item

    async def aclose(self) -> None:
        self._stopping.set()
        self._close_stream()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._out.put_nowait(self._END)
        self._rt._streams.discard(self)

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    # ---- threads ------------------------------------------------------------------

    def _subscribe(self) -> tuple[Any, docker.APIClient, dict[str, tuple[RuntimeContainer, str]]]:
        """Open an event stream on its own connection, then list what runs (pool thread).

        Subscribing before listing means nothing that happens in between is
        missed; duplicates are dropped against the known set.
        """
        rt = self._rt
        api = rt._connect()
        filters = {**rt._managed_filter(), "type": "container", "event": list(WATCHED_ACTIONS)}
        stream = api.events(decode=True, filters=filters)
        try:
            return stream, api, rt._list_running_detail(api)
        except BaseException:
            stream.close()
            api.close()
            raise

    def _pump(self, stream: Any, api: docker.APIClient) -> None:
        """Copy raw events to the loop until the stream ends (event-stream thread)."""

        def put(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop closed at shutdown
                self._loop.call_soon_threadsafe(self._raw.put_nowait, item)

        try:
            for event in stream:
                put(event)
        except Exception as e:  # noqa: BLE001 - any failure means "stream lost"
            put(e)
        else:
            put(None)
        finally:
            with contextlib.suppress(Exception):
                api.close()

    # ---- the asyncio side ------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        lost_at: float | None = None
        while not self._stopping.is_set():
            try:
                stream, api, running = await self._rt._call(self._subscribe)
            except (RuntimeFailure, *_ENGINE_ERRORS) as e:
                if self._stopping.is_set():
                    return
                if lost_at is None:
                    lost_at = time.monotonic()
                    log.warning("docker engine unreachable (%s); retrying", _one_line(e))
                else:
                    log.debug("docker engine still unreachable: %s", _one_line(e))
                await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
                attempt += 1
                continue
            self._stream = stream
            if self._stopping.is_set():
                self._close_stream()
                return
            if lost_at is not None:
                log.info(
                    "docker engine back after %.1f s; resynchronising", time.monotonic() - lost_at
                )
            attempt, lost_at = 0, None
            self._resync(running)
            threading.Thread(
                target=self._pump, args=(stream, api), name="dqoes-docker-events", daemon=True
            ).start()
            while True:
                raw = await self._raw.get()
                if raw is None or isinstance(raw, BaseException):
                    break
                await self._handle(raw)
            self._stream = None
            if self._stopping.is_set():
                return
            lost_at = time.monotonic()
            reason = _one_line(raw) if isinstance(raw, BaseException) else "event stream closed"
            log.warning("lost the docker engine (%s); reconnecting", reason)

    def _resync(self, running: dict[str, tuple[RuntimeContainer, str]]) -> None:
        """Report the difference between what we knew and what runs now."""
        if self._known is None:
            # No baseline from containers(): report only what started after events() was called.
            known_ids = {
                cid for cid, (_, at) in running.items() if not _after(at, self._created_at)
            }
            self._known = {cid: running[cid] for cid in known_ids}
        for cid, (container, started_at) in list(self._known.items()):
            now = running.get(cid)
            # Gone, or restarted meanwhile (same id, new StartedAt).
            if now is None or (started_at and now[1] != started_at):
                del self._known[cid]
                self._out.put_nowait(RuntimeEvent("stopped", container))
        for cid, (container, started_at) in running.items():
            if cid not in self._known:
                self._out.put_nowait(RuntimeEvent("started", container))
            self._known[cid] = (container, started_at)

    async def _handle(self, event: Mapping[str, Any]) -> None:
        action = event.get("Action") or event.get("status")
        cid = event.get("id") or (event.get("Actor") or {}).get("ID") or ""
        known = self._known if self._known is not None else {}
        log.debug("docker event %s %s", action, cid[:12])
        if action == "start":
            if cid in known:
                return
            try:
                info = await self._rt._call(self._rt._client().inspect_container, cid)
            except (RuntimeFailure, *_ENGINE_ERRORS) as e:
                log.debug("started container %s gone before inspect: %s", cid[:12], _one_line(e))
                return
            if not info["State"].get("Running"):
                return
            container = self._rt._describe(info)
            if container.node != self._rt.node:
                return
            known[cid] = (container, info["State"].get("StartedAt", ""))
            self._out.put_nowait(RuntimeEvent("started", container))
        elif action in ("die", "stop", "destroy") and cid in known:
            self._out.put_nowait(RuntimeEvent("stopped", known.pop(cid)[0]))


def _after(started_at: str, moment: datetime) -> bool:
    """Whether Docker's State.StartedAt (RFC 3339, ns) is later than `moment`."""
    try:
        return datetime.fromisoformat(started_at.replace("Z", "+00:00")) > moment
    except ValueError:
        return False
