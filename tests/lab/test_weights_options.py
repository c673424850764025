"""The weights experiment's options, weights and report, without running anything.

The real runs (root, cgroups, processes) are in tests/workloads/test_weights_experiment.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.common import ExperimentError
from lab import weights

REPO = Path(__file__).resolve().parents[2]


def test_default_quotas_are_a_quarter_and_a_half_of_the_node():
    assert weights.parse_quotas(None, 2) == [0.5, 1.0]
    assert weights.parse_quotas(None, 16) == [4.0, 8.0]
    assert weights.parse_quotas("0.25, 1", 2) == [0.25, 1.0]


@pytest.mark.parametrize("text", ["", "a", "0", "-1", "nan", "1.5,1"])
def test_bad_quotas_are_refused(text):
    with pytest.raises(ExperimentError, match="--quotas"):
        weights.parse_quotas(text, 2)


def test_conditions_and_other_options_are_checked_before_anything_runs():
    assert weights.parse_conditions("weighted, alone") == ["weighted", "alone"]
    with pytest.raises(ExperimentError, match="--conditions"):
        weights.parse_conditions("alone,crowded")
    for bad, flag in [(dict(workload="gpu"), "--workload"), (dict(duration_s=0), "--duration-s"),
                      (dict(warmup_s=-1), "--warmup-s"), (dict(model="alexnet"), "--models"),
                      (dict(node_cores=0), "--node-cores"), (dict(neighbour_procs=0), "--neighbour-procs"),
                      (dict(batch_size=0), "--batch-size"), (dict(neighbour_at="moon"), "--neighbour-at"),
                      (dict(section="a b"), "--section")]:
        with pytest.raises(ExperimentError, match=flag):
            weights.validate(weights.WeightsOptions(**bad))
    cores, quotas, conds = weights.validate(weights.WeightsOptions(node_cores=4))
    assert (cores, quotas, conds) == (4, [1.0, 2.0], ["alone", "neighbour", "weighted"])


def test_managed_weight_is_the_kernels_maximum_times_the_limits_share_of_the_node():
    assert weights.managed_weight(1, 0.5, 2) == 64.0  # cpu.shares 65536 of 262144
    assert weights.managed_weight(1, 1.0, 2) == 128.0
    assert weights.managed_weight(2, 4.0, 16) == 25.0  # cpu.weight 2500 of 10000
    assert weights.managed_weight(2, 1e-6, 16) == 0.01  # clamped to the kernel's minimum, 1


def _result() -> dict:
    groups = [{"group": "managed-0", "quota_cores": 0.5, "weight": 1.0, "weight_raw": 1024, "cores": 0.4987,
               "ratio": 0.9974, "throttled_share": 0.97, "latency_median_s": 3.61, "batches": 15}]
    cond = {"condition": "alone", "label": weights.CONDITIONS["alone"][0], "neighbour": False, "weighted": False,
            "neighbour_procs": 0, "neighbour_cores": 0.0, "other_cores": 0.02, "seconds": 60.0,
            "loadavg_before": [0.1, 0.2, 0.3], "loadavg_after": [0.5, 0.3, 0.3], "groups": groups}
    meta = {"measured_at": "2026-11-23 18:00 UTC", "cores": 2, "node_cores": 2.0, "cpu_model": "x", "cgroup": "v1",
            "loadavg": [0.1, 0.2, 0.3], "command": "python -m lab weights", "workload": "inference",
            "model": "resnet50", "duration_s": 60.0, "warmup_s": 5.0}
    return {"machine": meta, "result": {"conditions": [cond], "weight_file": "cpu.shares",
                                        "weight_default_raw": 1024, "weight_max_raw": 262144, "cgroup_version": 1}}


def test_report_from_a_json_output_replaces_only_its_section(tmp_path):
    src = tmp_path / "out.json"
    src.write_text(json.dumps(_result()))
    md = tmp_path / "results.md"
    md.write_text(f"# Results\n\nkept\n\n{weights.BEGIN}\nold\n{weights.END}\n\ntail kept\n")
    out = weights.run(weights.WeightsOptions(), lambda m: None, from_file=str(src), update=str(md))
    assert out == _result()
    text = md.read_text()
    assert "kept" in text and "tail kept" in text and "old" not in text
    # A result from before the batch noise was measured shows "-" there.
    assert ("| (a) no neighbour, default weights | managed-0 | 0.5 | 1024 | 0.499 | 1.00 | 97% | 3.610 | - | 15 |"
            in text)
    assert "| (a) no neighbour, default weights | - | - | 0.020 | 0.10 / 0.50 |" in text
    assert "load average before the run 0.1 0.2 0.3" in text
    assert "no condition ran the unmanaged neighbour" in text


def test_the_batch_noise_and_a_weighted_condition_without_a_neighbour(tmp_path):
    d = _result()
    d["result"]["conditions"][0]["groups"][0]["latency_log_sd"] = 0.0456
    weighted = dict(d["result"]["conditions"][0], condition="alone-weighted", weighted=True,
                    label=weights.CONDITIONS["alone-weighted"][0])
    d["result"]["conditions"].append(weighted)
    text = weights.render_markdown(d)
    assert "| 3.610 | 0.046 | 15 |" in text
    assert "(e) no neighbour, managed weights from the limits" in text
    assert weights.parse_conditions("alone,alone-weighted") == ["alone", "alone-weighted"]
    _, with_neighbour, managed_weighted = weights.CONDITIONS["alone-weighted"]
    assert (with_neighbour, managed_weighted) == (False, True)
    assert weights._log_sd([1.0, 2.0]) is None
    assert weights._log_sd([1.0, math.e, math.e**2]) == pytest.approx(1.0)


def test_named_sections_sit_side_by_side(tmp_path):
    src = tmp_path / "out.json"
    src.write_text(json.dumps(_result()))
    md = tmp_path / "results.md"
    for section in ("sibling", "host", "sibling"):
        weights.run(weights.WeightsOptions(section=section), lambda m: None, from_file=str(src), update=str(md))
    text = md.read_text()
    for section in ("sibling", "host"):
        begin, end = weights.markers(section)
        assert text.count(begin) == 1 and text.count(end) == 1
    assert weights.BEGIN not in text


def test_cli_bad_input_is_one_line_and_changes_nothing(tmp_path):
    md = tmp_path / "results.md"
    md.write_text("untouched\n")
    bad = tmp_path / "bad.json"
    bad.write_text('{"machine": {}}')
    for args in (["--quotas", "2,1"], ["--from", str(bad), "--update", str(md)], ["--conditions", "x"]):
        p = subprocess.run([sys.executable, "-m", "lab", "weights", *args],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith("lab: error: ") and p.stderr.count("\n") == 1
    assert md.read_text() == "untouched\n"


def test_a_sigterm_whose_interrupt_was_lost_still_ends_the_wait():
    # A SIGTERM's KeyboardInterrupt raised inside a fork's at-fork hook is printed and dropped by Python
    # (CI once saw a run go on to its full duration that way); the waits end on the flag it leaves.
    import signal
    import threading
    import time

    from experiments.common import INTERRUPTED, sigterm_as_interrupt

    with sigterm_as_interrupt():
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGTERM, None)  # raised where it would have been swallowed
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            weights._sleep([], 30.0)
        assert time.monotonic() - t0 < 1.0
    assert not INTERRUPTED.is_set()  # the next run starts clean
    assert threading.current_thread() is threading.main_thread()


def test_a_child_killed_in_cleanup_is_reaped_not_left_a_zombie(monkeypatch):
    # A busy loop forked just as the run was interrupted has no Popen to wait on: the cleanup kills
    # what its group holds. Polled once at once after the kill, such a child was still there (a zombie
    # until the run exited, 20 times of 20); the interrupted-run test saw one in /proc (29 Nov).
    import os
    from pathlib import Path

    from lab import weights
    from shared.runtime import cgroupfs

    pids = [os.posix_spawn("/bin/sleep", ["sleep", "60"], dict(os.environ)) for _ in range(5)]
    try:
        for pid in pids:
            monkeypatch.setattr(cgroupfs, "pids", lambda group, pid=pid: [pid])
            weights._kill_all_in(None)  # type: ignore[arg-type]
            assert not Path(f"/proc/{pid}").exists()
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except OSError:
                pass
