"""What verify steps cost while decoding: the load-time price of a verify row, corrected by the
decode steps' own timings.

Why: the draft budget prices a verify forward of n rows at c(n) = 1 + ratio * x(n) 1-row steps,
timed once at load by back-to-back probe forwards (draft_budget.measure_row_shape). Inside decoding
rows cost more than that, and the probe is noisy: on a Zen 4 host (2 threads, 2,000 tokens) a 1-row
step inside decoding took 9.5 ms and an 11-row one 24.6 ms (x2.59), back to back 11.7 and 22.2 ms
(x1.90), and four engine loads in one process read the 11-row forward at 2.69, 2.93, 1.94 and 1.92
steps (README, "Session 35"). The budget then drew trees of 2.7 nodes in one run and 4.3 in another.

Model: each decode step's verify seconds (its forward, the acceptance and the cache's trim; not
drafting, and not streaming the kept tokens, which is the same text whatever the draft's size) are
t = u + v * f, where f = ratio(L) * x(n) is what the load-time price says the step's n rows cost
beyond a 1-row step (at its context length L) and u the seconds of a 1-row step. A weighted
least-squares fit over the steps (each step's weight fades by FORGET, so about the last 50 steps
count) gives u and v; `row_scale` = v / u corrects the load-time price. PRIOR_WEIGHT pseudo-steps
that agree with the load-time price (v = u), placed where the steps' own f lie, keep it where the
steps say little: at the start, and while every step has the same rows (plain decoding: f = 0
throughout says nothing of rows). A draft model's token is priced likewise: the seconds its
proposals took over the tokens the budget planned for them, over u, blended with the price timed at
load (PRIOR_WEIGHT pseudo-tokens at that price).

A timing more than CLIP times off the fit (another process took the core, a garbage collection) counts
as CLIP times the prediction, once FIT_AFTER steps gave the fit something to go on.

Limits: a load-time price of 0 (no row cost measurable: a GPU, AMX, where every forward has the same
rows) stays 0, since every f is 0 (where rows cost time, DecoderRunner.rows_cost_time, the engine
prices a timed 0, which only disturbed timings give, at engine.UNTIMED_ROW instead);
u is one number for every context length, so a run of long requests after short ones is partly read
as dearer rows (the load-time price's own slope in the context carries most of that); a proposal's
fixed work (the draft's catch-up with the accepted tokens, the n-gram look-up before it) is priced
per planned token, which weighs most on small plans.

Worked example: load price 0.1 a row, steps of 1 row at 10 ms and of 11 rows (f = 1.0) at 30 ms:
u = 10 ms, v = 20 ms, so a row costs 0.2 of a step, twice the load's price (row_scale 2.0; the
prior pulls it a little towards 1: fit's example).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

FORGET = 0.98  # weight left to earlier steps after each new one (about the last 50 count)
PRIOR_WEIGHT = 4.0  # pseudo-steps (and pseudo-tokens) at the load-time price
CLIP = 3.0  # a step timed more than this many times off the fit counts as this many times
FIT_AFTER = 10.0  # weight of steps before timings are clipped
SCALE_RANGE = (0.25, 8.0)  # row_scale stays within these (a degenerate fit: few distinct f)
# the prior's second pseudo-step lies at least this far out: where the steps' f are all small (plain
# steps and an exploring token now and then) their slope is mostly noise, and the prior holds
PRIOR_REACH = 0.25


@dataclass
class _Sums:
    """Fading weighted sums of (f, t): what the least-squares fit needs."""

    w: float = 0.0
    f: float = 0.0
    ff: float = 0.0
    t: float = 0.0
    ft: float = 0.0

    def fade(self, factor: float) -> None:
        self.w, self.f, self.ff, self.t, self.ft = (
            self.w * factor,
            self.f * factor,
            self.ff * factor,
            self.t * factor,
            self.ft * factor,
        )

    def add(self, f: float, t: float, weight: float = 1.0) -> None:
        self.w += weight
        self.f += weight * f
        self.ff += weight * f * f
        self.t += weight * t
        self.ft += weight * f * t


class StepCosts:
    """Learns u, v and a draft token's seconds from decode steps (see the module's docstring)."""

    def __init__(self) -> None:
        self._steps = _Sums()
        self._draft_tokens = 0.0  # fading count of draft-model tokens drafted
        self._draft_seconds = 0.0  # and the fading seconds they took

    def observe_step(self, extra: float, seconds: float) -> None:
        """A decode step whose rows the load-time price put at `extra` 1-row steps beyond a 1-row
        step (0 for a plain step) took `seconds` outside drafting."""
        if seconds <= 0.0 or extra < 0.0:
            return
        if self._steps.w >= FIT_AFTER:
            u, v = self.fit()
            predicted = u + v * extra
            if predicted > 0.0:
                seconds = min(max(seconds, predicted / CLIP), predicted * CLIP)
        self._steps.fade(FORGET)
        self._steps.add(extra, seconds)

    def observe_drafting(self, tokens: int, seconds: float) -> None:
        """A draft model's proposal, planned at `tokens` tokens (a tree's nodes), took `seconds`
        (clipped as observe_step's timings: a draft model's window jump re-reads its context)."""
        if tokens <= 0 or seconds <= 0.0:
            return
        if self._draft_tokens >= FIT_AFTER:
            predicted = self._draft_seconds / self._draft_tokens * tokens
            seconds = min(max(seconds, predicted / CLIP), predicted * CLIP)
        self._draft_tokens = self._draft_tokens * FORGET + tokens
        self._draft_seconds = self._draft_seconds * FORGET + seconds

    def fit(self) -> tuple[float, float]:
        """(u, v): seconds of a 1-row step and per 1-row step of load-priced extra rows.

        The steps' sums plus PRIOR_WEIGHT pseudo-steps on v = u, half at f = 0 and half at twice the
        steps' mean f or PRIOR_REACH, whichever is further (where the steps' own f lie: a pseudo-step
        far beyond them would outweigh them; a slope from tiny f only would be noise), scaled to the
        steps' own seconds (u0 = sum t / sum (1 + f): the load's price fitted to them). (0, 0)
        before any step; (u0, u0) while every step was a 1-row one.

        >>> costs = StepCosts()
        >>> for _ in range(200):
        ...     costs.observe_step(0.0, 0.010)
        ...     costs.observe_step(1.0, 0.030)
        >>> [round(x, 4) for x in costs.fit()], round(costs.row_scale(), 2)  # the prior: 4 of ~54
        ([0.0103, 0.0195], 1.9)
        """
        s = self._steps
        if s.w <= 0.0:
            return 0.0, 0.0
        u0 = s.t / (s.w + s.f)
        mean = s.f / s.w
        if mean <= 1e-9:
            return u0, u0
        total = replace(s)  # the steps and the prior's pseudo-steps
        total.add(0.0, u0, PRIOR_WEIGHT / 2)
        reach = max(2.0 * mean, PRIOR_REACH)
        total.add(reach, u0 * (1.0 + reach), PRIOR_WEIGHT / 2)
        spread = total.w * total.ff - total.f * total.f  # > 0: the prior's two points differ in f
        v = (total.w * total.ft - total.f * total.t) / spread
        u = (total.t - v * total.f) / total.w
        return u, v

    def row_scale(self) -> float:
        """v / u: what the steps say a load-priced row really costs, as a multiple of that price
        (1.0 before any step)."""
        u, v = self.fit()
        low, high = SCALE_RANGE
        if u <= 0.0:  # no time left for a 1-row step: rows are all a step costs, or nothing was seen
            return high if v > 0.0 else 1.0
        return min(max(v / u, low), high)

    def draft_cost(self, probed: float) -> float:
        """A draft-model token's cost in 1-row steps: `probed` (timed at load) blended with the
        decode steps' own (PRIOR_WEIGHT pseudo-tokens at `probed`)."""
        u, _ = self.fit()
        if u <= 0.0 or self._draft_tokens <= 0.0:
            return probed
        observed = self._draft_seconds / self._draft_tokens / u
        return (PRIOR_WEIGHT * probed + self._draft_tokens * observed) / (PRIOR_WEIGHT + self._draft_tokens)
