"""A whole DQoES deployment on one machine: a private nats-server, the manager, one worker per node.

`dqoes up` and the integration tests use it. Each service runs as its own
process (`python -m services.manager`, `python -m services.worker`), exactly
as in a compose or Swarm deployment; only the launching differs. Every
process logs to a file in the run directory, which also holds the scenario
the workers run (written out container by container, so all workers and any
later reader see the same workload).

Supervision (`supervise()`, called by `dqoes up` four times a second): a
service that exits without being asked is started again with the same
arguments after a backoff (1 s, doubling up to 30 s; back to 1 s once it has
run for a minute), and a dead nats-server is restarted with the same JetStream
store, so clients reconnect to the same URL and objectives are kept. That URL
is a front the stack holds for its whole life (shared/natsfront.py): the port
services connect to never falls free for another process to take, and the
front forwards only to a server it verified as its own child.
With `StackSpec.nats_servers` 3 the stack runs three clustered servers
instead (shared/natscluster.py), each behind fronts and restarted the same
way, the objectives bucket made in three copies before the manager starts,
and every service given the list of the three URLs.
Each restart is one log line (returned, and appended to `supervisor.log`).
Log files are bounded: one over `MAX_LOG_BYTES` is copied to `NAME.log.1`
and emptied (the process keeps appending to the same file).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared import auth, children, subjects
from shared.bus import Bus, BusError
from shared.natscluster import NatsCluster
from shared.natsd import NatsServer, NatsServerError
from shared.natsfront import NatsFront
from shared.ports import free_port, port_taken
from shared.scenarios.spec import Scenario, scenario_to_dict


@dataclass
class StackSpec:
    scenario: Scenario
    policy: str = "learned"
    seed: int = 1
    time_scale: float = 10.0
    start_delay_s: float = 3.0
    """Wall seconds between launching the workers and scenario time 0."""
    state_interval_s: float = 1.0
    label: str = ""
    extra_worker_args: list[str] = field(default_factory=list)
    runtime: str = "sim"
    """sim: simulated containers; cgroup: real inference processes in cgroups (root, torch)."""
    workload_batch: int = 100
    workload_resolution: int | None = None
    metrics: bool = False
    """Serve Prometheus metrics from the manager and every worker on free local ports."""
    on_stop: str = "restore"
    """What workers do with the limits on a clean stop: keep them, or restore the containers' own."""
    nats_servers: int = 1
    """1: one nats-server; 3 (or 5...): a cluster, the objectives bucket in 3 replicas (shared/natscluster.py)."""
    nats_listen: str = "127.0.0.1"
    """Where the front of a private server listens for clients (a control plane: its public address)."""
    nats_port: int = 0
    """The front's port (0: a free one)."""
    nats_config: str | None = None
    """The private server's config file (default: the authorization block of `auth_dir`); a member of
    a control plane on several hosts gives its own, which names its cluster and includes that block."""
    bucket_replicas: int | None = None
    """Copies of the objectives bucket the manager makes (default: 3 for a cluster, else 1)."""
    client_tls_ca: str | None = None
    """The private server takes clients over TLS only (its config says so): the CA its certificate
    chains to, which the stack's own services and URLs verify it against (services/cli/cptls.py)."""


BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
"""Waits before restarting a service that died; the last one repeats."""
HEALTHY_AFTER_S = 60.0
"""A service that ran this long before dying starts again from the first backoff."""
MAX_LOG_BYTES = 20 * 1024 * 1024
"""A log file over this size is rotated (one previous generation kept)."""


def _metrics_url(port: int) -> str:
    """Where a service started with `--metrics-port PORT --metrics-addr 127.0.0.1` serves its metrics."""
    return f"http://127.0.0.1:{port}/metrics"


class Stack:
    """Start with `start()`, stop with `stop()` (or use as a context manager)."""

    def __init__(self, spec: StackSpec, run_dir: str | Path | None = None, nats_url: str | None = None,
                 auth_dir: str | Path | None = None) -> None:
        """`nats_url` None: a private nats-server with authentication (credentials in
        `auth_dir`, default run_dir/auth). With `nats_url`, services connect with the
        credentials in `auth_dir` if given, else anonymously."""
        self.spec = spec
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix="dqoes-up-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._external_url = nats_url
        self.auth_dir: Path | None = Path(auth_dir) if auth_dir is not None else None
        if nats_url is None and self.auth_dir is None:
            self.auth_dir = self.run_dir / "auth"
        if self.auth_dir is not None:
            auth.ensure(self.auth_dir, [n.name for n in spec.scenario.nodes])
        self.nats: NatsServer | None = None
        self.front: NatsFront | None = None
        """Holds the port services connect to, for as long as this stack runs; forwards to `nats`."""
        self.cluster: NatsCluster | None = None
        """Instead of `nats` and `front`: several clustered servers (spec.nats_servers > 1)."""
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.start_at: float | None = None
        self._argv: dict[str, tuple[list[str], str]] = {}
        self._started_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._restart_at: dict[str, float] = {}
        self.restarts: dict[str, int] = {}
        """Restarts per service (and "nats-server") since start."""
        self.metrics_urls: dict[str, str] = {}
        """/metrics URL of the manager ("manager") and of each node's worker (by node name) when spec.metrics is set."""

    @property
    def plain_url(self) -> str:
        """The server's URL without credentials (printed, stored, given to services with --creds):
        the front's for a private server (shared/natsfront.py)."""
        if self._external_url:
            return self._external_url
        if self.cluster is not None:
            return self.cluster.url
        assert self.front is not None
        if self.spec.client_tls_ca is not None:  # loopback when the front listens everywhere
            host = "127.0.0.1" if self.front.host in ("", "0.0.0.0") else self.front.host
            return auth.with_tls_ca(f"tls://{host}:{self.front.port}", self.spec.client_tls_ca)
        return self.front.url

    def _upstream(self) -> tuple[int, int] | None:
        """Where the front forwards: the supervised server's private port and PID, while it runs."""
        n = self.nats
        try:
            return (n.port, n.pid) if n is not None and n.running and n.pid is not None else None
        except NatsServerError:  # between a restart's fork and its port
            return None

    @property
    def url(self) -> str:
        """The URL a client of this stack connects with: the `client` identity's credentials in it."""
        return self.client_url

    def creds_file(self, identity: str) -> Path | None:
        """The credentials file of an identity (`client`, `admin`, `worker-n1`...), None without auth."""
        return auth.creds_path(self.auth_dir, identity) if self.auth_dir is not None else None

    def url_for(self, identity: str) -> str:
        """The NATS URL naming that identity's credentials file (the bus reads the key from it)."""
        f = self.creds_file(identity)
        return auth.with_credentials(self.plain_url, auth.load(f) if f is not None else None)

    @property
    def client_url(self) -> str:
        return self.url_for("client")

    @property
    def name(self) -> str:
        return self.spec.label or self.spec.policy

    def log_path(self, proc: str) -> Path:
        return self.run_dir / f"{proc}.log"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def spawn(self, name: str, args: list[str], identity: str) -> None:
        """Start `python ARGS` as service `name` with `identity`'s credentials, supervised like the
        stack's own (a host role's worker: services.cli.serve)."""
        self._spawn(name, args, identity)

    def _spawn(self, name: str, args: list[str], identity: str) -> None:
        self._argv[name] = (list(args), identity)
        creds = self.creds_file(identity)
        if creds is not None:
            args = [*args, "--creds", str(creds)]
        log = self.log_path(name).open("ab")
        self.procs[name] = subprocess.Popen(
            [sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=self._env(),
            start_new_session=True, preexec_fn=children.die_with_parent(),  # gone with `dqoes up`
        )
        log.close()
        self._started_at[name] = time.monotonic()

    # -- supervision -------------------------------------------------------------------

    def supervise(self, now: float | None = None) -> list[str]:
        """Restart what died (after its backoff) and rotate big logs; one line per action."""
        now = time.monotonic() if now is None else now
        lines: list[str] = []
        if self.cluster is not None:
            lines += self.cluster.supervise()
        if self.nats is not None and not self.nats.running:
            status = self.nats.returncode
            try:
                old_port: int | None = self.nats.port if self.front is not None else None
            except NatsServerError:  # the last start failed before it had one
                old_port = None
            try:  # on a free private port: the old one may have been taken, the front's never is
                self.nats.release_port()
                self.nats.start()
                self.restarts["nats-server"] = self.restarts.get("nats-server", 0) + 1
                taken = old_port is not None and old_port != self.nats.port and port_taken(old_port)
                lines.append(f"nats-server exited (status {status}); restarted on {self.plain_url} "
                             f"with the same JetStream store (restart {self.restarts['nats-server']})"
                             + (f"; another process listens on its old private port {old_port}, and gets "
                                f"no connection from the front" if taken else ""))
            except Exception as e:  # try again on the next call
                lines.append(f"nats-server exited (status {status}) and did not start again: {e}")
        for name, p in list(self.procs.items()):
            code = p.poll()
            if code is None:
                continue
            due = self._restart_at.get(name)
            if due is None:
                ran_s = now - self._started_at.get(name, now)
                if ran_s >= HEALTHY_AFTER_S:
                    self._failures[name] = 0
                n = self._failures.get(name, 0)
                wait_s = BACKOFF_S[min(n, len(BACKOFF_S) - 1)]
                self._failures[name] = n + 1
                self._restart_at[name] = now + wait_s
                lines.append(f"{name} exited with status {code} after {ran_s:.0f} s; "
                             f"restarting in {wait_s:g} s (log: {self.log_path(name)})")
            elif now >= due:
                del self._restart_at[name]
                args, identity = self._argv[name]
                moved = self._fresh_metrics_port(args)
                self._spawn(name, args, identity)
                self.restarts[name] = self.restarts.get(name, 0) + 1
                lines.append(f"{name} restarted (pid {self.procs[name].pid}, restart {self.restarts[name]})"
                             + (f"; its metrics port {moved[0]} was taken, it serves them on {moved[1]}"
                                if moved else ""))
        self.rotate_logs()
        if lines:
            with (self.run_dir / "supervisor.log").open("a") as f:
                for line in lines:
                    f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
        return lines

    def _fresh_metrics_port(self, args: list[str]) -> tuple[int, int] | None:
        """Before a restart: a `--metrics-port` in `args` that something else now holds is replaced (in
        place, and in `metrics_urls`) by a free one, since a service that cannot listen exits; returns
        (old, new) when it did."""
        if "--metrics-port" not in args:
            return None
        i = args.index("--metrics-port") + 1
        old = int(args[i])
        if not port_taken(old):
            return None
        new = free_port()
        args[i] = str(new)
        for proc, url in self.metrics_urls.items():
            if url == _metrics_url(old):
                self.metrics_urls[proc] = _metrics_url(new)
        return old, new

    def rotate_logs(self, max_bytes: int = MAX_LOG_BYTES) -> list[Path]:
        """Copy each log over `max_bytes` to NAME.log.1 and empty it; returns those rotated."""
        rotated = []
        for path in [*self.run_dir.glob("*.log"), *self.run_dir.glob("nats-*.out")]:  # nats-server.out, nats-N.out
            try:
                if path.stat().st_size <= max_bytes:
                    continue
                old = path.with_name(path.name + ".1")
                with path.open("rb") as src, old.open("wb") as dst:
                    dst.write(src.read())
                with path.open("r+b") as f:  # writers append (O_APPEND): they continue at the new end
                    f.truncate(0)
                rotated.append(path)
            except OSError:
                continue
        return rotated

    def start_nats(self) -> None:
        if self._external_url is None and self.spec.nats_servers > 1 and self.cluster is None:
            assert self.auth_dir is not None
            self.cluster = NatsCluster(self.auth_dir, self.run_dir, self.spec.nats_servers).start()
            self._create_bucket(replicas=3)
            return
        if self._external_url is None and self.nats is None and self.cluster is None:
            assert self.auth_dir is not None
            self.nats = NatsServer(jetstream=True, store_dir=str(self.run_dir / "jetstream"),
                                   log_path=str(self.run_dir / "nats-server.out"),
                                   config_file=self.spec.nats_config or auth.config_path(self.auth_dir))
            self.nats.start()
            self.front = NatsFront(self._upstream, host=self.spec.nats_listen, port=self.spec.nats_port,
                                   upstream_host=self.nats.host).start()

    def _create_bucket(self, replicas: int, timeout_s: float = 30.0) -> None:
        """The objectives bucket, made before the manager starts (which uses it as it finds it): in
        `replicas` copies. `Bus.kv` waits while the cluster elects its JetStream leaders."""
        async def go() -> None:
            bus = await Bus.connect(self.url_for("store"), "stack-store", connect_timeout_s=5.0)
            try:
                await bus.kv(subjects.KV_OBJECTIVES, replicas=replicas, wait_s=timeout_s)
            except BusError as e:
                raise NatsServerError(f"objectives bucket not created in {timeout_s:g} s: {e}") from None
            finally:
                await bus.close()

        asyncio.run(go())

    def start(self, start_at: float | None = None) -> Stack:
        """Start everything; scenario time 0 falls at `start_at` (unix time; default: soon)."""
        s = self.spec
        scenario_file = self.run_dir / "scenario.json"
        scenario_file.write_text(json.dumps(scenario_to_dict(s.scenario), indent=1))
        self.start_nats()
        self.start_manager()
        self.start_at = start_at if start_at is not None else time.time() + s.start_delay_s
        for n in s.scenario.nodes:
            self.start_worker(n.name, scenario_file)
        return self

    def _metrics_args(self, proc: str) -> list[str]:
        if not self.spec.metrics:
            return []
        port = free_port()
        self.metrics_urls[proc] = _metrics_url(port)
        return ["--metrics-port", str(port), "--metrics-addr", "127.0.0.1"]

    def start_manager(self) -> None:
        # The objectives bucket on a connection of its own, the store identity's (shared/auth.py).
        store = self.creds_file("store")
        replicas = self.spec.bucket_replicas or (3 if self.cluster is not None else None)
        self._spawn("manager", ["-m", "services.manager", "--nats", self.plain_url, "--cluster-interval", "0.5",
                                *(["--store-creds", str(store)] if store is not None else []),
                                *(["--bucket-replicas", str(replicas)] if replicas else []),
                                *self._metrics_args("manager")], "manager")

    def start_worker(self, node: str, scenario_file: Path | None = None) -> None:
        s = self.spec
        scenario_file = scenario_file or self.run_dir / "scenario.json"
        if s.runtime == "cgroup":
            # Real processes run in wall time, from when their worker starts.
            runtime_args = ["--runtime", "cgroup", "--workload-batch", str(s.workload_batch)]
            if s.workload_resolution is not None:
                runtime_args += ["--workload-resolution", str(s.workload_resolution)]
        else:
            runtime_args = ["--runtime", "sim", "--time-scale", str(s.time_scale), "--start-at", repr(self.start_at)]
        self._spawn(f"worker-{node}", [
            "-m", "services.worker", "--nats", self.plain_url, "--node", node, "--policy", s.policy,
            "--scenario", str(scenario_file), "--seed", str(s.seed), *runtime_args,
            "--state-interval", str(s.state_interval_s), *self._metrics_args(node),
            "--on-stop", s.on_stop, "--state-dir", str(self.run_dir),
            *s.extra_worker_args,
        ], auth.identity_name("worker", node))

    def scenario_time_s(self, wall: float | None = None) -> float:
        """Scenario seconds at a wall time (now by default); negative before the start."""
        if self.start_at is None:
            return 0.0
        return ((time.time() if wall is None else wall) - self.start_at) * self.spec.time_scale

    def dead(self) -> dict[str, int]:
        """Processes that have exited, with their exit status."""
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop_process(self, name: str, timeout_s: float = 5.0) -> int | None:
        self._restart_at.pop(name, None)
        p = self.procs.pop(name, None)
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def stop(self) -> None:
        workers = [n for n in self.procs if n.startswith("worker-")]
        for n in workers + [n for n in self.procs if n not in workers]:
            self.stop_process(n)
        if self.nats is not None:
            self.nats.stop()
            self.nats = None
        if self.front is not None:
            self.front.close()
            self.front = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(self.run_dir.glob("*.log")))

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
