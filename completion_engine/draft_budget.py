"""How many drafted tokens a verify step should carry: the count that maximises tokens per second.

Why: a verify forward of n rows does not cost what a 1-row step costs everywhere. On an AMX CPU in
bf16 a 16-row forward costs about a 1-row one, so drafting the whole block is free. In float32 on
an AVX2 CPU, where a plain step runs 1 row on the row-invariant kernel, each extra row costs about
a sixth of a step (`python -m eval.bench_forward`: 45 ms for a step, 118 ms for 11 rows at a 2k
context), and 10-token n-gram drafts made decoding slower than plain (`spec-complete bench`:
ngram 0.85x none, accepting 15% of what it drafted).

Model: a forward of n rows costs c(n) = 1 + ratio * x(n) steps. `ratio`, one more row's average
cost over 1 to R rows (R = max_draft + 1, at most a whole verify block of 16), is timed once per
engine at a short and a long context (`measure_row_cost`, `RowCost`) and priced at each step's
context length (`at_context`: a row's attention grows with it). x(n), the rows' shape, is timed
once at the long context (`measure_row_shape`): x(1) = 0, x(R) = R - 1 (or more, where fewer rows
timed dearer), and between them the steps the kernel's row tiles make (AVX2, float32, two threads,
2,000 tokens: 1 to 3 rows cost about what 1 does, the fourth a quarter of a step); without a
shape, a straight line x(n) = n - 1. A draft's j-th token is
accepted, given the ones before it were, with chance q_j, learned per kind of draft (its source and,
for n-gram drafts, how long its match was) from the steps so far, forgetting old ones. A step that
drafts k tokens then yields on average

    E(k) = 1 + sum_{d=1..k} q_1 * ... * q_d        tokens, for c(k + 1) steps,

and the budget keeps the k that maximises E(k) / c(k + 1). A kind whose drafts do not pay gets
k = 0, but still drafts one token every EXPLORE-th step, so that a change is noticed. Trees keep
their first k nodes (they come best first); an EAGLE head's tree (min(depth, k) levels) may keep
more nodes at those levels, as many of the likeliest as raise the step's tokens per cost with their
estimated chances of acceptance against their verify rows (`extra_nodes`): they need no draft
forward. Any k gives the same output: only the speed changes.

Free drafts (n-gram look-ups) are made whole and then trimmed. A draft model's tokens cost a
forward each, `draft_cost` of a target step (timed once per engine: the drafter's token_seconds
over a 1-row target step), so they
are sized before drafting (`plan`), a step of k of them costing c(k + 1) + k * draft_cost: a token
trimmed after it was drafted would be paid for and thrown away. (Before this, on an AVX2 CPU, the default
hybrid drafting ran at 0.97x plain decoding: model drafts of up to 5 tokens cut to 1 by the trim.)

Both prices, where timed at load, are then corrected by the decode steps' own timings
(`observe_step`, `observe_drafting`; step_costs.py): a probe's few forwards are noisy, and rows cost
more inside decoding than back to back. Prices given in the config are kept as given.

Worked example, ratio 0.2, q = 0.5 at every depth: E(1) / c(2) = 1.5 / 1.2 = 1.25,
E(2) / c(3) = 1.75 / 1.4 = 1.25, E(3) / c(4) = 1.875 / 1.6 = 1.17: k = 1 (the first best).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from completion_engine.step_costs import StepCosts
from completion_engine.types import Draft

FORGET = 0.97  # weight left to past steps after each new one (about the last 30 steps count)
PRIOR = (1.0, 1.0)  # pseudo-counts at each depth: mean 0.5 at depth 1, then the depth before's chance
EXPLORE = 8  # a kind with k = 0 still drafts one token every EXPLORE-th step
MATCH_CLASSES = (3, 5, 8)  # n-gram match lengths below 3, 3-4, 5-7, 8 and more learn apart
MODEL = "model"  # the source, and kind, of drafts from a draft model or head: sized by plan()


def draft_kind(draft: Draft) -> str:
    """What the acceptance is learned for: "model", or "ngram" with its match-length class."""
    if draft.source != "ngram":
        return draft.source
    bucket = sum(draft.match_len >= edge for edge in MATCH_CLASSES)
    return f"ngram/{bucket}"


def best_k(accept: list[float], ratio: float, per_token: float = 0.0, shape: Sequence[float] = ()) -> int:
    """The k (0 .. len(accept)) maximising E(k) / C(k); accept[j] is q_{j+1}.

    C(k) = c(k + 1) + per_token * k: the verify forward of the pending token and k drafted ones
    (c(n) = 1 + ratio * extra_rows(shape, n)) and, for a draft model, its k tokens.

    >>> best_k([0.5, 0.5, 0.5], ratio=0.2)
    1
    >>> best_k([0.9] * 10, ratio=0.2), best_k([0.9] * 10, ratio=0.0), best_k([0.1] * 4, ratio=0.2)
    (7, 10, 0)
    >>> best_k([0.5, 0.5, 0.5], ratio=0.2, shape=(0.0, 0.1, 0.2, 3.0))  # 2 and 3 rows cost about 1
    2
    """
    return best_plan(accept, ratio, per_token, shape)[0]


def best_plan(
    accept: list[float], ratio: float, per_token: float = 0.0, shape: Sequence[float] = ()
) -> tuple[int, float]:
    """best_k's k and its rate E(k) / C(k): tokens per step of cost (1.0 at k = 0).

    >>> best_plan([0.5, 0.5, 0.5], ratio=0.2)
    (1, 1.25)
    """
    ratio, per_token = max(ratio, 0.0), max(per_token, 0.0)
    best, best_rate = 0, 1.0
    expected, survive = 1.0, 1.0
    for k, q in enumerate(accept, start=1):
        survive *= q
        expected += survive
        rate = expected / (1.0 + ratio * extra_rows(shape, k + 1) + per_token * k)
        # free rows and drafts: any chance of one more token is worth drafting it
        if (ratio == 0.0 and per_token == 0.0) or rate > best_rate + 1e-12:
            best, best_rate = k, rate
    return best, best_rate


def extra_rows(shape: Sequence[float], rows: int) -> float:
    """x(rows): what a forward of `rows` rows costs over a 1-row one, in units of one more row's
    average cost; from the measured shape (x(1) .. x(len(shape))), past its end on at one a row, and
    without one a straight line.

    >>> extra_rows((), 5), extra_rows((0.0, 0.1, 0.2, 3.0), 3), extra_rows((0.0, 0.1, 0.2, 3.0), 6)
    (4, 0.2, 5.0)
    """
    if rows <= len(shape):
        return shape[rows - 1]
    if not shape:
        return rows - 1
    return shape[-1] + rows - len(shape)


@dataclass
class Acceptance:
    """Forgetting counts of accepted and rejected draft tokens at each depth, for one kind of draft."""

    accepted: list[float] = field(default_factory=list)
    rejected: list[float] = field(default_factory=list)

    def chances(self, depth: int) -> list[float]:
        """q_1 .. q_depth: the chance each depth is accepted after the ones before were.

        A depth with little evidence is taken to be about as likely as the one before it (its prior
        pseudo-counts have that mean): with a flat prior instead, a depth never drafted stayed at 0.5,
        which at a costly verify row kept every model draft at one token, so the second depth was
        never tried and never learned (a head accepted 68% of its first tokens here).
        """
        self._grow(depth)
        weight = PRIOR[0] + PRIOR[1]
        chances, mean = [], PRIOR[0] / weight
        for a, r in zip(self.accepted[:depth], self.rejected[:depth], strict=True):
            mean = (weight * mean + a) / (weight + a + r)
            chances.append(mean)
        return chances

    def observe(self, drafted: int, accepted: int) -> None:
        """A step drafted `drafted` tokens; the target kept the first `accepted` (a chain or a tree path)."""
        self._grow(drafted)
        for depth in range(len(self.accepted)):
            self.accepted[depth] *= FORGET
            self.rejected[depth] *= FORGET
        for depth in range(min(accepted, drafted)):
            self.accepted[depth] += 1.0
        if accepted < drafted:
            self.rejected[accepted] += 1.0  # deeper tokens were never tried

    def _grow(self, depth: int) -> None:
        while len(self.accepted) < depth:
            self.accepted.append(0.0)
            self.rejected.append(0.0)


@dataclass(frozen=True, slots=True)
class RowCost:
    """The cost of one more verify row, in 1-row steps, after `length` cached tokens, and the shape
    of a forward's cost in its rows.

    It grows with the context: each row's attention reads every cached key, while a 1-row step is
    mostly the weights' stream (embedded target, AMX, two threads, `python -m eval.bench_verify_rows`:
    0.016 at 16 tokens, 0.025 at 500, 0.037 at 2,000). Timed at two lengths, straight between them
    and beyond (never below 0); `long_len` 0: the same at every length. `shape`: x(1) .. x(R) (see
    extra_rows; empty: a straight line), timed at one length and taken to hold at every length.

    >>> RowCost(0.02, 0.04, 256, 2048).at(1152), RowCost(0.02).at(5000)
    (0.03, 0.02)
    """

    short: float
    long: float = 0.0
    short_len: int = 0
    long_len: int = 0
    shape: tuple[float, ...] = ()

    def at(self, length: int) -> float:
        if self.long_len <= self.short_len:
            return max(self.short, 0.0)
        # never falling with the context (a noisy pair of timings could say so; attention only grows)
        slope = max((self.long - self.short) / (self.long_len - self.short_len), 0.0)
        return max(self.short + slope * (length - self.short_len), 0.0)


@dataclass(frozen=True, slots=True)
class Prices:
    """What the budget prices now, in 1-row steps: one more verify row (its average over the rows a
    verify block may have) at a context length and a draft-model token, as timed at load (or given)
    and as corrected by the decode steps (the same where nothing is learned)."""

    row: float
    row_timed: float
    draft: float
    draft_timed: float


class DraftBudget:
    """Sizes each draft to what pays on this machine, and learns from what was accepted."""

    def __init__(
        self,
        row_cost: float | RowCost,
        draft_cost: float = 0.0,
        learn: bool = False,
        learn_draft: bool = False,
    ) -> None:
        """learn: correct row_cost by the decode steps' timings (observe_step; step_costs.py); where
        it was given, not timed, it is taken as it is. learn_draft: likewise draft_cost."""
        self.row_cost = row_cost if isinstance(row_cost, RowCost) else RowCost(row_cost)
        self.costs = StepCosts() if learn or learn_draft else None
        self.learn, self.learn_draft = learn, learn_draft
        self._load_ratio = self.row_cost.at(0)  # the load-time price of one more row at the step's context
        self.ratio = self._load_ratio  # the cost of one more row now, in 1-row steps (at_context)
        # the cost of drafting one token with the model, likewise: as timed at load (or given); the
        # price used is draft_price()
        self.draft_cost = max(draft_cost, 0.0)
        self._kinds: dict[str, Acceptance] = {}
        self._steps: dict[str, int] = {}
        self._model_plan = (0, 1.0)  # the last plan()'s k and rate (tokens per step of cost)

    def at_context(self, length: int) -> None:
        """Price the next steps' verify rows after `length` cached tokens (as timed at load, corrected
        by the decode steps where learning)."""
        self._load_ratio = self.row_cost.at(length)
        self.ratio = self._load_ratio * self._row_scale()

    def prices(self, length: int) -> Prices:
        """The prices after `length` cached tokens (for reports: pricing steps is at_context's)."""
        timed = self.row_cost.at(length)
        return Prices(timed * self._row_scale(), timed, self.draft_price(), self.draft_cost)

    def _row_scale(self) -> float:
        """What the decode steps say a load-priced row costs, over that price (1 where not learning)."""
        return self.costs.row_scale() if self.costs is not None and self.learn else 1.0

    def draft_price(self) -> float:
        """A draft-model token's cost in 1-row steps: draft_cost, corrected by the decode steps where
        learning."""
        if self.costs is not None and self.learn_draft:
            return self.costs.draft_cost(self.draft_cost)
        return self.draft_cost

    def observe_step(self, rows: int, seconds: float) -> None:
        """A decode step verified `rows` rows (1: a plain step) at the context priced by the last
        at_context, in `seconds` outside drafting."""
        if self.costs is not None:
            self.costs.observe_step(self._load_ratio * extra_rows(self.row_cost.shape, rows), seconds)

    def observe_drafting(self, seconds: float) -> None:
        """The draft model drafted, as the last plan() sized it, in `seconds` (what plan() prices at
        draft_price() a token: a chain the model cut short, a tree's levels and nodes, all in it)."""
        if self.costs is not None:
            self.costs.observe_drafting(self._model_plan[0], seconds)

    def rows_cost(self, rows: int) -> float:
        """c(rows): a verify forward of `rows` rows at the priced context, in 1-row steps."""
        return 1.0 + self.ratio * extra_rows(self.row_cost.shape, rows)

    def plan(self, most: int) -> int:
        """How many tokens (or tree nodes) the draft model should draft now, at most `most`."""
        draft_cost = self.draft_price()
        if most <= 0 or (self.ratio == 0.0 and draft_cost == 0.0):
            self._model_plan = (max(most, 0), 1.0)
            return max(most, 0)
        return self._size(MODEL, most, draft_cost)

    def extra_nodes(self, kept: int, chances: Sequence[float]) -> int:
        """How many of `chances` (best first) to verify beside the `kept` nodes of the last planned
        tree: the count that maximises the step's tokens per cost.

        A step planned by plan() yields E tokens for C steps of cost (its rate E / C). A node at a
        depth the draft model computed anyway costs no draft forward, only its verify row, and adds
        its chance p of being accepted: m more nodes give (E + p_1 + .. + p_m) / (C + c(kept + 1 + m)
        - c(kept + 1)). On a straight line that is each node whose p beats ratio * (the rate so far);
        on a staircase a node that starts a dearer step may pay only with the ones after it.
        Approximations: E counts the chances learned from earlier trees, their extra nodes' gains
        included, while C counts k rows; a step that explores (k forced from 0 to 1) keeps the rate
        of no draft, 1; and draft_cost is a head token over a 1-row step after PROBE_CONTEXT tokens,
        where ratio is over one after the step's own length (a longer step: draft_cost overstated).
        """
        k, rate = self._model_plan
        cost = self.rows_cost(k + 1) + self.draft_price() * k
        expected = rate * cost
        base = self.rows_cost(kept + 1)
        best, best_rate, gained = 0, rate, 0.0
        for m, p in enumerate(chances, start=1):
            gained += p
            now = (expected + gained) / (cost + self.rows_cost(kept + 1 + m) - base)
            if now > best_rate + 1e-12 or (self.ratio == 0.0 and p > 0.0):
                best, best_rate = m, max(now, best_rate)
        return best

    def trim(self, draft: Draft) -> Draft:
        """The draft cut to its best size: its first k tokens (a chain) or nodes (a tree).

        Model drafts pass unchanged: plan() sized them before they were made.
        """
        if not draft.tokens or self.ratio == 0.0 or draft.source == MODEL:
            return draft
        k = self._size(draft_kind(draft), len(draft.tokens), 0.0)
        if k >= len(draft.tokens):
            return draft
        if k == 0:  # nothing to verify: a plain step, not an empty tree
            return replace(draft, tokens=[], probs=None, parents=None, origins=None)
        parents = draft.parents[:k] if draft.parents is not None else None
        probs = draft.probs[:k] if draft.probs is not None else None
        origins = draft.origins[:k] if draft.origins is not None else None
        return replace(draft, tokens=draft.tokens[:k], probs=probs, parents=parents, origins=origins)

    def observe(self, draft: Draft, drafted: int, accepted: int) -> None:
        """The target kept `accepted` of the `drafted` tokens verified from `draft` (after trim)."""
        if drafted:
            self._kinds.setdefault(draft_kind(draft), Acceptance()).observe(drafted, accepted)

    def _size(self, kind: str, most: int, per_token: float) -> int:
        """The best k <= most for this kind, its tokens costing `per_token` each besides their verify
        rows; 1 on every EXPLORE-th step of a k of 0."""
        chances = self._kinds.setdefault(kind, Acceptance()).chances(most)
        k, rate = best_plan(chances, self.ratio, per_token, self.row_cost.shape)
        self._steps[kind] = self._steps.get(kind, 0) + 1
        if k == 0 and self._steps[kind] % EXPLORE == 0:
            k = 1
        if kind == MODEL:
            self._model_plan = (k, rate)
        return k


def best_time(run: Callable[[], None], trials: int = 3) -> float:
    """The best of `trials` timings of run(), after one untimed warm-up call."""
    run()
    timings = []
    for _ in range(trials):
        started = time.perf_counter()
        run()
        timings.append(time.perf_counter() - started)
    return min(timings)


def measure_row_cost(forward: Callable[[int], None], rows: int = 16, trials: int = 3) -> float:
    """The cost of one more row of a decode forward, in 1-row forwards: (t(rows) / t(1) - 1) / (rows - 1).

    forward(n) runs one forward of n rows; the best of `trials` timings of each counts, the two
    taking turns (see forward_times).
    """
    times = forward_times(forward, (1, rows), trials)
    return max(times[rows] / times[1] - 1.0, 0.0) / (rows - 1)


def forward_times(forward: Callable[[int], None], counts: Sequence[int], trials: int) -> dict[int, float]:
    """The best of `trials` timings of forward(n) for each n of counts, after one warm-up each. The
    counts take turns, so that a burst of other load on the host spoils a round, not one count's
    every timing (timed one count after the other, a short context's row once measured 0.32 of a
    step where it costs about 0.12)."""
    for n in counts:
        forward(n)
    times = dict.fromkeys(counts, float("inf"))
    for _ in range(trials):
        for n in counts:
            started = time.perf_counter()
            forward(n)
            times[n] = min(times[n], time.perf_counter() - started)
    return times


SHAPE_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 11, 16)  # row counts timed for a shape; straight between them


def measure_row_shape(
    forward: Callable[[int], None], rows: int = 16, trials: int = 4
) -> tuple[float, tuple[float, ...]]:
    """(ratio, (x(1), .. x(rows))): one more row's average cost over 1 to `rows` rows (as
    measure_row_cost) and the shape (extra_rows), from forwards of SHAPE_ROWS' counts below `rows`
    and of `rows` (forward_times).

    Between timed counts x runs straight; it never falls as rows are added (a timing's noise could
    say so). Where no row costs anything measurable: ratio 0 and no shape.
    """
    counts = sorted({n for n in SHAPE_ROWS if n < rows} | {1, rows})
    times = forward_times(forward, counts, trials)
    extra = {n: max(times[n] / times[1] - 1.0, 0.0) for n in counts}
    ratio = extra[rows] / (rows - 1) if rows > 1 else 0.0
    if ratio <= 0.0:
        return 0.0, ()
    shape, highest = [], 0.0
    for low, high in zip(counts, counts[1:], strict=False):
        for n in range(low, high):
            value = (extra[low] + (extra[high] - extra[low]) * (n - low) / (high - low)) / ratio
            highest = max(highest, value)
            shape.append(highest)
    shape.append(max(highest, extra[rows] / ratio))
    return ratio, tuple(shape)
