"""Message and value speed: building, encoding and decoding what crosses the bus, building the core's values.

Why: the worker decodes every latency event (tens of thousands a second at scale) and a round builds
some 4,000 core values at 1,000 containers; these are the per-call costs behind both
(docs/decisions/msgspec-messages.md). CPU time per call, best of five, so that a busy machine
changes the figures less.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

from bench.common import report
from shared import schema
from shared.core.types import BatchObs, Cls, ContainerDecision, ContainerView
from shared.schema import ContainerState, LatencyEvent, NodeState


def per_call_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5, timer=time.process_time)) / number * 1e6


def latency() -> LatencyEvent:
    return LatencyEvent(container="resnet.1", node="node-a", latency_s=12.5, images=100, cpu_s=11.75, batch=7,
                        model="resnet50", finished_at=1700000000.0, follows_limit=True)


def container(i: int) -> ContainerState:
    return ContainerState(container=f"c{i}", model="resnet50", objective_s=40.0, alpha=0.1, latency_s=35.0,
                          cls=Cls.G, slack_s=5.0, limit=0.45, cpu_share=0.5, managed=True, met=True,
                          cpu_cores_used=1.0, throttled_ratio=0.25, last_batch_at=1699999990.0)


def node_state(n: int = 100) -> NodeState:
    cs = tuple(container(i) for i in range(n))
    return NodeState(node="node-a", policy="dqoes", cores=32.0, round=42, at=1700000000.0, interval_s=20.0,
                     slack_sum_g_s=5.0, slack_sum_b_s=-3.5, satisfied=1,
                     members={"G": tuple(c.container for c in cs), "S": (), "B": (), "pending": ()},
                     containers=cs, params={"alpha": 0.1})


def run() -> dict:
    ev, ns = latency(), node_state()
    ev_bytes, ns_bytes = schema.encode(ev, "c", 1700000000.25), schema.encode(ns, "w", 1700000000.25)
    figures = [
        ("latency_build_us", "LatencyEvent: build", latency, 20000),
        ("latency_encode_us", "LatencyEvent: encode (with the check a peer makes)",
         lambda: schema.encode(ev, "c", 1700000000.25), 20000),
        ("latency_decode_us", "LatencyEvent: decode_latency (the worker's hot path)",
         lambda: schema.decode_latency(ev_bytes), 20000),
        ("latency_decode_any_us", "LatencyEvent: decode (any message type)", lambda: schema.decode(ev_bytes), 20000),
        ("node_state_build_us", "NodeState, 100 containers: build", node_state, 200),
        ("node_state_encode_us", "NodeState, 100 containers: encode", lambda: schema.encode(ns, "w", 1.0), 200),
        ("node_state_decode_us", "NodeState, 100 containers: decode", lambda: schema.decode(ns_bytes), 200),
        ("container_view_build_us", "ContainerView (12 fields): build",
         lambda: ContainerView("c1", 10.0, 0.1, 9.5, 9.0, 0.2, 0.25, Cls.S, 1.0, (), "m@1", True), 50000),
        ("container_decision_build_us", "ContainerDecision (9 fields): build",
         lambda: ContainerDecision("c1", Cls.B, -2.0, 12.0, 0.2, 0.2, 0.3, "B", 0.25), 50000),
        ("batch_obs_build_us", "BatchObs (8 fields): build",
         lambda: BatchObs(9.5, 12.0, 0.25, False, 3, 2.1, 5.0, 0.2), 50000),
    ]
    return {key: report(label, per_call_us(fn, n), "us") for key, label, fn, n in figures}
