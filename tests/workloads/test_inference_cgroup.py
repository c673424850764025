"""Thread policy from the cgroup CPU quota, and the jemalloc re-exec decision.

No torch needed: these run everywhere. The cgroup trees are fake ones in a
temporary directory, laid out as /proc/self/cgroup and /sys/fs/cgroup are on
cgroup v1 hosts, inside Docker containers on v1, and on cgroup v2.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.inference.cgroup import available_cpus, read_cpu_limit_cores, threads_for
from services.inference.jemalloc import MALLOC_CONF, jemalloc_env


def fake_tree(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """Write /proc/self/cgroup and files under a fake /sys/fs/cgroup; return both paths."""
    proc = tmp_path / "proc_self_cgroup"
    proc.write_text(proc_cgroup)
    root = tmp_path / "sys_fs_cgroup"
    root.mkdir()
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content + "\n")
    return proc, root


V1_PROC = "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n0::/\n"


def v1_files(quota_us: int, period_us: int = 100000, group: str = "cpu,cpuacct/docker/abc"):
    return {
        f"{group}/cpu.cfs_quota_us": str(quota_us),
        f"{group}/cpu.cfs_period_us": str(period_us),
    }


@pytest.mark.parametrize(
    ("quota_us", "limit_cores", "threads"),
    [(150000, 1.5, 1), (250000, 2.5, 2), (200000, 2.0, 2), (50000, 0.5, 1), (-1, None, 1)],
)
def test_v1_quota_gives_threads(tmp_path, quota_us, limit_cores, threads):
    proc, root = fake_tree(tmp_path, V1_PROC, v1_files(quota_us))
    assert read_cpu_limit_cores(proc, root) == limit_cores
    assert threads_for(read_cpu_limit_cores(proc, root), cpus=4) == threads


def test_v1_no_quota_uses_the_configured_default(tmp_path):
    proc, root = fake_tree(tmp_path, V1_PROC, v1_files(-1))
    assert threads_for(read_cpu_limit_cores(proc, root), cpus=4, default_threads=3) == 3


def test_v1_inside_a_container_reads_the_mount_root(tmp_path):
    # /proc/self/cgroup names the host path, but only the container's own group is mounted.
    proc, root = fake_tree(tmp_path, "4:cpu,cpuacct:/docker/abc\n", v1_files(150000, group="cpu"))
    assert read_cpu_limit_cores(proc, root) == 1.5


def test_v1_separate_cpu_mount_and_parent_quota(tmp_path):
    # The process's group is unlimited; its parent is limited to 0.75 cpu.
    files = {**v1_files(-1, group="cpu/svc/worker"), **v1_files(75000, group="cpu/svc")}
    proc, root = fake_tree(tmp_path, "3:cpu:/svc/worker\n", files)
    assert read_cpu_limit_cores(proc, root) == 0.75


def test_v1_other_period(tmp_path):
    proc, root = fake_tree(tmp_path, V1_PROC, v1_files(30000, period_us=10000))
    assert read_cpu_limit_cores(proc, root) == 3.0
    assert threads_for(3.0, cpus=2) == 2  # capped at the CPUs we have


@pytest.mark.parametrize(
    ("cpu_max", "limit_cores", "threads"),
    [("max 100000", None, 1), ("50000 100000", 0.5, 1), ("250000 100000", 2.5, 2)],
)
def test_v2_cpu_max_gives_threads(tmp_path, cpu_max, limit_cores, threads):
    proc, root = fake_tree(
        tmp_path,
        "0::/system.slice/docker-abc.scope\n",
        {"system.slice/docker-abc.scope/cpu.max": cpu_max},
    )
    assert read_cpu_limit_cores(proc, root) == limit_cores
    assert threads_for(limit_cores, cpus=4) == threads


def test_v2_with_cgroup_namespace_reads_the_root(tmp_path):
    proc, root = fake_tree(tmp_path, "0::/\n", {"cpu.max": "150000 100000"})
    assert read_cpu_limit_cores(proc, root) == 1.5


def test_hybrid_host_prefers_the_v1_cpu_controller(tmp_path):
    files = {**v1_files(50000, group="cpu/docker/abc"), "unified/docker/abc/cpu.max": "max 100000"}
    proc, root = fake_tree(tmp_path, "1:cpu:/docker/abc\n0::/docker/abc\n", files)
    assert read_cpu_limit_cores(proc, root) == 0.5


def test_missing_or_garbled_files_mean_no_limit(tmp_path):
    assert read_cpu_limit_cores(tmp_path / "absent", tmp_path) is None
    proc, root = fake_tree(tmp_path, V1_PROC, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "junk"})
    assert read_cpu_limit_cores(proc, root) is None


def test_this_machine_reads_without_error():
    limit = read_cpu_limit_cores()
    assert limit is None or limit > 0
    assert 1 <= threads_for(limit, available_cpus()) <= available_cpus()


# --------------------------------------------------------------------------- jemalloc


@pytest.fixture
def fake_lib(tmp_path) -> str:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    return str(lib)


def test_jemalloc_env_preloads_the_library(fake_lib):
    env = jemalloc_env({"PATH": "/bin"}, [fake_lib])
    assert env == {"PATH": "/bin", "LD_PRELOAD": fake_lib, "MALLOC_CONF": MALLOC_CONF}


def test_jemalloc_env_keeps_a_users_malloc_conf(fake_lib):
    env = jemalloc_env({"MALLOC_CONF": "narenas:1"}, [fake_lib])
    assert env is not None and env["MALLOC_CONF"] == "narenas:1"


@pytest.mark.parametrize(
    "environ",
    [{"LD_PRELOAD": "/other.so"}, {"DQOES_NO_JEMALLOC": "1"}, {"DQOES_NO_JEMALLOC": "yes"}],
)
def test_jemalloc_env_respects_preload_and_opt_out(fake_lib, environ):
    assert jemalloc_env(environ, [fake_lib]) is None


def test_jemalloc_env_zero_is_not_an_opt_out(fake_lib):
    assert jemalloc_env({"DQOES_NO_JEMALLOC": "0"}, [fake_lib]) is not None


def test_jemalloc_env_without_the_library(tmp_path):
    assert jemalloc_env({}, [str(tmp_path / "absent.so")]) is None
