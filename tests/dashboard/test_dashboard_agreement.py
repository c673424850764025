"""The figures show the right numbers: the view's tables against the cluster state on the bus.

A real cluster (manager and two workers over a real nats-server) runs; the
dashboard's collector follows it. The manager sums the node states it holds
into `dqoes.cluster.state` (published every half second, and answered on
`dqoes.cluster.query`); each node summary carries the `at` of the state it
summed. The view's summary of the samples with exactly those times must say
what the manager says, number for number, and the charts' series must pass
through the same values at the same moments.
"""

from __future__ import annotations

import asyncio

import pytest
from dash_helpers import wait_until

from dashboard import views
from dashboard.live import Collector
from shared import subjects
from shared.bus import Bus
from shared.public import ClusterState

pytestmark = pytest.mark.integration

COUNTS = ("satisfied", "G", "S", "B", "pending", "containers")
SUMS = ("slack_sum_g_s", "slack_sum_s_s", "slack_sum_b_s")


def _has_samples(run, cs: ClusterState) -> bool:
    r = run.rounds
    return all(((r["node"] == n) & (r["at"] == s.at)).any() for n, s in cs.nodes.items())


def _check(run, cs: ClusterState) -> None:
    at_by_node = {n: s.at for n, s in cs.nodes.items()}
    summary = views.node_summary(run, at_by_node=at_by_node)
    assert list(summary.index) == [*sorted(cs.nodes), views.TOTAL]
    for node, n in cs.nodes.items():
        row = summary.loc[node]
        for f in COUNTS:
            assert row[f] == getattr(n, f), (node, f)
        for f in SUMS:
            assert row[f] == pytest.approx(getattr(n, f), abs=1e-9), (node, f)
        assert (row["interval_s"], row["policy"]) == (n.interval_s, n.policy)
    total = summary.loc[views.TOTAL]
    assert total["satisfied"] == cs.satisfied_total
    assert total["containers"] == cs.containers_total
    for f in ("G", "S", "B", "pending"):
        assert total[f] == getattr(cs, f)
    for f in SUMS:
        assert total[f] == pytest.approx(getattr(cs, f), abs=1e-9)

    # The drawn series pass through the same numbers at those samples.
    r = run.rounds
    sat = views.satisfied_frame(run)
    q = views.q_frame(run)
    for node, n in cs.nodes.items():
        t_s = float(r.loc[(r["node"] == node) & (r["at"] == n.at), "t_s"].iloc[-1])
        s_here = sat[(sat["series"] == node) & (sat["t_s"] == t_s)]["satisfied"]
        assert s_here.iloc[-1] == n.satisfied
        q_here = q[(q["node"] == node) & (q["t_s"] == t_s)].set_index("measure")["slack_sum_s"]
        assert q_here["Q_G"] == pytest.approx(n.slack_sum_g_s) and q_here["Q_B"] == pytest.approx(n.slack_sum_b_s)
        assert q_here["Q_S"] == pytest.approx(n.slack_sum_s_s)
        c = run.containers
        seq = int(r.loc[(r["node"] == node) & (r["at"] == n.at), "round"].iloc[-1])
        classes = c[(c["node"] == node) & (c["round"] == seq)]["cls"].value_counts()
        for k in ("G", "S", "B"):
            assert classes.get(k, 0) == getattr(n, k), (node, k)


async def _query(url: str) -> ClusterState:
    async with await Bus.connect(url, "test-query") as bus:
        return ClusterState.from_json(await bus.request(subjects.CLUSTER_QUERY, b"", timeout_s=3))


def test_the_view_says_what_the_manager_says(small_stack):
    coll = Collector([("dqoes", small_stack.url)]).start()
    try:
        # Wait for a cluster state that sums both nodes with containers on them.
        def published() -> ClusterState | None:
            cs = coll.snapshot().sources[0].cluster
            return cs if cs and len(cs.nodes) == 2 and cs.containers_total == 6 else None

        checked = 0
        seen: set[float] = set()
        while checked < 3:  # three different published states, as the run moves
            cs = wait_until(lambda: (c := published()) and c.at not in seen and c, 30)
            seen.add(cs.at)
            run = wait_until(lambda cs=cs: (x := coll.snapshot().sources[0].run)
                             and _has_samples(x, cs) and x, 10)
            _check(run, cs)
            checked += 1

        # The manager's reply to a query, at the same moment, says the same too.
        cs = asyncio.run(_query(small_stack.url))
        run = wait_until(lambda: (x := coll.snapshot().sources[0].run) and _has_samples(x, cs) and x, 10)
        _check(run, cs)
        assert cs.satisfied_total >= 0 and cs.containers_total == 6
    finally:
        coll.stop()
