"""The simulated runtime stamps each batch with the wall time of its simulated end, as a workload does.

The physics hands a batch over when something advances it (its own wake-up, or a
round reading the CPU counters), which can be after the batch ended; the worker
places a batch by its stamp (shared/core/controller.py `finished_on_clock`), so
a stamp taken at hand-over would put a batch that ended before a round after it.
"""

from __future__ import annotations

import time

import pytest

from shared.runtime.factory import RuntimeSettings, make_runtime
from shared.scenarios.builtin import load

SCALE = 10.0


def test_a_batch_handed_over_late_is_stamped_when_it_ended_in_simulated_time():
    got: list[tuple[str, float, int, float]] = []
    start_at = time.time() - 120.0 / SCALE  # scenario time 0 fell two minutes of scenario time ago
    rt = make_runtime(RuntimeSettings(kind="sim", node="worker-1", scenario=load("paper-varied", 1),
                                      time_scale=SCALE, start_at=start_at),
                      lambda name, latency_s, images, batch, cpu_s, model, follows, finished_at:
                      got.append((name, latency_s, batch, finished_at)))
    rt._advance(rt.now_s())  # one late hand-over of everything that ended in those minutes
    assert len(got) >= 10
    ends: dict[str, float] = {}
    for name, latency_s, _, finished_at in got:
        sim_end = (finished_at - start_at) * SCALE  # back on the scenario clock
        assert sim_end < 120.0 + 1e-3
        # Each batch ends where its successor begins (one batch after another, no gap).
        if name in ends:
            assert sim_end - latency_s == pytest.approx(ends[name], abs=0.05)
        ends[name] = sim_end
    # The first batches ended a minute or more of scenario time before the hand-over, and say so.
    assert min((f - start_at) * SCALE for *_, f in got) < 60.0
