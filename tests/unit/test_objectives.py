"""Which objective governs a container (own > service > label) and the percentile of its batches."""

from __future__ import annotations

import pytest

from shared.core.objectives import (
    BatchWindow,
    Objective,
    batch_percentile,
    matches,
    parse_selector,
    resolve,
)

SWARM = {"com.docker.swarm.service.name": "api", "app": "web"}
COMPOSE = {"com.docker.compose.service": "api"}
OWN = Objective(0.1)
SERVICE = Objective(0.2, percentile=95.0, window_s=30.0)
LABEL = Objective(0.4)


@pytest.mark.parametrize(("labels", "selector", "expected"), [
    (SWARM, "api", True),
    (COMPOSE, "api", True),
    (SWARM, "app=web", True),
    (SWARM, "app=api", False),
    (COMPOSE, "web", False),
    ({}, "api", False),
    ({"api": "x"}, "api", False),
])
def test_a_selector_matches_a_service_name_or_a_label(labels, selector, expected):
    assert matches(selector, labels) is expected


@pytest.mark.parametrize("bad", ["", "=api", "app=", "a b", "api!", "x=y=z", "-api"])
def test_a_malformed_selector_is_refused_with_one_line(bad):
    with pytest.raises(ValueError) as e:
        parse_selector(bad)
    assert "\n" not in str(e.value) and "service name" in str(e.value)


def test_the_container_s_own_objective_wins_over_its_service_and_its_label():
    r = resolve(OWN, {"api": SERVICE}, SWARM, LABEL)
    assert (r.objective, r.source, r.selector) == (OWN, "container", None)


def test_a_service_objective_wins_over_the_label():
    r = resolve(None, {"api": SERVICE}, SWARM, LABEL)
    assert (r.objective, r.source, r.selector) == (SERVICE, "service", "api")


def test_the_label_is_the_last_resort_and_nothing_means_unmanaged():
    assert resolve(None, {"other": SERVICE}, SWARM, LABEL).source == "label"
    r = resolve(None, {"other": SERVICE}, SWARM, None)
    assert (r.objective, r.source) == (None, None)


def test_of_two_matching_services_the_first_selector_in_sorted_order_governs():
    by_label = Objective(0.3)
    r = resolve(None, {"app=web": by_label, "api": SERVICE}, SWARM, None)
    assert (r.objective, r.selector) == (SERVICE, "api")


def test_the_percentile_of_batches_counts_only_the_window():
    batches = [(float(t), float(t)) for t in range(1, 101)]  # latency t at time t
    # Window (70, 100]: latencies 71..100; the 50th percentile is 85.
    assert batch_percentile(batches, 100.0, 50.0, 30.0) == 85.0
    assert batch_percentile(batches, 100.0, 95.0, 30.0) == 99.0
    assert batch_percentile(batches, 200.0, 95.0, 30.0) is None


@pytest.mark.parametrize(("percentile", "window_s"), [(0.0, 10.0), (100.0, 10.0), (50.0, 0.0), (50.0, -1.0)])
def test_a_percentile_outside_0_100_or_a_window_not_above_0_is_refused(percentile, window_s):
    with pytest.raises(ValueError):
        batch_percentile([(1.0, 1.0)], 1.0, percentile, window_s)


def test_a_batch_window_forgets_batches_older_than_its_window():
    w = BatchWindow()
    for t in range(1000):
        w.add(float(t), 0.01 * t, 10.0)
    assert len(w.batches) <= 11
    assert w.percentile(999.0, 95.0, 10.0) == pytest.approx(9.99)
