"""Small functions over the cgroup filesystem: CPU usage, CPU quotas, groups.

Why: Docker's stats() takes 1-2 s a call while the cgroup files answer at
once, and the cgroup runtime (no Docker) limits plain processes through the
same files. Both runtimes share these functions, so the v1 / v2 differences
live in one place:

- cgroup v1 (also "hybrid": v1 controllers plus a v2 tree at <root>/unified):
  usage in <root>/cpuacct/<group>/cpuacct.usage (ns), quota in
  <root>/cpu/<group>/cpu.cfs_quota_us over cpu.cfs_period_us (-1: none).
- cgroup v2: usage in <root>/<group>/cpu.stat (usage_usec), quota in
  <root>/<group>/cpu.max as "QUOTA PERIOD" or "max PERIOD".
- CPU weight (the share of contended CPU): cpu.shares in the cpu directory on
  v1 (2..262144, default 1024), cpu.weight on v2 (1..10000, default 100).
  Callers see one unit for both: a weight is a multiple of the kernel's
  default (1.0 = an untouched group, 2.0 = twice its share, 0.5 = half), and
  read_weight / write_weight convert to the version's raw number (2.0 is 2048
  on v1 and 200 on v2). The ranges differ: 1/512..256 on v1, 0.01..100 on v2
  (weight_scale(version) gives them); write_weight clamps into the range and
  returns what it set. CFS shares CPU between runnable sibling groups in
  proportion to their weights; a quota still caps a group whatever its weight.
- throttling, both versions: cpu.stat in the cpu directory counts CFS periods
  (`nr_periods`) and those in which the group ran out of quota
  (`nr_throttled`), with the time spent throttled (`throttled_time` in ns on
  v1, `throttled_usec` on v2).

The root is configurable: a worker running in a container sees the host's
tree wherever it was mounted (e.g. -v /sys/fs/cgroup:/host/cgroup:ro for
reading, rw for limiting). Quotas are in cores (1.5 = one and a half CPUs);
the conversion to fractions of a node is the caller's.
"""

from __future__ import annotations

import errno
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
"""CFS period used for every quota we write (Docker's default too)."""
MIN_QUOTA_US = 1_000
"""The kernel refuses quotas below 1 ms."""

Layout = Literal["v1", "v2", "hybrid"]


class CgroupError(OSError):
    """A cgroup file is missing, unreadable or holds something unexpected."""


@dataclass(frozen=True, slots=True)
class Group:
    """One cgroup as seen through the CPU controllers.

    On v1 the quota and the usage counter sit in two hierarchies (cpu and
    cpuacct, often the same directory through a symlink); on v2 both are in
    one directory.
    """

    version: Literal[1, 2]
    cpu_dir: Path
    """Holds the quota files: cpu.cfs_quota_us / cpu.cfs_period_us (v1) or cpu.max (v2)."""
    acct_dir: Path
    """Holds the usage counter: cpuacct.usage (v1) or cpu.stat (v2)."""

    def dirs(self) -> list[Path]:
        return [self.cpu_dir] if self.acct_dir == self.cpu_dir else [self.cpu_dir, self.acct_dir]


# ---- layout -----------------------------------------------------------------


def _v1_dir(root: Path, controller: str) -> Path | None:
    """The v1 hierarchy holding `controller` (cpu or cpuacct), under its usual names."""
    for name in (controller, "cpu,cpuacct", "cpuacct,cpu"):
        if (root / name).is_dir():
            return root / name
    return None


def detect_layout(root: Path | str = DEFAULT_ROOT) -> Layout:
    """v2 (unified only), v1 (legacy controllers only) or hybrid (v1 + <root>/unified)."""
    root = Path(root)
    if (root / "cgroup.controllers").is_file():
        return "v2"
    if _v1_dir(root, "cpu") is None:
        raise CgroupError(errno.ENOENT, "no cgroup cpu controller found", str(root))
    if (root / "unified" / "cgroup.controllers").is_file():
        return "hybrid"
    return "v1"


def cpu_version(root: Path | str = DEFAULT_ROOT) -> Literal[1, 2]:
    """Which hierarchy controls CPU: 1 for v1 and hybrid, 2 for unified."""
    return 2 if detect_layout(root) == "v2" else 1


def group_at(root: Path | str, rel: str, version: Literal[1, 2] | None = None) -> Group:
    """The group at path `rel` (relative to each hierarchy's root; need not exist)."""
    root = Path(root)
    version = version or cpu_version(root)
    rel = rel.strip("/")
    if version == 2:
        return Group(2, root / rel, root / rel)
    cpu = _v1_dir(root, "cpu")
    acct = _v1_dir(root, "cpuacct") or cpu
    if cpu is None or acct is None:
        raise CgroupError(errno.ENOENT, "no cgroup v1 cpu hierarchy", str(root))
    return Group(1, cpu / rel, acct / rel)


def exists(group: Group) -> bool:
    return all(d.is_dir() for d in group.dirs())


# ---- reading and writing ----------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError as e:
        raise CgroupError(errno.ENOENT, "cgroup file missing", str(path)) from e


def usage_s(group: Group) -> float:
    """Cumulative CPU time of every process that ran in the group, in seconds."""
    if group.version == 1:
        return int(_read(group.acct_dir / "cpuacct.usage").strip()) / 1e9
    for line in _read(group.acct_dir / "cpu.stat").splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise CgroupError(errno.EINVAL, "no usage_usec in cpu.stat", str(group.acct_dir))


@dataclass(frozen=True, slots=True)
class Throttling:
    """A group's cumulative CFS throttling counters (cpu.stat)."""

    periods: int
    """CFS periods in which the group had a quota and ran (nr_periods)."""
    throttled_periods: int
    """Of those, periods in which it used up its quota and waited (nr_throttled)."""
    throttled_s: float
    """Total time its threads waited for the next period, seconds."""


def throttling(group: Group) -> Throttling:
    """The group's throttling counters from cpu.stat (v1 and v2)."""
    fields: dict[str, int] = {}
    for line in _read(group.cpu_dir / "cpu.stat").splitlines():
        key, _, value = line.partition(" ")
        try:
            fields[key] = int(value)
        except ValueError:
            continue
    if "nr_periods" not in fields or "nr_throttled" not in fields:
        raise CgroupError(errno.EINVAL, "no nr_periods/nr_throttled in cpu.stat", str(group.cpu_dir))
    if "throttled_usec" in fields:
        throttled_s = fields["throttled_usec"] / 1e6
    else:
        throttled_s = fields.get("throttled_time", 0) / 1e9
    return Throttling(fields["nr_periods"], fields["nr_throttled"], throttled_s)


def read_quota_cores(group: Group) -> float | None:
    """The CPU quota in cores (quota / period), or None when unlimited."""
    if group.version == 1:
        quota_us = int(_read(group.cpu_dir / "cpu.cfs_quota_us").strip())
        period_us = int(_read(group.cpu_dir / "cpu.cfs_period_us").strip())
    else:
        quota, _, period = _read(group.cpu_dir / "cpu.max").strip().partition(" ")
        if quota == "max":
            return None
        quota_us, period_us = int(quota), int(period or PERIOD_US)
    if quota_us < 0:
        return None
    return quota_us / period_us


def quota_us_for(cores: float | None) -> int:
    """The quota (µs per PERIOD_US) for `cores`; -1 for None (unlimited)."""
    if cores is None:
        return -1
    if not math.isfinite(cores) or cores <= 0:
        raise ValueError(f"a CPU quota must be a positive number of cores, not {cores!r}")
    return max(MIN_QUOTA_US, round(cores * PERIOD_US))


def write_quota_cores(group: Group, cores: float | None) -> float | None:
    """Set the group's quota to `cores` (None: unlimited); return the quota now set, in cores."""
    quota_us = quota_us_for(cores)
    if group.version == 1:
        quota_file = group.cpu_dir / "cpu.cfs_quota_us"
        period_file = group.cpu_dir / "cpu.cfs_period_us"
        if int(_read(period_file).strip()) != PERIOD_US:
            # Lift the quota first: a period change may otherwise be refused.
            quota_file.write_text("-1")
            period_file.write_text(str(PERIOD_US))
        quota_file.write_text(str(quota_us))
    else:
        text = f"max {PERIOD_US}" if quota_us < 0 else f"{quota_us} {PERIOD_US}"
        (group.cpu_dir / "cpu.max").write_text(text)
    log.debug("cgroup %s quota set to %s µs / %s µs", group.cpu_dir, quota_us, PERIOD_US)
    return None if quota_us < 0 else quota_us / PERIOD_US


# ---- CPU weights ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WeightScale:
    """How one cgroup version writes a CPU weight: the file and its raw range."""

    file: str
    min_raw: int
    default_raw: int
    max_raw: int

    @property
    def min_weight(self) -> float:
        """The smallest weight the kernel takes, as a multiple of its default."""
        return self.min_raw / self.default_raw

    @property
    def max_weight(self) -> float:
        """The largest weight the kernel takes, as a multiple of its default."""
        return self.max_raw / self.default_raw

    def raw_for(self, weight: float) -> int:
        """The raw value for `weight` (a multiple of the default), clamped into the valid range."""
        if not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(f"a CPU weight must be a positive multiple of the default, not {weight!r}")
        return min(self.max_raw, max(self.min_raw, round(weight * self.default_raw)))


WEIGHT_SCALES: dict[int, WeightScale] = {
    1: WeightScale("cpu.shares", 2, 1024, 262_144),
    2: WeightScale("cpu.weight", 1, 100, 10_000),
}
DEFAULT_WEIGHT = 1.0
"""Every group's weight until someone writes one: the kernel default, in our unit."""


def weight_scale(version: Literal[1, 2]) -> WeightScale:
    return WEIGHT_SCALES[version]


def weight_for_share(version: Literal[1, 2], share: float | None) -> float:
    """The weight that follows a limit of `share` of the node (None: no limit, the default weight).

    The kernel's maximum x share, clamped to the valid range: siblings so weighted
    share contended CPU in proportion to their limits, so within each CFS period
    they reach their quotas together and a large quota is not cut short by
    small ones, while an unweighted neighbour keeps only what the quotas leave.
    """
    if share is None:
        return DEFAULT_WEIGHT
    if not (math.isfinite(share) and share > 0):
        raise ValueError(f"a limit must be a positive fraction of the node, not {share!r}")
    scale = WEIGHT_SCALES[version]
    return scale.raw_for(scale.max_weight * share) / scale.default_raw


def read_weight_raw(group: Group) -> int:
    """The group's weight as the kernel shows it (cpu.shares on v1, cpu.weight on v2)."""
    path = group.cpu_dir / WEIGHT_SCALES[group.version].file
    text = _read(path).strip()
    try:
        return int(text)
    except ValueError:
        raise CgroupError(errno.EINVAL, f"not a weight: {text!r}", str(path)) from None


def read_weight(group: Group) -> float:
    """The group's CPU weight as a multiple of the kernel's default (1.0 when untouched)."""
    return read_weight_raw(group) / WEIGHT_SCALES[group.version].default_raw


def write_weight(group: Group, weight: float) -> float:
    """Set the group's CPU weight (a multiple of the default, clamped to the valid range); return it as set.

    Raises ValueError (and writes nothing) for a weight that is not a
    positive finite number.
    """
    scale = WEIGHT_SCALES[group.version]
    raw = scale.raw_for(weight)
    path = group.cpu_dir / scale.file
    if not path.exists():
        raise CgroupError(errno.ENOENT, "cgroup file missing", str(path))
    path.write_text(str(raw))
    log.debug("cgroup %s weight set to %d (%s)", group.cpu_dir, raw, scale.file)
    return raw / scale.default_raw


# ---- creating groups and moving processes -------------------------------------


def _enable_cpu_v2(root: Path, rel: str) -> None:
    """On v2, the cpu controller must be enabled in every ancestor's subtree_control."""
    parts = [p for p in rel.split("/") if p]
    node = root
    for part in parts:
        control = node / "cgroup.subtree_control"
        if "cpu" not in _read(control).split():
            control.write_text("+cpu")
        node = node / part


def create_group(root: Path | str, rel: str) -> Group:
    """Create the group `rel` (and its parents) under every CPU hierarchy; fine if it exists.

    Raises PermissionError (or another OSError) when the tree is not writable.
    """
    group = group_at(root, rel)
    for d in group.dirs():
        d.mkdir(parents=True, exist_ok=True)
    if group.version == 2:
        _enable_cpu_v2(Path(root), rel)
    log.debug("cgroup %s created", group.cpu_dir)
    return group


def remove_group(group: Group) -> bool:
    """Remove the group and its empty subgroups, deepest first.

    Only directories are removed (cgroup control files go with them). Returns
    False when a group still holds processes (EBUSY) or is gone already.
    """
    removed = True
    for d in group.dirs():
        if not d.is_dir():
            continue
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            removed &= _rmdir(sub)
        removed &= _rmdir(d)
    return removed


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
        return True
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno == errno.ENOTEMPTY:
            # Only a plain directory says ENOTEMPTY (a test tree: its "control
            # files" are real files); a cgroup with processes says EBUSY.
            for f in path.iterdir():
                if f.is_file():
                    f.unlink()
            path.rmdir()
            return True
        if e.errno == errno.EBUSY:
            log.debug("cgroup %s not removed: still has processes", path)
            return False
        raise


def add_pid(group: Group, pid: int) -> None:
    """Move process `pid` (all its threads) into the group, in every CPU hierarchy."""
    for d in group.dirs():
        (d / "cgroup.procs").write_text(str(pid))
    log.debug("pid %d moved to cgroup %s", pid, group.cpu_dir)


def pids(group: Group) -> list[int]:
    """The processes in the group (its own, not its subgroups')."""
    return [int(x) for x in _read(group.cpu_dir / "cgroup.procs").split()]


# ---- finding a Docker container's group -----------------------------------------


def docker_group(
    root: Path | str,
    container_id: str,
    pid: int | None = None,
    proc_root: Path | str = "/proc",
) -> Group:
    """The cgroup of a Docker container, from its full id.

    Tries the cgroupfs driver's <ctrl>/docker/<id>, then the systemd driver's
    <ctrl>/system.slice/docker-<id>.scope (each for v1 and v2); failing both
    (a nested daemon, a custom --cgroup-parent), reads /proc/<pid>/cgroup of
    the container's main process. Raises CgroupError when none is found.
    """
    root = Path(root)
    version = cpu_version(root)
    for rel in (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope"):
        group = group_at(root, rel, version)
        if exists(group):
            return group
    if pid:
        by_pid = group_of_pid(root, pid, proc_root)
        if by_pid is not None and exists(by_pid):
            return by_pid
    raise CgroupError(errno.ENOENT, f"no cgroup found for container {container_id[:12]}", str(root))


def group_of_pid(root: Path | str, pid: int, proc_root: Path | str = "/proc") -> Group | None:
    """The CPU group of a process, from /proc/<pid>/cgroup (None if it is gone)."""
    root = Path(root)
    version = cpu_version(root)
    try:
        text = (Path(proc_root) / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    cpu_rel = acct_rel = v2_rel = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        names = controllers.split(",")
        if hid == "0" and controllers == "":
            v2_rel = path
        if "cpu" in names:
            cpu_rel = path
        if "cpuacct" in names:
            acct_rel = path
    if version == 2:
        return None if v2_rel is None else group_at(root, v2_rel, 2)
    if cpu_rel is None:
        return None
    cpu = group_at(root, cpu_rel, 1)
    acct = group_at(root, acct_rel or cpu_rel, 1)
    return Group(1, cpu.cpu_dir, acct.acct_dir)
