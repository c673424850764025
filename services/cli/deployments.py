"""Which `dqoes up` deployments run on this machine, and one data directory for one of them.

Why: the CLI finds a deployment without --nats by reading where `dqoes up`
said its NATS server is. With one shared pointer file, a second `dqoes up`
overwrote the first's and, when it stopped, deleted the pointer the CLI used
to find the other. So each `dqoes up` writes its own pointer,
`$DQOES_STATE_DIR/deployments/<pid>.json` (data directory, stacks, NATS
URLs, credentials directory), removes it when it stops, and pointers whose
process is gone (or no longer holds its data directory's lock: the PID was
reused) are ignored and removed. When more than one deployment
answers, the CLI names them and asks for `--deployment PID`.

Two `dqoes up` on one data directory would share its JetStream store and
credentials: `lock_data_dir` takes an exclusive `flock` on
`<data dir>/dqoes-up.lock` (holding the PID) for the life of the process, and
a second one is refused with the PID of the first. The lock goes with the
process, however it ends; children do not inherit it (close-on-exec).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

import orjson

from shared import authfiles, children

LOCK_NAME = "dqoes-up.lock"
POINTERS = "deployments"


class DeploymentError(Exception):
    """A data directory in use, or a deployment that cannot be chosen; the text says which."""


def state_dir() -> Path:
    base = os.environ.get("DQOES_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "dqoes")
    return Path(base)


def lock_data_dir(data_dir: Path) -> int:
    """Hold `<data_dir>/dqoes-up.lock` for this process; returns the descriptor (keep it open).
    DeploymentError naming the PID that holds it."""
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DeploymentError(f"data directory {data_dir} is in use by another `dqoes up` (PID {holder}); "
                              f"stop it, or give this one another --data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _pointers_dir() -> Path:
    return state_dir() / POINTERS


def pointers_dir() -> Path:
    """Where the pointers go, created and checked (like a credentials directory: a pointer names one,
    and a forged pointer would send the CLI's credentials elsewhere); DeploymentError if unsafe."""
    try:
        return authfiles.secure_dir(_pointers_dir())
    except authfiles.UnsafePathError as e:
        raise DeploymentError(str(e)) from None


def write_pointer(data_dir: Path, stacks: list[dict[str, Any]]) -> Path:
    """This process's pointer file (private to the user: it names the credentials directory)."""
    d = pointers_dir()
    path = d / f"{os.getpid()}.json"
    authfiles.write_private(path, orjson.dumps({
        "pid": os.getpid(), "started_at": time.time(), "data_dir": str(data_dir), "stacks": stacks,
    }).decode())
    return path


def remove_pointer() -> None:
    try:
        (_pointers_dir() / f"{os.getpid()}.json").unlink()
    except OSError:
        pass


def running() -> list[dict[str, Any]]:
    """The deployments whose process is alive, oldest first; pointers of dead ones are removed.
    Only this user's pointer files count."""
    out = []
    d = _pointers_dir()
    uid = os.geteuid()
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            if os.lstat(p).st_uid != uid:
                continue
            info = orjson.loads(authfiles.read_private(p))
            pid = int(info["pid"])
            stacks = [s for s in info["stacks"] if isinstance(s, dict)]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not (children.alive(pid) and _locked(info.get("data_dir"))):  # gone, or its PID reused
            p.unlink(missing_ok=True)
            continue
        out.append({**info, "stacks": stacks})
    return sorted(out, key=lambda i: float(i.get("started_at") or 0))


def _locked(data_dir: object) -> bool:
    """Whether some process holds the data directory's lock (a running `dqoes up` does)."""
    if not isinstance(data_dir, str):
        return False
    try:
        fd = os.open(Path(data_dir) / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # a shared lock we took goes with the descriptor
    return False


def describe(info: dict[str, Any]) -> str:
    urls = ", ".join(str(s.get("nats_url")) for s in info["stacks"])
    return f"{info['pid']} (data dir {info.get('data_dir')}, NATS {urls})"


def choose(deployment: str | None) -> dict[str, Any] | None:
    """The deployment the CLI talks to: `deployment` (a PID or a data directory) if given, else the only
    one running, else None when none runs; DeploymentError naming them when several do."""
    found = running()
    if deployment:
        for info in found:
            if deployment == str(info["pid"]) or (
                    info.get("data_dir") and os.path.realpath(deployment) == os.path.realpath(info["data_dir"])):
                return info
        raise DeploymentError(f"--deployment {deployment}: no such deployment running"
                              + (f" (running: {'; '.join(describe(i) for i in found)})" if found else ""))
    if len(found) > 1:
        raise DeploymentError(f"{len(found)} deployments are running: {'; '.join(describe(i) for i in found)}; "
                              f"pick one with --deployment PID")
    return found[0] if found else None


def holder(data_dir: Path) -> int | None:
    """The PID of the process that holds `data_dir`'s lock (a running `dqoes up` or `dqoes serve`),
    None when none does."""
    if not _locked(str(data_dir)):
        return None
    try:
        return int(authfiles.read_private(data_dir / LOCK_NAME).strip())
    except (OSError, ValueError, authfiles.UnsafePathError):
        return None
