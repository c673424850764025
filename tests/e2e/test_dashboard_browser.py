"""The dashboard in a real headless Chromium: a live `dqoes up` run, and a recorded comparison.

Both open the page first without its token (one line of refusal, no form,
nothing of the cluster) and then with the address as printed. Every page is
also checked for what a user should not see: a Deploy button or developer
menu, and the word "satisfied" (the vocabulary is met and in band).

Debian's /usr/bin/chromium, driven by playwright's Python package (no
playwright browser download). Without Chromium the tests are skipped with
the reason, unless DQOES_REQUIRE_BROWSER=1 (then they fail). Every page is
checked for Streamlit's exception boxes (stException) along the way.

`make screenshot` runs the comparison test with DQOES_SCREENSHOT=PATH: the
README's picture is this test's screenshot.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard import access
from shared.scenarios.builtin import load
from shared.sim.engine import simulate
from shared.timeline import run_file_name, write_jsonl

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "tests" / "e2e" / "small-cluster.json"
CHROMIUM = "/usr/bin/chromium"
METRIC = '[data-testid="stMetricValue"]'
EXCEPTION = '[data-testid="stException"]'
CHART = '[data-testid="stVegaLiteChart"]'


def need(env_var: str, reason: str) -> None:
    """Skip with `reason`, or fail when env_var=1 says this environment must have it."""
    if os.environ.get(env_var) == "1":
        pytest.fail(f"{reason} (and {env_var}=1)")
    pytest.skip(f"{reason}; set {env_var}=1 to make this a failure")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        need("DQOES_REQUIRE_BROWSER", f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need("DQOES_REQUIRE_BROWSER", "playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-dev-shm-usage"],
        )
        yield b
        b.close()


def spawn(*args: str, state_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DQOES_STATE_DIR": str(state_dir)}
    env.pop("DQOES_NATS_URL", None)
    env.pop(access.TOKEN_ENV, None)  # a fresh random token, as a user gets
    return subprocess.Popen([sys.executable, "-m", "services.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)


def read_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float = 90.0) -> re.Match:
    assert proc.stdout is not None
    t_end = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < t_end:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"exited ({proc.wait()}): {seen} {proc.stderr.read()}")
        seen.append(line)
        if m := re.search(pattern, line):
            return m
    raise AssertionError(f"{pattern!r} not printed within {timeout_s:g} s: {seen}")


def stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    return proc.returncode


def no_exception(page) -> None:
    boxes = page.locator(EXCEPTION)
    assert boxes.count() == 0, boxes.first.inner_text()


def refused_without_token(browser, url: str, path: str = "/") -> None:
    """The page at `path` without the token, and with a wrong one: the refusal line and nothing else."""
    base = url.split("/?", 1)[0]
    for address in (base + path, access.with_token(base, "not-the-token", path)):
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(address)
        page.get_by_text(access.REFUSAL.split(":")[0]).wait_for(timeout=60_000)  # markdown: `...` is code
        page.wait_for_timeout(1500)  # anything else the script would draw has arrived by now
        body = page.inner_text("body")
        assert page.locator("input, button:has-text('objective'), " + METRIC + ", " + CHART).count() == 0
        assert "DQoES: live" not in body and "recorded runs" not in body, body
        assert page.locator('[data-testid="stSidebarNav"]').count() == 0
        page.close()


def clean_chrome(page) -> None:
    """No Deploy button, no developer menu; no "satisfied" anywhere on the page."""
    assert page.get_by_role("button", name="Deploy").count() == 0
    assert page.locator('[data-testid="stAppDeployButton"]').count() == 0
    assert page.get_by_text("Deploy", exact=True).count() == 0
    assert page.locator('[data-testid="stMainMenu"]').count() == 0  # minimal toolbar: no menu left
    body = page.inner_text("body")
    assert "satisf" not in body.lower(), [x for x in body.splitlines() if "satisf" in x.lower()]
    assert "final CPU split" not in page.content()


def met_now(page) -> int | None:
    """The live metric "N of M" as N (None while it is not on the page)."""
    values = page.locator(METRIC).all_inner_texts()
    m = re.match(r"(\d+) of (\d+)", values[0]) if values else None
    return int(m.group(1)) if m else None


def in_band_now(page) -> int | None:
    """The "in band N of M" under the live metric as N (None while it is not on the page)."""
    m = re.search(r"in band (\d+) of \d+", page.inner_text("body"))
    return int(m.group(1)) if m else None


def poll(page, pred, timeout_s: float, what: str):
    t_end = time.monotonic() + timeout_s
    while time.monotonic() < t_end:
        no_exception(page)
        v = pred()
        if v is not None and v is not False:
            return v
        page.wait_for_timeout(250)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


def wait_for_charts(page, count: int) -> None:
    drawn = f"{CHART} canvas, {CHART} svg.marks"
    poll(page, lambda: page.locator(drawn).count() >= count, 60, f"{count} charts drawn")


def test_live_run_in_a_real_browser(browser, tmp_path):
    up = spawn("up", "--scenario", str(SMALL), "--policy", "dqoes", "--time-scale", "10", "--forever",
               "--run-dir", str(tmp_path / "run"), "--runs", str(tmp_path), state_dir=tmp_path)
    try:
        url = read_until(up, r"dashboard: (http://\S+)").group(1)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/\?token=[A-Za-z0-9_-]{32}", url), url
        refused_without_token(browser, url)
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        page.goto(url)
        poll(page, lambda: met_now(page), 60, "the live met count")
        assert page.get_by_text("DQoES: met").count() == 1
        first = poll(page, lambda: in_band_now(page), 30, "the live in band count")
        risen = poll(page, lambda: (n := in_band_now(page)) is not None and n > first and n,
                     90, f"the in band count rising above {first}")
        assert risen > first
        wait_for_charts(page, 4)
        clean_chrome(page)

        # A bad objective: a message, and the manager is never asked.
        page.locator('input[aria-label="container"]').fill("c3")
        page.locator('input[aria-label="objective (seconds per batch, or at the percentile)"]').fill("-1")
        page.get_by_role("button", name="Set objective").click()
        page.get_by_text("objective: must be more than 0 seconds per batch, got -1").wait_for()
        # A good one: the manager's reply.
        page.locator('input[aria-label="objective (seconds per batch, or at the percentile)"]').fill("30")
        page.get_by_role("button", name="Set objective").click()
        page.get_by_text(re.compile(r"objective for c3: 30 s a batch \(running on node-a")).wait_for(
            timeout=20_000
        )
        # The container table shows met, in band and throttling for every container.
        grid = page.locator('[data-testid="stDataFrame"]').filter(has_text="throttled")
        poll(page, lambda: grid.count() == 1, 30, "the containers table with its throttled column")
        headers = grid.first.locator('[role="columnheader"]').all_inner_texts()
        assert {"met", "in band", "throttled"} <= {h.strip() for h in headers}, headers
        cells = grid.first.locator('[role="gridcell"]').all_inner_texts()
        assert {"yes", "no"} & {c.strip() for c in cells}, cells
        # Clearing through the same form.
        page.get_by_role("button", name="Clear objective").click()
        page.get_by_text("objective for c3 cleared: unmanaged now").wait_for(timeout=20_000)
        no_exception(page)
        page.screenshot(path=str(tmp_path / "live.png"))
        assert (tmp_path / "live.png").stat().st_size > 10_000
        page.close()
    finally:
        code = stop(up)
    assert code == 0


def test_recorded_comparison_in_a_real_browser(browser, tmp_path):
    runs = tmp_path / "runs"
    sc = load("paper-cluster-40", 1)
    counts = {}
    for policy in ("dqoes", "default"):
        res = simulate(sc, policy, 1, record=True)
        write_jsonl(runs / run_file_name(sc.name, policy, 1),
                    res.timeline + [{"kind": "result", **res.summary()}])
        counts[policy] = (res.satisfied_final, res.met_final)
    board = spawn("dashboard", "--no-live", "--runs", str(runs), "--json", state_dir=tmp_path)
    try:
        url = json.loads(read_until(board, r"^\{.*\}$").group(0))["url"]
        refused_without_token(browser, url, "/recorded")
        page = browser.new_page(viewport={"width": 1500, "height": 1900})
        page.goto(access.with_token(url.split("/?", 1)[0], url.split("token=", 1)[1], "/recorded"))
        (d, dm), (b, bm) = counts["dqoes"], counts["default"]
        headline = (f"DQoES met {dm} of 40 objectives, default Swarm {bm}: {round(dm / bm, 1):g}x; "
                    f"in band {d} and {b}: {round(d / b, 1):g}x")
        page.get_by_text(headline).wait_for(timeout=60_000)
        want = [f"{dm} of 40", f"{bm} of 40"]
        poll(page, lambda: page.locator(METRIC).all_inner_texts() == want, 30, f"metrics {want}")
        wait_for_charts(page, 4)  # the ones in view: in band and delivered QoE, both sides
        page.wait_for_timeout(1000)
        no_exception(page)
        clean_chrome(page)
        # Moving to another page and reloading it keeps the tab admitted (the address keeps the token).
        page.get_by_test_id("stSidebarNavLink").filter(has_text="Live").click()
        page.get_by_text("DQoES: live").wait_for(timeout=30_000)
        page.reload()
        page.get_by_text("DQoES: live").wait_for(timeout=60_000)
        assert page.get_by_text(access.REFUSAL.split(":")[0]).count() == 0
        page.get_by_test_id("stSidebarNavLink").filter(has_text="Recorded runs").click()
        page.get_by_text(headline).wait_for(timeout=60_000)
        wait_for_charts(page, 4)
        page.wait_for_timeout(1000)
        shot = tmp_path / "comparison.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 50_000
        if os.environ.get("DQOES_SCREENSHOT"):
            target = Path(os.environ["DQOES_SCREENSHOT"])
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, target)
        page.close()
    finally:
        code = stop(board)
    assert code == 0
