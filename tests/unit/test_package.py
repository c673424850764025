"""The package as a user installs it: a wheel built from the tree, in a fresh virtual environment.

Why: `dqoes experiment` and the dashboard must work wherever the package is installed, not only from
the checkout (nothing they start is pointed at the source tree), and the wheel carries the product alone: the lab (`python -m lab`, the project's own research tools)
stays out, and the data files the product reads (the calibrated profiles) come with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT_ACTIONS = {"list", "run", "compare", "paired", "report", "real"}


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DQOES_PROFILES")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, a fresh venv with it installed), built from a copy of the tree outside the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for pkg in ("shared", "services", "dashboard", "experiments", "lab"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    done = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                 str(src)], cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = dist.glob("dqoes-*.whl")
    venv = tmp / "venv"
    done = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    assert done.returncode == 0, done.stderr
    python = venv / "bin" / "python"
    done = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                 str(wheel)], cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    # The dependencies (torch, nats-py, ...) from this environment, as a plain path: its .pth files, the
    # editable install's finder among them, are not run, so `dqoes` can only come from the wheel.
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp).stdout.strip())
    (site / "deps.pth").write_text(f"{purelib}\n")
    return wheel, venv


def test_the_wheel_holds_the_product_and_its_data_but_not_the_lab(installed):
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("dqoes-")}
    assert tops == {"shared", "services", "dashboard", "experiments"}, tops
    assert "experiments/profiles.toml" in names


def test_the_installed_cli_lists_only_the_products_experiments(installed, tmp_path):
    _, venv = installed
    done = _run([str(venv / "bin" / "dqoes"), "experiment", "--help"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    positionals = done.stdout.split("positional arguments:", 1)[1].split("options:", 1)[0]
    actions = {m.group(1) for m in re.finditer(r"^    ([a-z][a-z-]*)", positionals, flags=re.M)}
    assert actions == PRODUCT_ACTIONS, done.stdout
    lab = _run([str(venv / "bin" / "python"), "-c", "import lab"], cwd=tmp_path)
    assert lab.returncode == 1 and "No module named 'lab'" in lab.stderr


def test_compare_runs_outside_the_checkout_from_the_installed_package(installed, tmp_path):
    _, venv = installed
    where = _run([str(venv / "bin" / "python"), "-c", "import experiments, services; "
                  "print(experiments.__file__); print(services.__file__)"], cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert all(str(venv) in line for line in where.stdout.splitlines()), where.stdout
    done = _run([str(venv / "bin" / "dqoes"), "experiment", "compare", "paper-varied", "--policies",
                 "dqoes,default", "--out", "runs", "--json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["scenario"] == "paper-varied" and set(summary["policies"]) == {"dqoes", "default"}
    assert summary["policies"]["dqoes"]["met_final"] >= summary["policies"]["default"]["met_final"]
    assert len(list((tmp_path / "runs").glob("*.jsonl"))) == 2  # written where the user ran it
    # The real-node trial's default profiles are the packaged ones, named the same on any install.
    prof = _run([str(venv / "bin" / "python"), "-c", "from experiments.real import load_profiles; "
                 "p, shown = load_profiles(None); print(shown, sorted(p)[:2])"], cwd=tmp_path)
    assert prof.returncode == 0, prof.stderr
    assert prof.stdout.startswith("experiments/profiles.toml"), prof.stdout


def test_the_installed_dashboard_starts_outside_the_checkout_on_the_users_runs(installed, tmp_path):
    _, venv = installed
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DQOES_NATS_URL")}
    env["DQOES_STATE_DIR"] = str(tmp_path / "state")
    proc = subprocess.Popen([str(venv / "bin" / "dqoes"), "dashboard", "--no-live", "--runs", "runs", "--json"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("{"), (line, proc.stderr.read() if proc.poll() is not None else "")
        url = json.loads(line)["url"].split("?", 1)[0].rstrip("/")  # the printed address carries the token
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as r:
            assert r.read().decode() == "ok"
        # The server was told the folder the user named, where the user named it.
        server = next(p for p in Path("/proc").glob("[0-9]*")
                      if (p / "cmdline").is_file() and b"dashboard.serve" in (p / "cmdline").read_bytes()
                      and str(tmp_path / "runs").encode() in (p / "cmdline").read_bytes())
        assert Path(os.readlink(server / "cwd")) == tmp_path
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_the_dashboard_is_given_the_runs_folder_resolved_where_the_user_named_it(tmp_path, monkeypatch):
    from dashboard import launch

    monkeypatch.chdir(tmp_path)
    cmd = launch.command(8501, runs_dir="out")
    assert cmd[cmd.index("--runs") + 1] == str(tmp_path / "out")


def test_nothing_in_the_product_points_what_it_starts_at_the_source_tree():
    """What the product starts finds its modules as installed: no PYTHONPATH or cwd set to the tree."""
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
             for pkg in ("shared", "services", "dashboard", "experiments")
             for path in sorted((REPO / pkg).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "PYTHONPATH" in line or re.search(r"\bcwd\s*=", line)]
    assert found == []
