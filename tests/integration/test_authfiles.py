"""Credentials directories another local user prepared are refused; secrets never follow a link.

The attack (issue 62, item 5): as `nobody`, create `D/auth/admin.creds.tmp -> D/loot`, then wait for
root to run `dqoes auth init --dir D/auth` (or `dqoes up --data-dir` under a shared directory), and
read the admin key from D/loot, a file nobody owns. Played here for real: a forked child turns
into `nobody` (os.setuid) and prepares the trap, then the command runs as the test's user (root).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared import auth, authfiles

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user (nobody) needs root to setuid")


def dqoes(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(state)}
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def as_nobody(work: Callable[[], None]) -> None:
    """Run `work` in a forked child that is `nobody`; fails the test if it raised."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            work()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child playing nobody failed"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory like /tmp: root's, world-writable, sticky; reachable by nobody."""
    base = Path(tempfile.mkdtemp(prefix="dqoes-authfiles-", dir="/tmp"))
    os.chmod(base, 0o755)
    d = base / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(base, ignore_errors=True)


def secret_anywhere_nobody_owns(root: Path, secret: str) -> list[Path]:
    out = []
    for p in root.rglob("*"):
        st = os.lstat(p)
        if st.st_uid == NOBODY and stat.S_ISREG(st.st_mode) and secret in p.read_text(errors="replace"):
            out.append(p)
    return out


@as_root
def test_a_directory_nobody_prepared_with_a_symlink_trap_is_refused(shared_dir, tmp_path):
    def trap() -> None:
        (shared_dir / "auth").mkdir(mode=0o755)
        os.symlink(shared_dir / "loot", shared_dir / "auth" / "admin.creds.tmp")

    as_nobody(trap)
    r = dqoes("auth", "init", "--dir", str(shared_dir / "auth"), state=tmp_path / "state")
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is owned by nobody" in lines[0] and "refusing" in lines[0], r.stderr
    assert not os.path.lexists(shared_dir / "loot")
    assert not (shared_dir / "auth" / "admin.creds").exists()


@as_root
def test_up_refuses_a_data_directory_nobody_prepared(shared_dir, tmp_path):
    def trap() -> None:
        (shared_dir / "data" / "auth").mkdir(mode=0o777, parents=True)
        os.symlink(shared_dir / "loot", shared_dir / "data" / "auth" / "admin.creds.tmp")

    as_nobody(trap)
    r = dqoes("up", "--scenario", "paper-varied", "--data-dir", str(shared_dir / "data"), "--no-dashboard",
              "--duration", "1", state=tmp_path / "state")
    assert r.returncode == 2 and "is owned by nobody" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not os.path.lexists(shared_dir / "loot")


@as_root
def test_in_a_shared_sticky_directory_a_fresh_auth_directory_is_ours_and_unreadable_to_nobody(shared_dir, tmp_path):
    r = dqoes("auth", "init", "--dir", str(shared_dir / "mine" / "auth"), state=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    d = shared_dir / "mine" / "auth"
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700 and os.stat(d).st_uid == 0
    secret = auth.load(d / "admin.creds").seed
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in d.iterdir())

    def read_it() -> None:
        try:
            (d / "admin.creds").read_text()
        except PermissionError:
            return
        raise AssertionError("nobody read the admin credentials")

    as_nobody(read_it)
    assert not secret_anywhere_nobody_owns(shared_dir, secret)


def test_a_group_or_world_writable_directory_is_refused(tmp_path):
    for mode in (0o770, 0o707):
        d = tmp_path / f"auth-{mode:o}"
        d.mkdir()
        os.chmod(d, mode)
        with pytest.raises(auth.AuthError, match="writable by other users") as e:
            auth.ensure(d, ["n1"])
        assert "\n" not in str(e.value)
        assert not list(d.iterdir())
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)  # not sticky, not root's: whoever may write there may swap our directory
    if os.geteuid() == 0:
        os.chown(parent, NOBODY, NOBODY)
    with pytest.raises(auth.AuthError, match=r"open is (owned by nobody|writable by other users)"):
        auth.ensure(parent / "auth", ["n1"])


def test_a_leftover_link_at_a_temporary_name_is_never_followed(tmp_path):
    d = tmp_path / "auth"
    auth.ensure(d, ["n1"])
    os.symlink(tmp_path / "loot", d / "admin.creds.tmp")  # the name the old writer used
    for name in os.listdir(d):  # and at every name it could pick
        if name.endswith(".creds"):
            os.symlink(tmp_path / f"loot-{name}", d / f".{name}.tmp")
    auth.ensure(d, rotate=True)
    assert not list(tmp_path.glob("loot*"))
    assert auth.load(d / "admin.creds").identity == "admin"
    target = d / "client.creds"
    target.unlink()
    os.symlink(tmp_path / "loot-target", target)  # a link at the target itself is replaced, not followed
    authfiles.write_private(target, "secret\n")
    assert not target.is_symlink() and target.read_text() == "secret\n"
    assert not os.path.lexists(tmp_path / "loot-target")
