"""cgroupfs against imitation trees (v1, hybrid, v2; cgroupfs and systemd drivers), then the real one.

The imitation trees are plain directories holding the files the kernel would
show, so these run anywhere; the last tests use /sys/fs/cgroup and need root.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shared.runtime import cgroupfs

CID = "f" * 16 + "0123456789abcdef" * 3


def v1_tree(root: Path, hybrid: bool = False, combined: bool = False) -> Path:
    """A v1 layout: cpu and cpuacct hierarchies (or one cpu,cpuacct with symlinks)."""
    if combined:
        (root / "cpu,cpuacct").mkdir(parents=True)
        (root / "cpu").symlink_to("cpu,cpuacct")
        (root / "cpuacct").symlink_to("cpu,cpuacct")
    else:
        (root / "cpu").mkdir(parents=True)
        (root / "cpuacct").mkdir(parents=True)
    if hybrid:
        (root / "unified").mkdir()
        (root / "unified" / "cgroup.controllers").write_text("")
    return root


def v1_group(root: Path, rel: str, quota_us: int = -1, usage_ns: int = 0) -> None:
    cpu, acct = root / "cpu" / rel, root / "cpuacct" / rel
    cpu.mkdir(parents=True, exist_ok=True)
    acct.mkdir(parents=True, exist_ok=True)
    (cpu / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "cgroup.procs").write_text("")
    (acct / "cpuacct.usage").write_text(f"{usage_ns}\n")
    (acct / "cgroup.procs").write_text("")


def v2_tree(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("memory\n")
    return root


def v2_group(root: Path, rel: str, cpu_max: str = "max 100000", usage_usec: int = 0) -> None:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.max").write_text(cpu_max + "\n")
    (d / "cpu.stat").write_text(f"usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 2\n")
    (d / "cgroup.procs").write_text("")
    (d / "cgroup.subtree_control").write_text("")


# ---- layouts ------------------------------------------------------------------


def test_detects_v1_hybrid_and_v2(tmp_path):
    assert cgroupfs.detect_layout(v1_tree(tmp_path / "a")) == "v1"
    assert cgroupfs.detect_layout(v1_tree(tmp_path / "b", hybrid=True)) == "hybrid"
    assert cgroupfs.detect_layout(v2_tree(tmp_path / "c")) == "v2"
    assert cgroupfs.cpu_version(tmp_path / "b") == 1
    assert cgroupfs.cpu_version(tmp_path / "c") == 2
    with pytest.raises(cgroupfs.CgroupError):
        cgroupfs.detect_layout(tmp_path)  # nothing there


def test_v1_combined_hierarchy_is_one_directory(tmp_path):
    root = v1_tree(tmp_path, combined=True)
    group = cgroupfs.group_at(root, "docker/x")
    assert group.version == 1
    assert group.cpu_dir == root / "cpu" / "docker/x"


# ---- usage and quotas ------------------------------------------------------------


def test_v1_usage_and_quota(tmp_path):
    root = v1_tree(tmp_path)
    v1_group(root, "g", quota_us=50_000, usage_ns=2_500_000_000)
    group = cgroupfs.group_at(root, "g")
    assert cgroupfs.usage_s(group) == pytest.approx(2.5)
    assert cgroupfs.read_quota_cores(group) == pytest.approx(0.5)

    assert cgroupfs.write_quota_cores(group, 1.25) == pytest.approx(1.25)
    assert (root / "cpu/g/cpu.cfs_quota_us").read_text() == "125000"
    assert cgroupfs.write_quota_cores(group, None) is None
    assert (root / "cpu/g/cpu.cfs_quota_us").read_text() == "-1"
    assert cgroupfs.read_quota_cores(group) is None


def test_v1_quota_resets_a_foreign_period(tmp_path):
    root = v1_tree(tmp_path)
    v1_group(root, "g")
    (root / "cpu/g/cpu.cfs_period_us").write_text("250000\n")
    group = cgroupfs.group_at(root, "g")
    cgroupfs.write_quota_cores(group, 0.5)
    assert (root / "cpu/g/cpu.cfs_period_us").read_text() == "100000"
    assert cgroupfs.read_quota_cores(group) == pytest.approx(0.5)


def test_v2_usage_and_quota(tmp_path):
    root = v2_tree(tmp_path)
    v2_group(root, "g", cpu_max="150000 100000", usage_usec=3_000_000)
    group = cgroupfs.group_at(root, "g")
    assert cgroupfs.usage_s(group) == pytest.approx(3.0)
    assert cgroupfs.read_quota_cores(group) == pytest.approx(1.5)
    cgroupfs.write_quota_cores(group, 0.25)
    assert (root / "g/cpu.max").read_text() == "25000 100000"
    cgroupfs.write_quota_cores(group, None)
    assert (root / "g/cpu.max").read_text() == "max 100000"
    assert cgroupfs.read_quota_cores(group) is None


def test_quota_floor_and_bad_values():
    assert cgroupfs.quota_us_for(0.001) == cgroupfs.MIN_QUOTA_US
    assert cgroupfs.quota_us_for(None) == -1
    assert cgroupfs.quota_us_for(2.0) == 200_000
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            cgroupfs.quota_us_for(bad)


def test_missing_files_raise_cgroup_error(tmp_path):
    root = v1_tree(tmp_path)
    group = cgroupfs.group_at(root, "absent")
    with pytest.raises(cgroupfs.CgroupError):
        cgroupfs.usage_s(group)
    with pytest.raises(cgroupfs.CgroupError):
        cgroupfs.read_quota_cores(group)
    v2 = cgroupfs.group_at(v2_tree(tmp_path / "v2"), "g")
    v2.cpu_dir.mkdir()
    (v2.cpu_dir / "cpu.stat").write_text("user_usec 1\n")
    with pytest.raises(cgroupfs.CgroupError):
        cgroupfs.usage_s(v2)


# ---- groups and processes ----------------------------------------------------------


def test_v1_create_move_remove(tmp_path):
    root = v1_tree(tmp_path)
    group = cgroupfs.create_group(root, "dqoes/w1")
    assert (root / "cpu/dqoes/w1").is_dir() and (root / "cpuacct/dqoes/w1").is_dir()
    cgroupfs.add_pid(group, 4242)
    assert (root / "cpu/dqoes/w1/cgroup.procs").read_text() == "4242"
    assert (root / "cpuacct/dqoes/w1/cgroup.procs").read_text() == "4242"
    assert cgroupfs.pids(group) == [4242]
    parent = cgroupfs.group_at(root, "dqoes")
    assert cgroupfs.remove_group(parent)
    assert not (root / "cpu/dqoes").exists() and not (root / "cpuacct/dqoes").exists()


def test_v2_create_enables_the_cpu_controller_on_the_way_down(tmp_path):
    root = v2_tree(tmp_path)
    (root / "dqoes").mkdir()
    (root / "dqoes" / "cgroup.subtree_control").write_text("")
    group = cgroupfs.create_group(root, "dqoes/w1")
    assert group.cpu_dir == root / "dqoes/w1"
    assert "+cpu" in (root / "cgroup.subtree_control").read_text()
    assert "+cpu" in (root / "dqoes/cgroup.subtree_control").read_text()


# ---- locating a container's group ------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "rel"),
    [
        ("v1", f"docker/{CID}"),
        ("v1", f"system.slice/docker-{CID}.scope"),
        ("hybrid", f"docker/{CID}"),
        ("v2", f"docker/{CID}"),
        ("v2", f"system.slice/docker-{CID}.scope"),
    ],
)
def test_docker_group_for_both_drivers(tmp_path, layout, rel):
    if layout == "v2":
        root = v2_tree(tmp_path)
        v2_group(root, rel, usage_usec=1_000_000)
    else:
        root = v1_tree(tmp_path, hybrid=layout == "hybrid")
        v1_group(root, rel, usage_ns=1_000_000_000)
    group = cgroupfs.docker_group(root, CID)
    assert str(group.cpu_dir).endswith(rel)
    assert cgroupfs.usage_s(group) == pytest.approx(1.0)


def test_docker_group_falls_back_to_proc_pid_cgroup(tmp_path):
    root = v1_tree(tmp_path / "cg")
    rel = f"nested/daemon/docker/{CID}"
    v1_group(root, rel, quota_us=20_000)
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cgroup").write_text(
        f"12:pids:/{rel}\n4:cpu,cpuacct:/{rel}\n1:name=systemd:/{rel}\n0::/{rel}\n"
    )
    group = cgroupfs.docker_group(root, CID, pid=77, proc_root=proc)
    assert group.cpu_dir == root / "cpu" / rel
    assert cgroupfs.read_quota_cores(group) == pytest.approx(0.2)

    v2root = v2_tree(tmp_path / "cg2")
    v2_group(v2root, rel)
    assert cgroupfs.docker_group(v2root, CID, pid=77, proc_root=proc).cpu_dir == v2root / rel


def test_docker_group_not_found(tmp_path):
    root = v1_tree(tmp_path)
    with pytest.raises(cgroupfs.CgroupError, match="no cgroup found"):
        cgroupfs.docker_group(root, CID, pid=999_999_999)


# ---- CPU weights -----------------------------------------------------------------------


def test_weight_units_and_ranges_per_version():
    v1, v2 = cgroupfs.weight_scale(1), cgroupfs.weight_scale(2)
    assert (v1.file, v2.file) == ("cpu.shares", "cpu.weight")
    assert v1.raw_for(1.0) == 1024 and v2.raw_for(1.0) == 100
    assert v1.raw_for(2.5) == 2560 and v2.raw_for(2.5) == 250
    assert (v1.min_weight, v1.max_weight) == (2 / 1024, 256.0)
    assert (v2.min_weight, v2.max_weight) == (0.01, 100.0)
    # clamped into the kernel's range, never refused for being large or small
    assert v1.raw_for(1e9) == 262_144 and v2.raw_for(1e9) == 10_000
    assert v1.raw_for(1e-9) == 2 and v2.raw_for(1e-9) == 1
    for bad in (0, -1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError):
            v1.raw_for(bad)  # type: ignore[arg-type]


def test_v1_weight_read_write(tmp_path):
    root = v1_tree(tmp_path)
    v1_group(root, "g")
    (root / "cpu" / "g" / "cpu.shares").write_text("1024\n")
    group = cgroupfs.group_at(root, "g")
    assert cgroupfs.read_weight(group) == cgroupfs.DEFAULT_WEIGHT
    assert cgroupfs.write_weight(group, 64.0) == 64.0
    assert (root / "cpu" / "g" / "cpu.shares").read_text() == "65536"
    assert cgroupfs.read_weight_raw(group) == 65536
    assert cgroupfs.write_weight(group, 1000.0) == 256.0  # clamped to 262144
    with pytest.raises(ValueError):
        cgroupfs.write_weight(group, 0)
    assert cgroupfs.read_weight(group) == 256.0  # the bad value changed nothing


def test_v2_weight_read_write(tmp_path):
    root = v2_tree(tmp_path)
    v2_group(root, "a/b")
    (root / "a" / "b" / "cpu.weight").write_text("100\n")
    group = cgroupfs.group_at(root, "a/b")
    assert cgroupfs.read_weight(group) == 1.0
    assert cgroupfs.write_weight(group, 25.0) == 25.0
    assert (root / "a" / "b" / "cpu.weight").read_text() == "2500"
    assert cgroupfs.write_weight(group, 0.001) == 0.01  # clamped to 1
    assert cgroupfs.read_weight_raw(group) == 1


def test_weight_of_a_missing_or_garbled_group_raises(tmp_path):
    root = v2_tree(tmp_path)
    group = cgroupfs.group_at(root, "nothing")
    with pytest.raises(cgroupfs.CgroupError):
        cgroupfs.read_weight(group)
    with pytest.raises(cgroupfs.CgroupError):
        cgroupfs.write_weight(group, 2.0)
    assert not (root / "nothing").exists()
    v2_group(root, "odd")
    (root / "odd" / "cpu.weight").write_text("lots\n")
    with pytest.raises(cgroupfs.CgroupError):
        cgroupfs.read_weight(cgroupfs.group_at(root, "odd"))


# ---- the real tree ---------------------------------------------------------------------


@pytest.fixture
def real_group():
    if os.geteuid() != 0:
        pytest.skip("writing /sys/fs/cgroup needs root")
    try:
        cgroupfs.detect_layout()
    except OSError:
        pytest.skip("no cgroup cpu controller at /sys/fs/cgroup")
    rel = f"dqoes-unit-{uuid.uuid4().hex[:8]}"
    group = cgroupfs.create_group(cgroupfs.DEFAULT_ROOT, rel)
    yield group
    for pid in cgroupfs.pids(group):
        os.kill(pid, 9)
    deadline = time.monotonic() + 3
    while not cgroupfs.remove_group(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group.cpu_dir.exists()


@pytest.mark.timeout(30)
def test_real_group_limits_and_measures_a_busy_loop(real_group):
    cores = 0.2
    cgroupfs.write_quota_cores(real_group, cores)
    assert cgroupfs.read_quota_cores(real_group) == pytest.approx(cores)
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cgroupfs.add_pid(real_group, proc.pid)
        assert cgroupfs.pids(real_group) == [proc.pid]
        group = cgroupfs.group_of_pid(cgroupfs.DEFAULT_ROOT, proc.pid)
        assert group is not None and group.cpu_dir == real_group.cpu_dir
        u0, t0 = cgroupfs.usage_s(real_group), time.monotonic()
        time.sleep(2.0)
        rate = (cgroupfs.usage_s(real_group) - u0) / (time.monotonic() - t0)
        assert rate == pytest.approx(cores, rel=0.35)
    finally:
        cgroupfs.write_quota_cores(real_group, None)
        proc.kill()
        proc.wait()


def test_real_group_weight_round_trip(real_group):
    scale = cgroupfs.weight_scale(real_group.version)
    assert cgroupfs.read_weight(real_group) == cgroupfs.DEFAULT_WEIGHT  # a fresh group has the default
    assert cgroupfs.write_weight(real_group, 4.0) == 4.0
    assert cgroupfs.read_weight_raw(real_group) == 4 * scale.default_raw
    assert cgroupfs.write_weight(real_group, 1e6) == scale.max_weight  # the kernel's own maximum takes
    assert cgroupfs.read_weight_raw(real_group) == scale.max_raw
    assert cgroupfs.write_weight(real_group, 1e-6) == scale.min_weight
    assert cgroupfs.read_weight_raw(real_group) == scale.min_raw


def test_the_weight_that_follows_a_limit_is_the_kernels_maximum_times_its_share():
    assert cgroupfs.weight_for_share(1, 0.25) == 64.0  # cpu.shares 65536 of 262144
    assert cgroupfs.weight_for_share(2, 0.25) == 25.0  # cpu.weight 2500 of 10000
    assert cgroupfs.weight_for_share(1, None) == cgroupfs.DEFAULT_WEIGHT
    assert cgroupfs.weight_for_share(2, 1e-7) == 0.01  # clamped to the kernel's least
    for bad in (0.0, -0.5, math.nan, math.inf):
        with pytest.raises(ValueError):
            cgroupfs.weight_for_share(1, bad)
