"""Files that hold secrets: created so that another local user cannot redirect or read them.

Why: credentials are written by whoever starts a deployment, often root, into
a directory that may sit under a shared one such as /tmp. If another user
prepared that directory (or a symlink where a temporary file will be
created), a plain `open(path, "w")` follows the link and writes the secret
into a file that user owns. So, as ssh's StrictModes does:

- the directory must be owned by the user writing it and not group- or
  world-writable, and so must every directory above it, except that
  directories owned by root may be writable by others when the sticky bit is
  set (/tmp: nobody can rename or delete our entries there);
  a symlink on the way must be owned by root or the user;
- a file is written to a fresh temporary name created with
  O_CREAT|O_EXCL|O_NOFOLLOW (never an existing file, never through a link),
  mode 0600, fsync'd, then renamed over the target (a rename replaces a link
  rather than following it).

Anything else is refused with one line naming the path and the reason
(`UnsafePathError`). Standard library only: `python3 -m shared.auth` runs
without the project's dependencies.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


class UnsafePathError(ValueError):
    """A directory or file another user could control; the text names it and says why."""


def _who(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_ancestor(path: Path, st: os.stat_result, uid: int) -> None:
    if st.st_uid not in (0, uid):
        raise UnsafePathError(f"{path} is owned by {_who(st.st_uid)}, not by {_who(uid)} or root: "
                              f"refusing to keep credentials under it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
        raise UnsafePathError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                              f"refusing to keep credentials under it (chmod go-w {path})")


def check_chain(directory: str | os.PathLike[str], uid: int | None = None) -> None:
    """Refuse `directory` (which must exist) unless it and every directory above it are safe (module doc)."""
    uid = os.geteuid() if uid is None else uid
    d = Path(os.path.abspath(directory))
    # Symlinks along the path as given: each must be owned by root or the user.
    for p in [*reversed(d.parents), d]:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            raise UnsafePathError(f"{p} does not exist") from None
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, uid):
            raise UnsafePathError(f"{p} is a symlink owned by {_who(st.st_uid)}: refusing to follow it")
    real = Path(os.path.realpath(d))
    st = os.stat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{d} is not a directory")
    if st.st_uid != uid:
        raise UnsafePathError(f"{d} is owned by {_who(st.st_uid)}, not by {_who(uid)}: refusing to keep "
                              f"credentials there (remove it, or use another directory)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(f"{d} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): refusing "
                              f"to keep credentials there (chmod 700 {d})")
    for p in real.parents:
        _check_ancestor(p, os.stat(p), uid)


def secure_dir(directory: str | os.PathLike[str], mode: int = 0o700) -> Path:
    """Create `directory` (and missing parents) if needed, check the chain (module doc) and set `mode`
    on it; returns its path. UnsafePathError if anything on the way is another user's to change."""
    d = Path(os.path.abspath(directory))
    missing = []
    p = d
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    if p == d:
        check_chain(d)
    else:
        _check_existing_parent(p)
    for m in reversed(missing):
        try:
            os.mkdir(m, 0o700 if m == d else 0o755)
        except FileExistsError:
            pass  # made meanwhile: the check below decides whether it is ours
    check_chain(d)
    os.chmod(d, mode)
    return d


def _check_existing_parent(p: Path) -> None:
    """The deepest existing directory above a new one: safe to create entries in."""
    uid = os.geteuid()
    st = os.stat(p)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{p} is not a directory")
    if st.st_uid == uid and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        check_chain(p)
        return
    _check_ancestor(p, st, uid)  # root's sticky /tmp, or root's own directories
    for q in Path(os.path.realpath(p)).parents:
        _check_ancestor(q, os.stat(q), uid)


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` (mode 0600) through a fresh O_EXCL|O_NOFOLLOW temporary file, fsync'd and
    renamed over `path`. The directory is checked first (check_chain)."""
    target = Path(path)
    check_chain(target.parent)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), 0o600)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_private(path: str | os.PathLike[str]) -> str:
    """A secret file's text, opened without following a final symlink (OSError otherwise)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd) as f:
        return f.read()
