"""The shipped systemd units (packaging/systemd/): systemd accepts them and their commands parse."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = sorted((REPO / "packaging" / "systemd").glob("*.service"))
DQOES = "/usr/local/bin/dqoes"


def _exec_start(unit: Path) -> list[str]:
    lines = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    assert len(lines) == 1, unit
    return shlex.split(lines[0].removeprefix("ExecStart="))


def test_units_are_shipped():
    assert [u.name for u in UNITS] == ["dqoes-control-plane.service", "dqoes-node.service"]
    for u in UNITS:
        text = u.read_text()
        assert "Restart=on-failure" in text and "KillMode=mixed" in text, u


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_exec_start_parses(unit):
    argv = _exec_start(unit)
    assert argv[0] == DQOES
    r = subprocess.run([sys.executable, "-m", "services.cli", *argv[1:], "--help"], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--config" in r.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_analyze_verify(unit, tmp_path):
    # verify checks that the command exists: point it at this checkout's entry point
    exe = Path(sys.executable).parent / "dqoes"
    if not exe.exists():
        pytest.skip("no dqoes entry point beside this Python")
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace(DQOES, str(exe)))
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (r.stdout + r.stderr).splitlines() if unit.name in ln or "Unknown" in ln]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr
