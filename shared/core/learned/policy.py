"""The learned policy: the round that ties curves, pools, solver and guards together.

Each round (`decide`): every container's batches since the last round pass into its curve
(`observe`, through the drift watch in `guards`); the node's pools set each curve's priors
(`pooling`); the solver plans every limit (`solver`); the guards keep limits where a move would
chase noise and keep the node from overcommitting (`guards`); the next round is set for when the
next informative batch is due, backing off while none is. Two batches in a row far off a curve at
its limit call a round at once (`wants_round`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from shared.core.classification import classify_views
from shared.core.learned.curve import Curve
from shared.core.learned.fit import NOISE_PRIOR, exp_or_inf
from shared.core.learned.guards import OUTLIER_SD, Spell, kept, settle, stepped
from shared.core.learned.observe import foresee, observe
from shared.core.learned.plan import Plan, PlanKind
from shared.core.learned.pooling import node_spell, note_recent, own_fits, pool_heights, pool_slopes
from shared.core.learned.reason import Reason
from shared.core.learned.settings import LearnedParams, Settings
from shared.core.learned.solver import Solver, floors, solve
from shared.core.policy import CurveLookup, PolicyBase, PolicySpec, build_decision, no_curves
from shared.core.profiles import ModelProfile
from shared.core.types import BatchObs, Decision, NodeView

PRIOR_THETA_SD = 0.35
"""How far (log) a calibrated profile's work per batch may be off when used as a prior."""
FEW_BATCHES = 4
"""A curve with fewer observations than this is still being learnt: rounds follow its batches."""


class LearnedPolicy(PolicyBase):
    """Learned latency curves, a count-maximising solve each round, event-driven rounds."""

    name = "learned"

    def __init__(self, params: LearnedParams | None = None, curve_of: CurveLookup = no_curves,
                 solver: Solver = solve) -> None:
        self.params = params or LearnedParams()
        self.solver = solver
        """What plans the limits from the curves (`solver.solve`; a test may hand in fixed plans)."""
        self.settings = Settings.of(self.params)
        self.curve_of = curve_of
        self.curves: dict[str, Curve] = {}
        self.plans: dict[str, Plan] = {}
        """The solver's plans of the last round, by container (before the guards)."""
        self.chosen: set[str] = set()
        """Containers the last round gave what they need to be met."""
        self._interval_s = self.params.initial_interval_s
        self.chances: set[str] = set()
        """Containers not met for sure (left out for room, or at their edge) that were given what
        was left last round for a chance at their band."""
        self.fast_held: dict[str, float] = {}
        """Containers too fast at the floor, and the limit they were last set or kept at as such."""
        self.reasons: dict[str, Reason] = {}
        """Why each container got its limit last round, as data (rendered into the Decision's text)."""

    def set_params(self, params: LearnedParams) -> None:
        self.params = params
        self.settings = Settings.of(params)
        self._interval_s = params.initial_interval_s

    def wants_round(self, name: str, latency_s: float, now_s: float) -> bool:
        """Two batches in a row far off the curve at their limit: the curve moved, decide now."""
        c = self.curves.get(name)
        t = c.timing if c is not None else None
        if t is None or t.expected is None:
            return False
        mean, tol = t.expected
        t.strikes = t.strikes + 1 if abs(math.log(latency_s) - mean) > tol else 0
        if t.strikes >= 2:
            t.strikes = 0
            t.expected = None  # once per change: the round that follows re-fits
            return True
        return False

    def curve(self, name: str) -> Curve:
        """A container's curve, made on first use (from its calibrated profile where `use_prior`)."""
        c = self.curves.get(name)
        if c is None:
            c = Curve()
            prior = self.curve_of(name) if self.settings.sharing.use_prior else None
            if prior is not None:
                c.prior.theta_mean, c.prior.theta_sd = prior_theta(prior), PRIOR_THETA_SD
                c.sat_cores = float(prior.threads)
            self.curves[name] = c
        return c

    def _spell_of(self, name: str) -> Callable[[BatchObs], Spell] | None:
        """The node's spell check for a container's batches (None: the spell guard is off)."""
        if not self.settings.sharing.spell_guard:
            return None

        def of(b: BatchObs) -> Spell:
            return lambda start_s, side: node_spell(self.curves, name, start_s, b.finished_at_s, side)
        return of

    def _learn(self, view: NodeView) -> None:
        """Every container's batches into its curve, then the node's pools into every curve's priors."""
        share = self.settings.sharing
        cores = view.cores
        present = {v.name for v in view.containers}
        for gone in [n for n in self.curves if n not in present]:
            del self.curves[gone]
        busy = sum(v.cpu_share or 0.0 for v in view.containers)
        for v in view.containers:
            curve = self.curve(v.name)
            curve.node.workload = v.workload or curve.node.workload
            curve.steps = v.follows_limit and share.thread_steps
            if share.spell_guard:
                note_recent(v, curve, cores)
        for v in view.containers:
            spell_of = self._spell_of(v.name)
            observe(v, self.curves[v.name], cores, busy, self.settings.memory,
                    self.settings.rounds.initial_interval_s, spell_of)
        own = own_fits(self.curves)
        if share.pool_slopes:
            pool_slopes(self.curves, own)
        else:  # turned off at runtime: no curve keeps the node's prior it had
            for c in self.curves.values():
                if c.node.k is not None:
                    c.node.k, c.fit = None, None
        if share.pool_work:
            pool_heights(self.curves, own)
        else:
            for c in self.curves.values():
                if c.node.height is not None:
                    c.node.height, c.fit = None, None

    def decide(self, view: NodeView) -> Decision:
        """One round: learn from the batches since the last, plan every limit, keep those the guards
        hold, never overcommit, and set when the next round comes."""
        limits = self.settings.limits
        cl = classify_views(view.containers)
        cores = view.cores
        self._learn(view)
        solution = self.solver(self.curves, view.containers, cores, limits, self.chosen, self.chances)
        plans = self.plans = solution.plans
        self.chosen, self.chances = solution.chosen, solution.chances
        low = floors(self.curves, view.containers, cores)
        proposal: dict[str, float] = {}
        for v in view.containers:
            plan, old, curve = plans[v.name], v.limit, self.curves[v.name]
            new, floor = plan.limit, low[v.name]
            if old is not None:
                if kept(plan, curve, v, old, cores, floor, limits.dead_band, self.fast_held.get(v.name)):
                    # Kept, less any part of a core above one that adds no thread.
                    new = curve.snap(old, cores, floor)
                elif plan.kind is PlanKind.IN_BAND:
                    new = stepped(curve, new, old, cores, floor)
            # A request server's queue must drain, whatever else holds its limit.
            proposal[v.name] = max(new, floor) if curve.load.cores else new
        settle(proposal, plans, {v.name: v.limit for v in view.containers}, self.chances, low)
        self.fast_held = {n: proposal[n] for n in proposal if plans[n].kind is PlanKind.TOO_FAST}
        limits_set: dict[str, float | None] = {}
        reasons: dict[str, Reason] = {}
        for v in view.containers:
            new, old, curve = proposal[v.name], v.limit, self.curves[v.name]
            fit, at = curve.solve(), curve.predict_limit(new * cores)
            curve.timing.expected = (None if fit is None or at is None
                                     else (at[0], OUTLIER_SD * max(fit.noise_sd, NOISE_PRIOR) + at[1]))
            curve.timing.strikes = 0
            curve.switch.foresight = foresee(curve, new * cores, view.now_s) if new is not None else None
            if new != old:
                curve.timing.changed_at_s = view.now_s
                lat = curve.predict_limit(new * cores)
                step = exp_or_inf(lat[0]) if lat is not None else math.inf
                if not math.isfinite(step):  # no fit yet, or one that foresees past a float's range
                    step = v.latency_s or v.last_latency_s or 0.0
                # The batch running now straddles the change and already tells something.
                curve.timing.expect_at_s = view.now_s + step
            limits_set[v.name] = new
            reasons[v.name] = Reason.of(plans[v.name], curve, v.name in self.chances)
        self.reasons = reasons
        # The one place a reason becomes text: the Decision carries it to messages and logs.
        ups = {name: (new, reasons[name].text()) for name, new in limits_set.items()}
        interval = self._next_interval(view.now_s)
        return build_decision(self.name, view, cl, ups, interval_s=interval,
                              listener=f"next informative batch in {interval:.3g} s")

    def _next_interval(self, now_s: float) -> float:
        """The wait until a batch is due that can change a decision; doubling while none is."""
        r = self.settings.rounds
        due = []
        for c in self.curves.values():
            t = c.timing
            if c.n == 0:
                due.append(now_s + r.initial_interval_s)
            elif t.changed_at_s is not None and (t.last_clean_s is None or t.last_clean_s <= t.changed_at_s):
                if t.expect_at_s is not None and t.expect_at_s > now_s:
                    due.append(t.expect_at_s)
                else:  # late: look again at a fraction of its batch time
                    step = (t.expect_at_s or now_s) - (t.changed_at_s or now_s)
                    due.append(now_s + max(r.initial_interval_s, step / 4))
            elif c.n < FEW_BATCHES and t.batch_s is not None:
                # A curve seen a few times (a newcomer, or one that restarted after a drift) is still
                # being learnt: its next batch can change the decision.
                due.append(now_s + t.batch_s)
        if due:
            self._interval_s = min(r.max_interval_s, max(r.initial_interval_s, min(due) - now_s))
        else:
            self._interval_s = min(r.max_interval_s, self._interval_s * 2)
        return self._interval_s


def prior_theta(profile: ModelProfile) -> float:
    """log latency at one core per a calibrated profile: its CPU work per batch (one thread or more)."""
    return math.log(profile.latency_s(1.0, max(1.0, float(profile.threads))))


SPEC = PolicySpec(
    name="learned",
    label="learned curves",
    summary="our allocator: learns each container's latency curve online and solves for the most met, "
    "then in band, then the least CPU",
    params_type=LearnedParams,
    factory=lambda params, context: LearnedPolicy(params, context.curve_of),
)
