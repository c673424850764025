"""Re-run the process under jemalloc, which torch inference needs on this machine.

Why this exists: with glibc's malloc, ResNet-50 224 px batch 100 took 28 s
instead of 8 s, page-faulting on every large activation tensor; jemalloc
configured to keep freed memory (no decay) removes that
(shared/ENVIRONMENT.md). The allocator must be chosen before the process
starts, so `reexec_with_jemalloc()` replaces the process with itself plus
LD_PRELOAD. Call it first thing, before torch is imported.

Nothing happens when LD_PRELOAD is already set (the user chose, or this is
the re-executed process), when no libjemalloc.so.2 exists (Debian package
libjemalloc2), or when DQOES_NO_JEMALLOC is set to anything but "" or "0".
An existing MALLOC_CONF is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping

OPT_OUT_ENV = "DQOES_NO_JEMALLOC"
MALLOC_CONF = "oversize_threshold:0,dirty_decay_ms:-1,muzzy_decay_ms:-1"
JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)


def find_jemalloc(candidates: Iterable[str] = JEMALLOC_PATHS) -> str | None:
    return next((p for p in candidates if os.path.isfile(p)), None)


def jemalloc_env(
    environ: Mapping[str, str], candidates: Iterable[str] = JEMALLOC_PATHS
) -> dict[str, str] | None:
    """The environment to re-exec with, or None when the process should run as it is."""
    if environ.get(OPT_OUT_ENV, "") not in ("", "0"):
        return None
    if environ.get("LD_PRELOAD"):
        return None
    lib = find_jemalloc(candidates)
    if lib is None:
        return None
    env = dict(environ)
    env["LD_PRELOAD"] = lib
    env.setdefault("MALLOC_CONF", MALLOC_CONF)
    return env


def reexec_with_jemalloc(opt_out: bool = False) -> None:
    """Replace this process with itself under jemalloc, when jemalloc_env says so; else return."""
    if opt_out:
        return
    env = jemalloc_env(os.environ)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # orig_argv keeps "-m package.module" (or "-c ..."), unlike sys.argv.
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def jemalloc_loaded() -> bool:
    """Whether libjemalloc is mapped into this process."""
    try:
        with open("/proc/self/maps") as f:
            return any("libjemalloc" in line for line in f)
    except OSError:
        return False
