"""Algorithm 1's first half (classification and the sums), shared by every policy.

DQoES acts on it; the default baseline and the oracle only report it, so all
policies are judged by the same ruler. Kept apart from the limit update so the
reporting side can never pick up DQoES's control behaviour by accident.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from shared.core.types import CLS_B, CLS_G, Cls, ContainerView, classify


class Classified(msgspec.Struct, frozen=True):
    """One container after classification. `fresh`: a new batch arrived this round."""

    view: ContainerView
    cls: Cls | None
    slack_s: float | None
    fresh: bool


class Classification(msgspec.Struct, frozen=True):
    """Algorithm 1, lines 2-15: the partition and the per-class sums (Q in s, R in node fractions)."""

    items: tuple[Classified, ...]
    slack_sum_g_s: float
    slack_sum_b_s: float
    r_g: float
    r_b: float
    satisfied: int
    met: int = 0
    """S and G: at or under (1 + alpha) x the objective."""

    def members(self, cls: Cls) -> tuple[str, ...]:
        return tuple(c.view.name for c in self.items if c.cls is cls)


def classify_views(views: Sequence[ContainerView]) -> Classification:
    """Classify each container by its newest latency; one with no new batch keeps its class.

    A container that has never completed a batch is pending (class None): it is
    in |C| but in none of G, S, B.
    """
    items: list[Classified] = []
    q_g = q_b = r_g = r_b = 0.0
    n_s = n_g = 0
    for v in views:
        if v.latency_s is not None:
            q = v.objective_s - v.latency_s
            cls: Cls | None = classify(v.objective_s, v.latency_s, v.alpha)
            fresh = True
        elif v.prev_cls is not None and v.last_latency_s is not None:
            # Carried over; reclassify against the current objective and alpha
            # so a changed target takes effect even before the next batch.
            q = v.objective_s - v.last_latency_s
            cls = classify(v.objective_s, v.last_latency_s, v.alpha)
            fresh = False
        else:
            items.append(Classified(v, None, None, False))
            continue
        usage = v.cpu_share or 0.0
        if cls is CLS_G:
            q_g += q
            r_g += usage
            n_g += 1
        elif cls is CLS_B:
            q_b += q
            r_b += usage
        else:
            n_s += 1
        items.append(Classified(v, cls, q, fresh))
    return Classification(tuple(items), q_g, q_b, r_g, r_b, n_s, n_s + n_g)
