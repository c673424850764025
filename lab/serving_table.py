"""The results page's serving section, rendered from the summary `python -m lab serving-real` writes.

Apart from lab/results_page.py so that page's module stays about the page; pure (a dict in, lines
out), so a fixture renders it in a test.
"""

from __future__ import annotations

from typing import Any

AGREE = 0.10
"""Client and worker p95 agree when they differ by at most this fraction (the issue's acceptance)."""


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def intro(d: dict[str, Any], file: str) -> str:
    servers = ", ".join(f"{s['name']} ({'MLServer' if s['kind'] == 'mlserver' else 'inference --serve'}, "
                        f"{s['model']} at {s['resolution_px']} px)" for s in d["servers"])
    cal = d["calibration"]
    alone = cal.get("alone_p95_s", {})
    objectives = ", ".join(f"{n} {_ms(v)} ms at {cal['rates_rps'][n]:g} requests/s"
                           + (f" (p95 alone at that rate {_ms(alone[n])} ms)" if alone.get(n) else "")
                           for n, v in cal["objectives_s"].items())
    return (
        f"Three model servers co-located on one worker (cgroup runtime, the node capped at {d['cores']:g} cores of "
        f"a {d['machine']['cpus']}-core machine shared with other work): {servers}. Each is driven by its own open-loop load at a steady "
        f"rate and governed by the p95 the worker scrapes from its own metrics page (MLServer's through "
        f"`dqoes.latency.match`, its inference requests only), {d['duration_s']:g} s per policy in "
        f"{d['window_s']:g} s windows. Rates and objectives come from a calibration under default before any "
        f"policy ran ({d['calibrate_s']:g} s with all three loaded, half that for each alone): each server's rate needs {', '.join(f'{x:g}' for x in d['shares'])} of the node's cores at "
        f"its measured CPU a request; objectives are {d['tight']:g} x (first server) and {d['loose']:g} x (the "
        f"others) the p95 each had with all three loaded without limits: {objectives}. **Met**: the clients' p95 "
        f"at or under the objective itself / within the band, at or under (1 + alpha) x the objective (alpha "
        f"0.1, as every other table counts met), per window and at the plateau (median of the last third's windows). "
        f"**Client / worker p95**: the plateau medians of the p95 the clients measured (from each request's due "
        f"time) and of the p95 the worker read. Made by `{d['command']}` (docs/data/{file}).")


def section_table(d: dict[str, Any]) -> list[str]:
    n = len(d["servers"])
    band = all("met_plateau_alpha" in r for r in d["runs"])  # summaries made before it lack the count
    extra = " met within the band (plateau) | windows met within the band |" if band else ""
    lines = [f"| policy | met (plateau) | windows met |{extra} CPU (cores) | machine busy (cores) | "
             + " | ".join(f"{s['name']} client / worker p95 (ms)" for s in d["servers"]) + " |",
             "|---|---|---|---|---|" + ("---|---|" if band else "") + "---|" * n]
    for r in d["runs"]:
        cells = []
        for s in r["servers"]:
            ratio = s["worker_over_client"]
            mark = "" if ratio is None else (" ✓" if abs(ratio - 1) <= AGREE else f" ({(ratio - 1) * 100:+.0f} %)")
            met = "met" if s["plateau_met"] else "within the band" if s.get("plateau_met_alpha") else "missed"
            cells.append(f"{_ms(s['plateau_client_p95_s'])} / {_ms(s['plateau_worker_p95_s'])}{mark}, {met}")
        within = f" {r['met_plateau_alpha']}/{n} | {r['windows_met_alpha']}/{r['windows']} |" if band else ""
        lines.append(f"| {r['policy']} | {r['met_plateau']}/{n} | {r['windows_met']}/{r['windows']} |{within} "
                     f"{r['cpu_cores']:.2f} | {r['machine_busy_cores']:.2f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"✓: client and worker p95 within {AGREE * 100:.0f} %; otherwise the worker's difference. "
                 "**CPU**: what the three servers spent; **machine busy**: the whole machine, other work included.")
    return lines
