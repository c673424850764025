"""How many CPUs this process may use, read from its own cgroup CPU quota.

Why this exists: DQoES changes a container's CPU quota while it runs, and an
inference process must follow with its thread count. Two intra-op threads
under a 1-CPU quota are up to 2x slower than one (see shared/ENVIRONMENT.md),
so the workload sets max(1, floor(limit_cores)) threads before each batch.
Reading the cgroup files costs microseconds, so doing it every batch is free.

No torch here, so a controller or a test can use it without the workload
extra. The file locations are parameters so tests can point them at a fake
tree in a temporary directory.

Where the quota is:

* cgroup v1: /proc/self/cgroup has a line "N:cpu,cpuacct:/docker/<id>"; the
  files are cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us under the cpu
  controller's mount (/sys/fs/cgroup/cpu, or cpu,cpuacct). On the host the
  group is that mount plus the path; inside a Docker container (no cgroup
  namespace) the path names a directory that does not exist there, because
  the container's own group is mounted at the controller's root: fall back
  to the root.
* cgroup v2: the line is "0::/path"; the file is cpu.max, "max 100000" (none)
  or "50000 100000" (0.5 CPU), under /sys/fs/cgroup (or /sys/fs/cgroup/unified
  on hybrid hosts, where the cpu controller usually stays on v1).

A quota on any ancestor also limits the process, so the smallest quota from
the group up to the mount root is the limit. The v1 cpu controller wins when
present (hybrid hosts). Mounts are found by these conventional names, not by
parsing /proc/self/mountinfo.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from shared.core.profiles import whole_threads

PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v1_limit_cores(group: Path) -> float | None:
    quota, period = _read_text(group / "cpu.cfs_quota_us"), _read_text(group / "cpu.cfs_period_us")
    try:
        quota_us, period_us = int(quota or ""), int(period or "")
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:  # -1 means no quota
        return None
    return quota_us / period_us


def _v2_limit_cores(group: Path) -> float | None:
    fields = (_read_text(group / "cpu.max") or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota_us, period_us = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def _group_and_ancestors(mount: Path, cgroup_path: str) -> Iterator[Path]:
    group = mount / cgroup_path.lstrip("/")
    if not group.is_dir():
        group = mount  # in a container: our group is mounted at the root
    yield group
    while group != mount and mount in group.parents:
        group = group.parent
        yield group


def _smallest_limit(
    mount: Path, cgroup_path: str, reader: Callable[[Path], float | None]
) -> float | None:
    limits = [x for g in _group_and_ancestors(mount, cgroup_path) if (x := reader(g)) is not None]
    return min(limits) if limits else None


def read_cpu_limit_cores(
    proc_cgroup: Path | str = PROC_SELF_CGROUP, cgroup_root: Path | str = CGROUP_ROOT
) -> float | None:
    """The CPU quota of this process's cgroup in cores (1.5 = 150 ms per 100 ms), or None if unlimited or unknown."""
    text = _read_text(Path(proc_cgroup))
    if text is None:
        return None
    root = Path(cgroup_root)
    v1: tuple[str, str] | None = None  # (controller list, path)
    v2_path: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1 = (controllers, path)

    if v1 is not None:
        controllers, path = v1
        for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
            mount = root / name
            if mount.is_dir():
                return _smallest_limit(mount, path, _v1_limit_cores)
    if v2_path is not None:
        for mount in (root, root / "unified"):
            if mount.is_dir():
                limit = _smallest_limit(mount, v2_path, _v2_limit_cores)
                if limit is not None:
                    return limit
    return None


def available_cpus() -> int:
    """CPUs this process may be scheduled on (its affinity mask, e.g. docker --cpuset-cpus), else os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_for(limit_cores: float | None, cpus: int, default_threads: int = 1) -> int:
    """Intra-op threads for a CPU limit: max(1, floor(limit_cores)), or `default_threads` with no limit; at most `cpus`.

    The default is 1 because on this 2-core machine two threads help only at
    limits >= 1.5 CPUs, and two 2-thread services on 2 cores cost ~2x the CPU
    a batch (shared/ENVIRONMENT.md).
    """
    if limit_cores is None:
        threads = default_threads
    else:
        threads = whole_threads(limit_cores)
    return max(1, min(threads, cpus))
