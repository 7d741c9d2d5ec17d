"""The draft budget: drafts cut to the size that pays, learned from what the target accepted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from completion_engine import draft_budget
from completion_engine.draft_budget import (
    EXPLORE,
    Acceptance,
    DraftBudget,
    RowCost,
    best_k,
    best_plan,
    draft_kind,
    extra_rows,
    measure_row_cost,
    measure_row_shape,
)
from completion_engine.types import Draft


def ngram(tokens: list[int], match_len: int = 4, parents: list[int] | None = None) -> Draft:
    return Draft(tokens=tokens, probs=None, source="ngram", match_len=match_len, parents=parents)


def test_free_rows_keep_every_token():
    assert best_k([0.05] * 12, ratio=0.0) == 12  # any chance of a token beats nothing when rows are free
    assert DraftBudget(0.0).trim(ngram(list(range(10)))).tokens == list(range(10))


def test_costly_rows_and_poor_acceptance_cut_to_nothing_but_explore():
    budget = DraftBudget(0.5)
    for _ in range(40):  # the target never takes this kind's first token
        budget.observe(ngram([1, 2, 3]), drafted=3, accepted=0)
    sizes = [len(budget.trim(ngram([1, 2, 3])).tokens) for _ in range(2 * EXPLORE)]
    assert sizes.count(1) == 2 and sizes.count(0) == 2 * EXPLORE - 2  # one token every EXPLORE-th step


def test_acceptance_is_learned_per_kind():
    budget = DraftBudget(0.2)
    long, short = ngram([1] * 10, match_len=8), ngram([1] * 10, match_len=2)
    for _ in range(60):
        budget.observe(long, drafted=10, accepted=10)
        budget.observe(short, drafted=10, accepted=0)
    assert draft_kind(long) != draft_kind(short)
    assert len(budget.trim(long).tokens) == 10
    assert len(budget.trim(short).tokens) <= 1


def test_acceptance_counts_depths_and_forgets():
    acceptance = Acceptance()
    acceptance.observe(drafted=4, accepted=2)  # depths 1, 2 accepted; 3 rejected; 4 never tried
    assert acceptance.accepted == [1.0, 1.0, 0.0, 0.0] and acceptance.rejected == [0.0, 0.0, 1.0, 0.0]
    # each depth's prior is the depth before's chance: 2/3, then (2 * 2/3 + 1) / 3, then (2 * 7/9) / 3, ...
    assert acceptance.chances(4) == pytest.approx([2 / 3, 7 / 9, 14 / 27, 14 / 27])
    acceptance.observe(drafted=1, accepted=1)
    assert acceptance.accepted[0] == 0.97 + 1.0 and acceptance.rejected[2] == 0.97


def test_a_depth_never_drafted_is_taken_to_be_as_likely_as_the_one_before():
    budget = DraftBudget(0.3, 0.04)  # a verify row and a head token: costly rows, as on a 2-core CPU
    draft = Draft(tokens=[1], probs=None, source="model")
    for step in range(100):  # one-token drafts, 80% accepted: depth 2 never tried
        budget.observe(draft, drafted=1, accepted=int(step % 10 < 8))
    assert budget.plan(10) >= 2  # worth trying a second token, which a flat 0.5 prior never found


def test_a_cut_tree_keeps_its_first_nodes():
    budget = DraftBudget(10.0)  # every extra row far too costly: k = 0 or the exploring 1
    for _ in range(EXPLORE - 1):
        budget.trim(ngram([5, 6, 7, 8], parents=[-1, 0, 1, 0]))
    tree = budget.trim(ngram([5, 6, 7, 8], parents=[-1, 0, 1, 0]))  # the exploring step
    assert tree.tokens == [5] and tree.parents == [-1]
    nothing = budget.trim(ngram([5, 6, 7, 8], parents=[-1, 0, 1, 0]))
    assert nothing.tokens == [] and nothing.parents is None  # a plain step, not an empty tree


def learned_model(budget: DraftBudget, accepted_share: float, steps: int = 200) -> DraftBudget:
    """A budget that saw model drafts of 10 tokens accepted at each depth with chance accepted_share."""
    draft = Draft(tokens=list(range(10)), probs=None, source="model")
    for step in range(steps):
        accepted = 0  # the same share at every depth, spread evenly over the steps (no randomness)
        while accepted < 10 and (step * 7 + accepted * 3) % 100 < accepted_share * 100:
            accepted += 1
        budget.observe(draft, drafted=10, accepted=accepted)
    return budget


def test_model_drafts_are_sized_before_drafting_with_their_cost():
    draft = Draft(tokens=[3, 4], probs=torch.rand(2, 7), source="model")
    assert DraftBudget(10.0, 1.0).trim(draft) is draft  # plan() sized it: it was paid for already
    assert DraftBudget(0.0, 0.0).plan(12) == 12  # free rows, free drafting: draft all that is allowed
    # the same acceptance pays for more tokens when drafting is cheap than when it costs half a step
    cheap = learned_model(DraftBudget(0.2, 0.0), accepted_share=0.8).plan(10)
    costly = learned_model(DraftBudget(0.2, 0.5), accepted_share=0.8).plan(10)
    assert cheap > costly >= 1
    # drafting that never pays drafts nothing, but one token every EXPLORE-th step
    hopeless = learned_model(DraftBudget(0.2, 0.5), accepted_share=0.0)
    sizes = [hopeless.plan(10) for _ in range(2 * EXPLORE)]
    assert sorted(set(sizes)) == [0, 1] and sizes.count(1) == 2
    assert DraftBudget(0.2, 0.5).plan(0) == 0


def test_a_tree_node_pays_when_its_chance_beats_its_rows_share_of_the_planned_rate():
    budget = learned_model(DraftBudget(0.1, 0.2), accepted_share=0.8)
    k = budget.plan(10)
    q = budget._kinds["model"].chances(10)
    best, rate = best_plan(q, 0.1, 0.2)
    assert k == best >= 1 and rate > 1.0
    # on a straight line a step of E tokens for C steps gains from a node of chance p at one more
    # row's cost iff p > ratio * E / C
    price = 0.1 * rate
    assert budget.extra_nodes(k, [price * 1.01]) == 1 and budget.extra_nodes(k, [price * 0.99]) == 0
    assert budget.extra_nodes(k, [0.9, 0.8, price * 0.99]) == 2  # the likely ones, not the last
    assert DraftBudget(0.0, 0.0).extra_nodes(3, [0.01, 0.001]) == 2  # free rows: every node pays
    hopeless = learned_model(DraftBudget(0.1, 0.2), accepted_share=0.0)
    assert hopeless.plan(10) == 0  # the rate of no draft, 1: a node pays from a chance of 0.1
    assert hopeless.extra_nodes(0, [0.11]) == 1 and hopeless.extra_nodes(0, [0.09]) == 0


def test_on_a_staircase_nodes_pay_together_where_one_alone_would_not():
    # a forward of 1 or 2 rows costs one step, 3 to 5 rows 1.6 (x: 0, 0, 3, 3, 3, then one a row)
    budget = DraftBudget(RowCost(0.2, shape=(0.0, 0.0, 3.0, 3.0, 3.0)), 0.0)
    budget._model_plan = (1, 1.5)  # one node planned: 1.5 tokens a step of cost 1
    assert budget.rows_cost(2) == 1.0 and budget.rows_cost(3) == pytest.approx(1.6)
    assert budget.extra_nodes(1, [0.5]) == 0  # 2.0 tokens for 1.6: worse than 1.5
    assert budget.extra_nodes(1, [0.5, 0.4, 0.4]) == 3  # 2.8 tokens for 1.6: better
    # a plan prices each step of the staircase: at a line of 0.2 a row k = 2 (1.96 tokens for 1.4);
    # on this shape the second row is free and the third dear: k = 1 (1.6 tokens for 1.0)
    q = [0.6, 0.6, 0.6, 0.6, 0.6]
    assert best_k(q, 0.2) == 2 and best_k(q, 0.2, shape=(0.0, 0.0, 3.0, 3.0, 3.0)) == 1
    assert best_k([0.9] * 4, 0.2, shape=(0.0, 0.0, 3.0, 3.0, 3.0)) == 4  # 4.1 tokens for 1.6, not 1.9 for 1


def test_extra_rows_follow_the_shape_then_one_a_row():
    assert [extra_rows((), n) for n in (1, 2, 5)] == [0, 1, 4]  # no shape: a straight line
    shape = (0.0, 0.2, 0.4, 3.0)
    assert [extra_rows(shape, n) for n in (1, 3, 4, 6)] == [0.0, 0.4, 3.0, 5.0]


def test_a_verify_row_is_priced_at_the_context_it_follows():
    cost = RowCost(short=0.02, long=0.04, short_len=256, long_len=2048)
    assert cost.at(256) == pytest.approx(0.02) and cost.at(2048) == pytest.approx(0.04)
    assert cost.at(4096) > 0.04 and RowCost(0.04, 0.03, 256, 2048).at(10_000) == 0.04  # never falling
    budget = DraftBudget(cost)
    budget.at_context(2048)
    long_context = budget.trim(ngram(list(range(10)), match_len=2))
    budget = DraftBudget(cost)
    budget.at_context(256)
    assert budget.ratio == pytest.approx(0.02)
    assert DraftBudget(0.03).ratio == 0.03  # a number: the same at every length
    # the same (prior: 0.5 a depth) acceptance pays for fewer rows where each costs more
    assert (len(budget.trim(ngram(list(range(10)), match_len=2)).tokens), len(long_context.tokens)) == (4, 3)


def test_row_cost_is_measured_from_forward_timings():
    calls = []
    assert measure_row_cost(calls.append, rows=4, trials=2) >= 0.0
    assert calls == [1, 4, 1, 4, 1, 4]  # a warm-up and two timed forwards each, taking turns


def test_a_row_shape_is_measured_between_timed_row_counts(monkeypatch):
    seconds = {1: 10.0, 2: 10.0, 3: 9.0, 4: 13.0, 5: 14.0, 6: 15.0, 7: 19.0, 8: 20.0, 11: 23.0, 16: 25.0}
    clock, timed = [0.0], []

    def forward(rows: int) -> None:  # a forward of `rows` rows takes seconds[rows] on a fake clock
        timed.append(rows)
        clock[0] += seconds[rows] * (2.0 if len(timed) == 12 else 1.0)  # one timing spoilt by other load

    monkeypatch.setattr(draft_budget, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    ratio, shape = measure_row_shape(forward, rows=16, trials=2)
    assert timed == list(seconds) * 3  # a warm-up each, then two rounds over the counts, taking turns
    assert ratio == pytest.approx(1.5 / 15)
    assert len(shape) == 16 and shape[0] == 0.0 and shape[-1] == pytest.approx(15.0)
    assert shape[1:3] == (0.0, 0.0)  # never falling: 3 rows timed faster than 1
    assert shape[3] == pytest.approx(3.0) and shape[7] == pytest.approx(10.0)  # 4 and 8 rows: 0.3, 1.0
    assert shape[8] == pytest.approx(11.0) and shape[11] == pytest.approx(13.4)  # straight between
    seconds = dict.fromkeys(seconds, 10.0)
    assert measure_row_shape(forward, rows=16) == (0.0, ())  # nothing measurable: no shape


def test_the_engine_times_a_verify_row_after_a_short_and_a_long_context(tiny_target):
    from completion_engine.config import EngineConfig
    from completion_engine.engine import PROBE_CONTEXT, PROBE_LONG, CompletionEngine

    engine = CompletionEngine(EngineConfig(target="t", max_draft=4, max_context=1000), tiny_target)
    cost = engine.budget.row_cost
    assert (cost.short_len, cost.long_len) == (PROBE_CONTEXT, 1000)
    assert cost.short >= 0.0 and cost.long >= 0.0 and len(engine.target_runner) == 0
    assert cost.shape == () or len(cost.shape) == 5  # 1 to max_draft + 1 rows, or nothing measurable
    near = CompletionEngine(EngineConfig(target="t", max_draft=4, max_context=600), tiny_target)
    assert near.budget.row_cost.long_len == 0  # timings 344 tokens apart: one price (noise, not slope)
    long = CompletionEngine(EngineConfig(target="t", max_draft=4, max_context=PROBE_LONG + 500), tiny_target)
    assert long.budget.row_cost.long_len == PROBE_LONG  # its prefill is paid at load: at most PROBE_LONG
    fixed = CompletionEngine(EngineConfig(target="t", max_draft=4, row_cost=0.05), tiny_target)
    assert fixed.budget.row_cost == RowCost(0.05)


def test_the_engine_prices_the_staircase_it_timed_after_the_long_context(tiny_target, monkeypatch):
    from completion_engine import engine as engine_module
    from completion_engine.config import EngineConfig
    from completion_engine.engine import CompletionEngine

    asked = []

    def staircase(forward, rows):  # what the engine asks for, and a fixed staircase for it
        forward(1)
        asked.append((rows, len(built.target_runner)))  # a probe leaves its context in the cache
        return 0.2, (0.0, 0.0, 3.0, 3.0, 3.0)

    monkeypatch.setattr(engine_module, "measure_row_shape", staircase)
    # the short context's timing is pinned too: a real one above 0.2 (a busy host) flattens the slope
    monkeypatch.setattr(engine_module, "measure_row_cost", lambda forward, rows: 0.1)
    built = CompletionEngine.__new__(CompletionEngine)
    CompletionEngine.__init__(built, EngineConfig(target="t", max_draft=4, max_context=1000), tiny_target)
    cost = built.budget.row_cost
    assert asked == [(5, 1000)]  # 1 to max_draft + 1 rows, after the long context
    assert (cost.short, cost.long, cost.shape) == (0.1, 0.2, (0.0, 0.0, 3.0, 3.0, 3.0))
    built.budget.at_context(1000)
    assert built.budget.rows_cost(2) == pytest.approx(1.0) and built.budget.rows_cost(3) == pytest.approx(1.6)


def test_rows_timed_free_where_fewer_rows_run_fewer_get_a_price_steps_correct(tiny_target, monkeypatch):
    """Disturbed timings can make a verify row look free; a price of 0 would stay 0 (the steps
    correct a price by a factor), so where forwards of fewer rows run fewer rows it is UNTIMED_ROW."""
    from completion_engine import engine as engine_module
    from completion_engine.config import EngineConfig
    from completion_engine.engine import PROBE_CONTEXT, UNTIMED_ROW, CompletionEngine
    from completion_engine.runner import DECODE_ROWS

    monkeypatch.setattr(engine_module, "measure_row_cost", lambda forward, rows: -0.02)
    monkeypatch.setattr(engine_module, "measure_row_shape", lambda forward, rows: (-0.01, ()))
    engine = CompletionEngine(EngineConfig(target="t", max_draft=4, max_context=1000), tiny_target)
    runner = engine.target_runner
    runner.decode_buckets = tuple(range(1, DECODE_ROWS + 1))  # a forward runs the rows it is given
    assert engine._time_row_cost(5) == RowCost(UNTIMED_ROW)
    learning = DraftBudget(RowCost(UNTIMED_ROW), learn=True)
    for _ in range(200):  # a 10 ms step, 8 ms more for 5 rows: a row costs 0.2 of a step
        learning.at_context(1000)
        learning.observe_step(1, 0.010)
        learning.observe_step(5, 0.018)
    learning.at_context(1000)
    assert 0.15 < learning.ratio <= 0.2  # from 0.05 most of the way (the prior holds a little back)
    runner.decode_buckets = (DECODE_ROWS,)  # every forward in full rows (AMX, a GPU): rows are free
    assert engine._time_row_cost(5) == RowCost(-0.02, -0.01, PROBE_CONTEXT, 1000, ())
    runner.decode_buckets = (8, DECODE_ROWS)  # 1 to 5 tokens all run 8 rows: free as well
    assert engine._time_row_cost(5).at(1000) == 0.0


def test_an_exploring_model_step_keeps_the_rate_of_no_draft():
    hopeless = learned_model(DraftBudget(0.1, 0.2), accepted_share=0.0)
    sizes = [hopeless.plan(10) for _ in range(EXPLORE)]
    assert sizes[-1] == 1 and hopeless._model_plan == (1, 1.0)  # the forced token, priced at rate 1


def test_learned_step_costs_reprice_rows_and_draft_tokens():
    """A budget that learns prices a row as the decode steps timed it; one that does not, as given."""
    shape = (0.0, 1.0, 2.0, 3.0, 4.0)
    learning = DraftBudget(RowCost(0.1, shape=shape), draft_cost=0.2, learn=True, learn_draft=True)
    given = DraftBudget(RowCost(0.1, shape=shape), draft_cost=0.2)
    learning, given = (learned_model(budget, accepted_share=0.9) for budget in (learning, given))
    for budget in (learning, given):
        for _ in range(100):
            for rows in (1, 3, 5):  # a 10 ms step, each row past the first 2 ms: 0.2 of a step, not 0.1
                budget.at_context(1000)
                budget.observe_step(rows, 0.010 + 0.002 * (rows - 1))
                assert budget.plan(1) == 1  # likely enough to pay at either price
                budget.observe_drafting(0.004)  # the token planned took 0.4 of a step, not 0.2
        budget.at_context(1000)
    assert learning.ratio == pytest.approx(0.2, rel=0.1)
    assert learning.rows_cost(5) == pytest.approx(1.8, rel=0.1)
    assert learning.draft_price() == pytest.approx(0.4, rel=0.1)
    assert given.ratio == 0.1 and given.draft_price() == 0.2
    assert learning.plan(10) <= given.plan(10)  # dearer rows and tokens: no bigger drafts


def test_the_engine_learns_only_the_prices_it_timed(tiny_target):
    from completion_engine.config import EngineConfig
    from completion_engine.engine import CompletionEngine

    timed = CompletionEngine(EngineConfig(target="t", max_draft=4), tiny_target)
    assert timed.budget.learn and timed.budget.learn_draft
    config = EngineConfig(target="t", max_draft=4, row_cost=0.05, draft_cost=0.1)
    given = CompletionEngine(config, tiny_target)
    assert not given.budget.learn and not given.budget.learn_draft
