"""`learned`: learn each container's latency curve online, then solve for the best allocation.

Why: DQoES moves CPU a fixed fraction at a time on one batch's latency, so it settles in tens of
rounds, freezes when every container is late (R_G = 0) and counts throttling fast containers into
their band as a success. This policy keeps a model of each container's batch latency as a function
of the CPU it gets, learned from what the worker already observes (each batch's latency, the CPU it
used, the limit it ran under), and every round chooses the limits that make the most containers
meet their objective, then the most land in their band, then spend the least CPU, within the node.

The parts (docs/design/learned.md), each small enough to change alone:

- `fit`: the curve's line in (log cores, log latency) and its noise, as a named `Fit`;
- `curve`: one container's curve, in named parts (sums, memory switch, priors, node's share, drift watch);
- `observe`: how a finished batch becomes an observation (binding limits, warm-up, straddling);
- `guards`: the drift watch, dead bands, uncertain steps, the node never overcommitted;
- `pooling`: what the node's containers share (replicas' heights, slopes, spells);
- `solver`: the pure solver, curves and capacity in, a `Plan` per container out;
- `need`: what a container needs and what it would see, for placement and objectives;
- `settings`: the parameters as they arrive and as typed groups;
- `reason`: why a container got its limit, as an enum and numbers, rendered to text once;
- `policy`: the round that ties them together, and the registry's `SPEC`.
"""

from shared.core.learned.curve import RESTART_WATCH, Curve
from shared.core.learned.fit import K_PRIOR_SD, K_RANGE, NOISE_PRIOR, Fit
from shared.core.learned.need import Outlook, cores_needed, latency_at
from shared.core.learned.plan import Plan, PlanKind
from shared.core.learned.policy import SPEC, LearnedPolicy
from shared.core.learned.pooling import POOL_MIN
from shared.core.learned.reason import FitFacts, Reason
from shared.core.learned.settings import LearnedParams, Settings
from shared.core.learned.solver import Solution, solve

__all__ = [
    "K_PRIOR_SD", "K_RANGE", "NOISE_PRIOR", "POOL_MIN", "RESTART_WATCH", "SPEC", "Curve", "Fit", "FitFacts", "LearnedParams",
    "LearnedPolicy", "Outlook", "Plan", "PlanKind", "Reason", "Settings", "Solution", "cores_needed", "latency_at", "solve",
]
