"""What the host-role tests share: `dqoes` run as a user runs it, and a role (`dqoes serve ...`) as a
process with its output in a file, so each test reads the lines a person would read."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def role_env(state: Path) -> dict[str, str]:
    """This environment with the state directory given and no other DQOES_ setting of the caller's."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(state)}
    for k in [k for k in env if k.startswith("DQOES_") and k != "DQOES_STATE_DIR"]:
        env.pop(k)
    return env


def dqoes(*args: str, state: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=role_env(state))


@dataclass
class Role:
    argv: list[str]
    state: Path
    out: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Role:
        with self.out.open("ab") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "services.cli", *self.argv], stdout=f,
                                         stderr=subprocess.STDOUT, cwd=REPO, env=role_env(self.state))
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, needle: str, count: int = 1, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while self.text().count(needle) < count:
            assert self.proc is not None and self.proc.poll() is None, self.text()[-3000:]
            assert time.monotonic() < deadline, f"no {needle!r} x{count} in:\n{self.text()[-3000:]}"
            time.sleep(0.1)

    def stop(self) -> int | None:
        """SIGTERM to the supervisor, as systemd stops the unit (KillMode=mixed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def serve(state: Path, out: Path, *argv: str) -> Role:
    """`dqoes serve ARGV...` started, its output appended to `out`."""
    return Role(["serve", *argv], state, out).start()


def worker_pid(role: Role) -> int:
    """The worker process below the role's supervisor."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == role.pid and b"services.worker" in (stat.parent / "cmdline").read_bytes():
                return int(stat.parent.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no worker below {role.pid}:\n{role.text()[-2000:]}")


async def node_rounds(url: str, creds: Path, node: str, count: int, timeout_s: float = 40.0) -> list[int]:
    """`count` rounds of `node`'s worker, read from its state subject through `url` as `creds`."""
    import asyncio

    from shared import subjects
    from shared.bus import Bus
    from shared.messages import NodeState

    bus = await Bus.connect(url, "test-watch", creds=creds)
    seen: list[int] = []
    try:
        await bus.subscribe(subjects.state(node), lambda ns, _: seen.append(ns.round), expect=NodeState)
        deadline = time.monotonic() + timeout_s
        while len(seen) < count:
            assert time.monotonic() < deadline, f"{len(seen)} round(s) of {node} through {url}"
            await asyncio.sleep(0.1)
    finally:
        await bus.close()
    return seen
