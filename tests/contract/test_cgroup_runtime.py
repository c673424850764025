"""CgroupRuntime beyond the shared contract: its refusal without root, and its cgroup v2 path.

This machine's CPU controller is on cgroup v1, so the v2 file handling is
driven here on an imitation v2 tree (plain files: nothing is really limited,
but every file the runtime writes is checked).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from shared.runtime.base import RuntimeFailure
from shared.runtime.cgroup import CgroupRuntime

pytestmark = pytest.mark.timeout(60)


def test_without_root_start_fails_with_a_clear_message():
    code = textwrap.dedent(
        """
        import asyncio
        from shared.runtime.cgroup import CgroupRuntime
        from shared.runtime.base import RuntimeFailure
        try:
            asyncio.run(CgroupRuntime("n", parent="dqoes-nonroot-check").start())
        except RuntimeFailure as e:
            print(e)
        """
    )
    root_dir = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                pytest.skip("needs setpriv to drop root")
            # The unprivileged user may not be able to enter the checkout (a clone under a private
            # home): it imports a world-readable copy of the package instead.
            os.chmod(tmp, 0o755)
            shutil.copytree(root_dir / "shared", Path(tmp) / "shared",
                            ignore=shutil.ignore_patterns("__pycache__"))
            for d, _, files in os.walk(tmp):
                os.chmod(d, 0o755)
                for f in files:
                    os.chmod(os.path.join(d, f), 0o644)
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
            path = tmp
        else:
            argv, path = [sys.executable], str(root_dir)
        done = subprocess.run(
            [*argv, "-c", code],
            capture_output=True,
            text=True,
            cwd="/",
            env={**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"},
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(
        "the cgroup runtime needs root: cannot write /sys/fs/cgroup/"
    )
    assert done.stdout.strip().endswith("/dqoes-nonroot-check")


@pytest.mark.anyio
async def test_v2_files_on_an_imitation_tree(tmp_path):
    root = tmp_path
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    rt = CgroupRuntime("n1", cores=4, root=root, parent="dqoes")
    await rt.start()
    assert "+cpu" in (root / "cgroup.subtree_control").read_text()
    (root / "dqoes" / "cgroup.subtree_control").write_text("")  # the kernel would have made it

    stream = rt.events()
    c = await rt.spawn("w1", [sys.executable, "-c", "import time; time.sleep(30)"], objective_s=2.0)
    assert c.id == str(root / "dqoes" / "w1")
    assert (await stream.__anext__()).kind == "started"
    # The child put itself in the group before exec.
    pid = int((root / "dqoes/w1/cgroup.procs").read_text())
    assert pid == rt._spawned["w1"].process.pid
    assert (root / "dqoes/w1/cpu.max").read_text() == "max 100000"

    assert await rt.set_limit("w1", 0.5) == pytest.approx(0.5)
    assert (root / "dqoes/w1/cpu.max").read_text() == "200000 100000"
    [listed] = await rt.containers()
    assert listed.limit == pytest.approx(0.5) and listed.objective_s == 2.0

    (root / "dqoes/w1/cpu.stat").write_text("usage_usec 1500000\n")
    assert await rt.cpu_totals_s() == {"w1": pytest.approx(1.5)}

    with pytest.raises(RuntimeFailure):
        await rt.spawn("w1", [sys.executable, "-c", "pass"])
    with pytest.raises(RuntimeFailure):
        await rt.spawn("../escape", [sys.executable, "-c", "pass"])

    await rt.close()
    event = await asyncio.wait_for(stream.__anext__(), 5)
    assert (event.kind, event.container.name) == ("stopped", "w1")
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    assert not (root / "dqoes").exists()


async def _weighted_on_an_imitation_v2_tree(root):
    """A weighted runtime of 4 cores on an imitation v2 tree under `root`, one sleeper `w1` in it."""
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    rt = CgroupRuntime("n1", cores=4, root=root, parent="dqoes", cpu_weights=True)
    await rt.start()
    (root / "dqoes" / "cgroup.subtree_control").write_text("")
    await rt.spawn("w1", [sys.executable, "-c", "import time; time.sleep(30)"])
    (root / "dqoes/w1/cpu.weight").write_text("100")  # the kernel's default
    return rt


@pytest.mark.anyio
async def test_with_cpu_weights_a_limit_sets_the_weight_on_an_imitation_v2_tree(tmp_path):
    root = tmp_path
    rt = await _weighted_on_an_imitation_v2_tree(root)
    try:
        await rt.set_limit("w1", 0.25)
        assert (root / "dqoes/w1/cpu.weight").read_text() == "2500"  # 10000 x 0.25
        await rt.set_limit("w1", None)
        assert (root / "dqoes/w1/cpu.weight").read_text() == "100"
    finally:
        await rt.close()


@pytest.mark.anyio
async def test_a_weight_that_cannot_be_written_puts_the_quota_back(tmp_path):
    root = tmp_path
    rt = await _weighted_on_an_imitation_v2_tree(root)
    weight = root / "dqoes/w1/cpu.weight"
    try:
        weight.unlink()
        with pytest.raises(RuntimeFailure, match="back at no limit"):
            await rt.set_limit("w1", 0.5)  # from no quota: none again
        assert (root / "dqoes/w1/cpu.max").read_text() == "max 100000"
        weight.write_text("100")
        assert await rt.set_limit("w1", 0.5) == pytest.approx(0.5)
        assert (root / "dqoes/w1/cpu.max").read_text() == "200000 100000"
        weight.unlink()  # the kernel refuses the weight from now on
        with pytest.raises(RuntimeFailure, match="back at 2.0 cores"):
            await rt.set_limit("w1", 0.25)
        assert (root / "dqoes/w1/cpu.max").read_text() == "200000 100000"
        assert [c.limit for c in await rt.containers()] == [pytest.approx(0.5)]
    finally:
        await rt.close()


@pytest.mark.anyio
async def test_cpu_weights_on_this_machines_cgroups_follow_the_limit_only_when_asked():
    if os.geteuid() != 0:
        pytest.skip("the cgroup runtime needs root")
    from shared.runtime import cgroupfs

    for weighted in (True, False):
        rt = CgroupRuntime("n1", cores=2, parent=f"dqoes-test-w{int(weighted)}-{os.getpid()}", cpu_weights=weighted)
        try:
            await rt.start()
        except RuntimeFailure as e:
            pytest.skip(str(e))
        try:
            await rt.spawn("w1", [sys.executable, "-c", "import time; time.sleep(30)"])
            group = cgroupfs.group_at(cgroupfs.DEFAULT_ROOT, f"{rt.parent}/w1")
            await rt.set_limit("w1", 0.25)
            expected = cgroupfs.weight_for_share(group.version, 0.25) if weighted else cgroupfs.DEFAULT_WEIGHT
            assert cgroupfs.read_weight(group) == pytest.approx(expected)
        finally:
            await rt.close()
