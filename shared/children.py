"""Child processes that die with the process that started them.

Why: `dqoes up` and `dqoes experiment real` start nats-server, the manager,
workers, the dashboard, and workers start inference processes. Each runs in
its own session (a Ctrl-C in the terminal reaches only the supervisor, which
stops them in order), so when the supervisor itself is killed (`kill -9`,
the OOM killer) nothing would stop them: a deployment runs on, unsupervised,
holding its ports, credentials and CPU limits. Linux's PR_SET_PDEATHSIG asks
the kernel to send a signal to the child when its parent dies; set in the
child between fork and exec (`preexec_fn`), it survives the exec and needs
no cooperation from the program (nats-server is a Go binary).

Two details: the signal follows the death of the *thread* that forked the
child, so it is asked for only from the main thread (which lives as long as
the process; every caller here starts children from it): a child started
from another thread is not tied, rather than killed when that thread ends
(a test's supervising thread); and a parent that dies between
fork and prctl would be missed, so the child checks that its parent is still
the one that forked it and kills itself otherwise.

Elsewhere than Linux `die_with_parent()` returns None (no preexec_fn).

What a killed process leaves on disk is named after its PID
(`remove_stale_dirs`): the next start removes what belongs to a dead one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn: Callable[..., int] = libc.prctl
    return fn


_PRCTL = _prctl()


def die_with_parent(sig: int = signal.SIGKILL, then: Callable[[], None] | None = None) -> Callable[[], None] | None:
    """A `preexec_fn` for subprocess.Popen: the child gets `sig` when this process dies; `then`
    (another preexec step, such as joining a cgroup) runs after. Just `then` where prctl is missing
    or off the main thread (module doc)."""
    if _PRCTL is None or threading.current_thread() is not threading.main_thread():
        return then
    prctl = _PRCTL
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os.kill(os.getpid(), signal.SIGKILL)
        if then is not None:
            then()

    return preexec


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts as gone)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def remove_stale_dirs(parent: Path, prefix: str) -> list[Path]:
    """Remove this user's `<parent>/<prefix><pid>-*` directories whose process is gone (a run killed
    before it could clean up); returns those removed. Others' directories and live ones are kept."""
    removed = []
    uid = os.geteuid()
    for d in parent.glob(f"{prefix}*-*"):
        pid_text = d.name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or alive(int(pid_text)):
            continue
        try:
            st = os.lstat(d)
        except OSError:
            continue
        if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed
