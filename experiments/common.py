"""What every experiment shares: its error type, SIGTERM as an interrupt, the generated sections
of docs/, and the private bus a live run talks over."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared import auth, children
from shared.core import registry
from shared.core.controller import finished_on_clock
from shared.natsd import NatsServer
from shared.settings import parse_policy_entry


class ExperimentError(Exception):
    """Bad input, or an experiment that cannot run here; one line (the CLI exits with status 2)."""


def checked_entry(entry: str, usable: Sequence[str], refused: str, prefix: str = "") -> tuple[str, dict[str, float]]:
    """`POLICY[:NAME=VALUE...]` as its policy and settings, or an ExperimentError (after `prefix`, the
    option that named it) for an entry not so written, a policy not in `usable` (`refused` says why),
    or a setting the policy does not have or refuses."""
    try:
        policy, settings = parse_policy_entry(entry)
    except ValueError as e:
        raise ExperimentError(f"{prefix}{e}") from None
    if policy not in usable:
        raise ExperimentError(f"{prefix}{policy!r} {refused} (choose from {', '.join(usable)})")
    try:
        registry.check_names(policy, settings)
        registry.params_for(policy, settings)
    except ValueError as e:
        raise ExperimentError(f"{prefix}{entry}: {e}") from None
    return policy, settings


def record_stem(label: str) -> str:
    """The file and directory name of a policy's records in a real run: its label (`learned:half_life_s=0`)
    without colons, which `docker run -v SRC:DST` would read as separators."""
    return label.replace(":", "+")


def batch_finished_s(row: Mapping[str, Any], read_s: float | None = None) -> float:
    """When a recorded batch row finished, on the run's clock: read at `read_s` (default: its `t_s`), less
    the lag its `finished_s` stamp gives (records since 27 Nov have one), by the rule the worker stamps
    batches with (`finished_on_clock`: a lag that is not positive or is too long is not believed)."""
    read = row["t_s"] if read_s is None else read_s
    finished = row.get("finished_s")
    return read if finished is None else finished_on_clock(read, read - finished)


def read_record(path: Path) -> list[dict[str, Any]]:
    """The rows of one policy's record of a real run (JSON lines, as `dqoes experiment real --out`
    writes them). ValueError naming the file and line of a row that is not JSON."""
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            raise ValueError(f"{path}:{i}: not a JSON record ({e})") from None
    return rows


@contextlib.contextmanager
def reading_back(from_file: str | None, what: str, option: str = "--from") -> Iterator[None]:
    """Around the code that reads back an earlier run's output (`--from FILE`): a file not shaped as
    `what` says (a missing key, a value of another type) is an ExperimentError naming the file (after
    `option`, the command-line option that named it; "" for a plain argument), before anything is
    written. Without `from_file` nothing is caught: the data is the run's own."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        if not from_file:
            raise
        raise ExperimentError(f"{_named(from_file, option)}: not {what} ({type(e).__name__}: {e})") from None


def read_back_json(from_file: str, what: str, option: str = "--from") -> dict[str, Any]:
    """The JSON object an earlier run wrote (`--from FILE`): a file that cannot be read, is not JSON or
    holds no object is an ExperimentError naming the file (as `reading_back` does), before anything is
    written."""
    try:
        d = json.loads(Path(from_file).read_text())
    except (OSError, ValueError) as e:
        raise ExperimentError(f"{_named(from_file, option)}: {e}") from None
    if not isinstance(d, dict):
        raise ExperimentError(f"{_named(from_file, option)}: not {what} (a JSON {type(d).__name__}, not an object)")
    return d


def _named(path: str, option: str) -> str:
    return f"{option} {path}" if option else path


def update_section(path: Path, block: str, begin: str, end: str) -> None:
    """Replace the generated block between `begin` and `end` in a Markdown file (or append it)."""
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        a = text.index(begin)
        b = text.index(end) + len(end)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or "" where there is none (recorded beside measurements)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""


def busy_cores_s() -> float:
    """CPU-seconds the whole machine has been busy since boot (all processes, /proc/stat: every
    state but idle and iowait), to tell an experiment's own load from others'."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


INTERRUPTED = threading.Event()
"""A SIGTERM came. Its KeyboardInterrupt can be lost: raised inside a callback Python ignores
exceptions from (a fork's at-fork hooks, while a process is being started), it is printed and
dropped. Long waits call `check_interrupted` too."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a supervisor, `kill`, a test's timeout) cleans up as Ctrl-C does: it raises
    KeyboardInterrupt, where the default action would kill the process and leave what it started
    running. Only the main thread may set handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        INTERRUPTED.set()
        raise KeyboardInterrupt

    INTERRUPTED.clear()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        INTERRUPTED.clear()


def check_interrupted() -> None:
    """Raise the interrupt a SIGTERM asked for, if it was lost on the way."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


RUN_DIR_PREFIX = "dqoes-run-"
"""A live run's private directory in $TMPDIR: `dqoes-run-<pid>-<random>`."""


class PrivateNats:
    """The private nats-server (JetStream on) one live run talks over, with the project's
    authentication and per-role permissions, as every deployment has them (shared/auth.py).

    Why its own directory: a run's records (`--out`) are meant to be kept and shared, and a run's
    credentials and server state are not records. They live in a private temporary directory
    (mode 0700), removed by `close()`; only the server's log goes where the caller says (`log_path`;
    None: with the rest, removed too). Its name carries this process's PID: a run killed before it
    could remove it (`kill -9`) leaves it behind, and the next run removes those whose PID is gone."""

    def __init__(self, nodes: Sequence[str], log_path: Path | None = None) -> None:
        children.remove_stale_dirs(Path(tempfile.gettempdir()), RUN_DIR_PREFIX)  # of runs killed before
        self.dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))
        log_path = log_path if log_path is not None else self.dir / "nats-server.log"
        self.auth_dir = self.dir / "auth"
        try:
            auth.ensure(self.auth_dir, list(nodes))
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.server = NatsServer(jetstream=True, store_dir=str(self.dir / "jetstream"), log_path=str(log_path),
                                 config_file=auth.config_path(self.auth_dir))

    def start(self) -> str:
        """Start the server; returns its URL (without credentials)."""
        self.server.start()
        return self.server.url

    def creds(self, identity: str) -> Path:
        """The credentials file of `identity` (`manager`, `client`, `worker-<node>`, ...)."""
        return auth.creds_path(self.auth_dir, identity)

    def url_as(self, identity: str) -> str:
        """The server's URL naming `identity`'s credentials file, for a client in this process."""
        return auth.with_credentials(self.server.url, auth.load(self.creds(identity)))

    def close(self) -> None:
        """Stop the server and remove its credentials and store."""
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateNats:
        """Started, for one `with` block; closed (credentials removed) also when the start fails."""
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
