"""Children tied to their parent's life, and what dead runs leave behind (shared/children.py).

Real processes: a parent killed with SIGKILL takes its tied child with it; an untied one lives on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shared import children

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = """
import subprocess, sys, time
from shared import children
tie = sys.argv[1] == "tie"
p = subprocess.Popen(["sleep", "60"], preexec_fn=children.die_with_parent() if tie else None)
print(p.pid, flush=True)
time.sleep(60)
"""


def _grandchild_after_parent_killed(tie: bool) -> bool:
    """Whether the parent's child is still alive 2 s after a SIGKILL of the parent."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, "tie" if tie else "free"], stdout=subprocess.PIPE,
                              text=True, env=env)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 2
        while children.alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return children.alive(child)
    finally:
        if children.alive(child):
            os.kill(child, 9)


def test_a_tied_child_dies_with_its_parent_and_an_untied_one_does_not():
    assert _grandchild_after_parent_killed(tie=True) is False
    assert _grandchild_after_parent_killed(tie=False) is True


def test_off_the_main_thread_nothing_is_tied_since_the_thread_may_end_first():
    got: list[object] = []
    then = lambda: None  # noqa: E731
    t = threading.Thread(target=lambda: got.extend([children.die_with_parent(), children.die_with_parent(then=then)]))
    t.start()
    t.join()
    assert got == [None, then]
    assert callable(children.die_with_parent())


def test_stale_directories_of_dead_processes_are_removed_and_no_others(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp_path / f"dqoes-run-{dead.pid}-abc"
    live = tmp_path / f"dqoes-run-{os.getpid()}-abc"
    unnamed = tmp_path / "dqoes-run-xyz"
    other = tmp_path / f"other-{dead.pid}-abc"
    for d in (gone, live, unnamed, other):
        d.mkdir()
        (d / "secret").write_text("x")
    assert children.remove_stale_dirs(tmp_path, "dqoes-run-") == [gone]
    assert not gone.exists() and live.exists() and unnamed.exists() and other.exists()
