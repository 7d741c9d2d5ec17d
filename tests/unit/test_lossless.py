"""Speculative greedy output equals plain greedy output, token for token, for every drafter."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

import pytest

from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine
from completion_engine.models import LoadedModel
from completion_engine.types import ORIGINS, Draft, Request
from tests.conftest import numerics_or_skip

PROMPTS = 10


def random_prompts(vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        body = [rng.randrange(2, vocab) for _ in range(rng.randrange(3, 40))]
        # repeat a slice so n-gram drafting has something to find
        if len(body) > 8:
            start = rng.randrange(0, len(body) - 6)
            body += body[start : start + rng.randrange(3, 7)] + body[: rng.randrange(2, 10)]
        prompts.append(body)
    return prompts


def corrupted(tokens: list[int], every: int) -> list[int]:
    """A copy with every `every`-th token changed: n-gram drafts from it are partly right."""
    return [(t + 1) % 500 if i % every == every - 1 else t for i, t in enumerate(tokens)]


def engine_for(
    target: LoadedModel,
    draft: LoadedModel | None = None,
    k: int = 8,
    exact: bool = True,
    row_cost: float = 0.0,
    draft_cost: float = 0.0,
    **settings,
):
    # kept_outputs=0: the plain run's output must not become a perfect draft for the run it is compared with;
    # row_cost=draft_cost=0: drafts keep the size the drafter chose (test_drafts_cut_by_the_budget_equal_plain
    # cuts them)
    config = EngineConfig(
        target="test",
        max_draft=k,
        exact=exact,
        ngram_min=2,
        ngram_max=6,
        draft_min_prob=0.0,
        kept_outputs=0,
        row_cost=row_cost,
        draft_cost=draft_cost,
        **settings,
    )
    return CompletionEngine(config, target, draft)


def plain(engine: CompletionEngine, prompt: list[int], max_new: int) -> list[int]:
    return engine.complete(Request(context=prompt, max_new_tokens=max_new, draft="none")).tokens


@pytest.fixture(params=["bf16", "fp32", "bf16-dot", "bf16-amx"])
def models(request) -> Iterator[tuple[LoadedModel, LoadedModel]]:
    """(target, a near draft) in bf16 (torch's kernels), in float32 (row_invariant's kernel on AVX2),
    and a bf16 checkpoint in float32 in the kernel's bf16 dot mode (bf16 inputs), multiplied with
    vdpbf16ps (AVX512-BF16) and on AMX tiles (AMX-BF16)."""
    if request.param.startswith("bf16-"):
        numerics = {"bf16-dot": "bf16dot", "bf16-amx": "amx"}[request.param]
        with numerics_or_skip(numerics):
            yield (
                request.getfixturevalue("tiny_target_fp32_bf16_valued"),
                request.getfixturevalue("tiny_near_draft_fp32"),
            )
        return
    suffix = "" if request.param == "bf16" else "_fp32"
    yield (
        request.getfixturevalue("tiny_target" + suffix),
        request.getfixturevalue("tiny_near_draft" + suffix),
    )


@pytest.mark.parametrize("k", [1, 4, 15])
@pytest.mark.parametrize("method", ["ngram", "ngram-chain", "model", "hybrid"])
def test_speculative_greedy_equals_plain(models, method, k):
    target, draft = models
    engine = engine_for(target, draft, k=k)
    accepted_any = rejected_any = False
    for i, prompt in enumerate(random_prompts(target.vocab_size, PROMPTS, seed=k)):
        expected = plain(engine, prompt, 40)
        engine.corpus.set_document("doc", prompt[-4:] + corrupted(expected, every=4 + i % 5))
        generation = engine.complete(Request(context=prompt, max_new_tokens=40, draft=method))
        assert generation.tokens == expected, f"{method} k={k} diverged on prompt {prompt}"
        accepted_any |= generation.stats.accepted > 0
        rejected_any |= generation.stats.accepted < generation.stats.drafted
    assert accepted_any and rejected_any, "the cases should cover both acceptance and rejection"


def test_ngram_with_documents_equals_plain(tiny_target):
    engine = engine_for(tiny_target, k=10)
    prompts = random_prompts(tiny_target.vocab_size, PROMPTS, seed=7)
    for i, prompt in enumerate(prompts):
        expected = plain(engine, prompt, 30)
        # an open document holding the target's own continuation: drafts are accepted in full
        engine.corpus.set_document(f"doc{i}", prompt[-6:] + expected)
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft="ngram"))
        assert generation.tokens == expected
        assert generation.stats.accepted >= 10


def test_identical_draft_is_fully_accepted(tiny_target_fp32):
    # fp32: on the row-invariant kernel the draft runs the target's very path (elsewhere unpadded fast
    # mode, and in bf16 that alone flips near-tied argmaxes)
    engine = engine_for(tiny_target_fp32, tiny_target_fp32, k=6)
    for prompt in random_prompts(tiny_target_fp32.vocab_size, 4, seed=3):
        expected = plain(engine, prompt, 30)
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft="model"))
        assert generation.tokens == expected
        assert generation.stats.accepted == generation.stats.drafted > 0


def test_a_stop_inside_an_accepted_draft_keeps_what_plain_decoding_keeps(tiny_target_fp32):
    """A stop check or stop string that fires inside a chunk of accepted tokens: the same text, tokens
    and reason as plain decoding, which checks after every token (none past the stop are kept)."""
    engine = engine_for(tiny_target_fp32, tiny_target_fp32, k=6)

    def at_length(chars: int):  # fires on every text from `chars` characters on
        return lambda text: chars if len(text) >= chars else None

    def ending_with(marker: str):  # fires on a text that ends so, not once it goes on
        return lambda text: len(text) if text.endswith(marker) else None

    cut_inside = 0
    for prompt in random_prompts(tiny_target_fp32.vocab_size, 4, seed=21):
        free_tokens = plain(engine, prompt, 30)
        free = engine.decode(free_tokens)
        requests = [
            (Request(context=prompt, max_new_tokens=30), at_length(chars))
            for chars in (len(free) // 3, len(free) // 2)
        ]
        marker = engine.decode(free_tokens[:17])[-3:]  # ends at a token boundary: plain decoding stops
        requests.append((Request(context=prompt, max_new_tokens=30), ending_with(marker)))
        requests.append(
            (Request(context=prompt, max_new_tokens=30, stop=(free[len(free) // 2 :][:3],)), None)
        )
        for request, check in requests:
            expected = engine.complete(replace(request, draft="none"), stop_check=check)
            generation = engine.complete(replace(request, draft="model"), stop_check=check)
            assert (generation.tokens, generation.text) == (expected.tokens, expected.text)
            assert generation.stats.stop_reason == expected.stats.stop_reason in ("stop", "syntax")
            stats = generation.stats
            produced = 1 + sum((accepted + 1) * steps for accepted, steps in stats.accepted_hist.items())
            cut_inside += produced > len(generation.tokens)  # the stop fell inside a step's tokens
    assert cut_inside


class WrongDrafter:
    """Always proposes tokens the target does not choose: every draft is rejected at once."""

    def __init__(self, engine: CompletionEngine) -> None:
        self.engine = engine

    def propose(self, context, k, sampler=None) -> Draft:
        expected_next = plain(self.engine, list(context), 1)[0]
        return Draft(tokens=[(expected_next + 1) % 500] * k, probs=None, source="ngram")


def test_full_rejection_equals_plain(tiny_target, monkeypatch):
    engine = engine_for(tiny_target, k=5)
    prompt = random_prompts(tiny_target.vocab_size, 1, seed=11)[0]
    expected = plain(engine, prompt, 20)
    checker = engine_for(tiny_target)
    monkeypatch.setattr(engine, "drafter_for", lambda method: WrongDrafter(checker))
    generation = engine.complete(Request(context=prompt, max_new_tokens=20, draft="ngram"))
    assert generation.tokens == expected
    assert generation.stats.accepted == 0 and generation.stats.drafted > 0


@pytest.mark.parametrize("max_new", [1, 2, 7, 13])
def test_max_new_tokens_inside_a_draft(tiny_target, max_new):
    engine = engine_for(tiny_target, tiny_target, k=10)
    prompt = random_prompts(tiny_target.vocab_size, 1, seed=5)[0]
    expected = plain(engine, prompt, max_new)
    assert len(expected) == max_new
    generation = engine.complete(Request(context=prompt, max_new_tokens=max_new, draft="model"))
    assert generation.tokens == expected
    assert generation.stats.stop_reason == "length"


def test_eos_inside_a_draft(tiny_target):
    prompt = random_prompts(tiny_target.vocab_size, 1, seed=9)[0]
    free_run = plain(engine_for(tiny_target), prompt, 20)
    eos = free_run[6]  # pretend the 7th generated token is end-of-sequence
    target = LoadedModel(tiny_target.name, tiny_target.weights, tiny_target.tokenizer, frozenset({eos}))
    engine = engine_for(target, target, k=10)
    expected = plain(engine, prompt, 20)
    assert expected == free_run[: free_run.index(eos)]
    generation = engine.complete(Request(context=prompt, max_new_tokens=20, draft="model"))
    assert generation.tokens == expected
    assert generation.stats.stop_reason == "eos"


def test_prefix_reuse_gives_the_same_output(tiny_target):
    engine = engine_for(tiny_target, k=8)
    prompts = random_prompts(tiny_target.vocab_size, 4, seed=21)
    cold = [
        engine_for(tiny_target).complete(Request(context=p, max_new_tokens=25, draft="ngram")).tokens
        for p in prompts
    ]
    base = prompts[0]
    for prompt, expected in zip(prompts, cold, strict=True):
        engine.complete(
            Request(context=base + prompt[:3], max_new_tokens=10)
        )  # leave a shared prefix in the cache
        warm = engine.complete(Request(context=prompt, max_new_tokens=25, draft="ngram"))
        assert warm.tokens == expected


def test_fp32_is_lossless_too(tiny_target_fp32, tiny_tokenizer):
    engine = engine_for(tiny_target_fp32, k=8)
    for prompt in random_prompts(tiny_target_fp32.vocab_size, 5, seed=13):
        expected = plain(engine, prompt, 30)
        assert engine.complete(Request(context=prompt, max_new_tokens=30, draft="ngram")).tokens == expected


def long_prompts(vocab: int, count: int, seed: int) -> list[list[int]]:
    """Prompts of 130-420 tokens: whole prefill blocks plus a decode-bucket tail, with repeats to match."""
    rng = random.Random(seed)
    prompts = []
    for body in random_prompts(vocab, count, seed):
        while len(body) < rng.randrange(130, 420):
            body = body + body[rng.randrange(len(body)) :] + [rng.randrange(2, vocab)]
        prompts.append(body[:420])
    return prompts


@pytest.mark.parametrize("method", ["ngram", "model", "hybrid"])
def test_long_contexts_through_the_prefill_bucket_equal_plain(models, method):
    target, draft = models
    engine = engine_for(target, draft, k=10)
    for prompt in long_prompts(target.vocab_size, 6, seed=31):
        expected = plain(engine, prompt, 30)
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft=method))
        assert generation.tokens == expected, f"{method} diverged on a {len(prompt)}-token prompt"


def test_typing_session_warm_requests_equal_a_cold_engine(models):
    """Edits at the end, accepted completions and block crossings: each warm answer equals a cold one."""
    target, _ = models
    warm = engine_for(target, k=8)
    rng = random.Random(41)
    context = long_prompts(target.vocab_size, 1, seed=41)[0][:200]
    reused = 0
    for step in range(12):
        generation = warm.complete(Request(context=context, max_new_tokens=12, draft="ngram"))
        cold = engine_for(target, k=8).complete(Request(context=context, max_new_tokens=12, draft="none"))
        assert generation.tokens == cold.tokens, f"step {step}: warm diverged from a cold run"
        reused += len(context) - generation.stats.prefill_tokens
        action = step % 3
        if action == 0:  # accept the completion: it becomes context
            context = context + generation.tokens
        elif action == 1:  # type a token
            context = context + [rng.randrange(2, target.vocab_size)]
        else:  # delete back a few tokens and type something else
            context = context[:-3] + [rng.randrange(2, target.vocab_size)]
    assert reused > 0, "the KV prefix should be reused across the session"


def test_warm_up_then_request_equals_a_cold_request(models):
    target, draft = models
    for i, prompt in enumerate(long_prompts(target.vocab_size, 4, seed=51)):
        method = ("ngram", "hybrid")[i % 2]
        cold = engine_for(target, draft, k=8)
        expected = cold.complete(Request(context=prompt, max_new_tokens=20, draft=method)).tokens
        warm = engine_for(target, draft, k=8)
        assert warm.warm(prompt) == len(prompt)
        generation = warm.complete(Request(context=prompt, max_new_tokens=20, draft=method))
        assert generation.tokens == expected
        assert generation.stats.prefill_tokens == 0  # the warm-up left nothing to compute


def test_token_trees_from_disagreeing_documents_equal_plain(models):
    """Open documents that continue the tail differently: the n-gram drafter verifies trees."""
    target, _ = models
    engine = engine_for(target, k=12)
    trees = accepted = 0
    for i, prompt in enumerate(random_prompts(target.vocab_size, PROMPTS, seed=61)):
        expected = plain(engine, prompt, 30)
        for doc in range(4):  # the right continuation, corrupted differently in each document
            engine.corpus.set_document(f"doc{doc}", prompt[-5:] + corrupted(expected, every=2 + doc + i % 3))
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft="ngram"))
        assert generation.tokens == expected, f"tree drafting diverged on prompt {i}"
        trees += generation.stats.tree_steps
        accepted += generation.stats.accepted
    assert trees > 0 and accepted > 0, "the cases should verify trees and accept from them"


def test_eos_inside_a_tree_branch(tiny_tokenizer):
    from tests.conftest import tiny_loaded

    target = tiny_loaded(tiny_tokenizer, seed=1)
    free = engine_for(target, k=12)
    prompt = random_prompts(target.vocab_size, 1, seed=71)[0]
    expected = plain(free, prompt, 20)
    eos = expected[6]
    stopping = LoadedModel(target.name, target.weights, target.tokenizer, frozenset([eos]))
    engine = engine_for(stopping, k=12)
    for doc in range(3):
        engine.corpus.set_document(f"doc{doc}", prompt[-5:] + corrupted(expected, every=3 + doc))
    generation = engine.complete(Request(context=prompt, max_new_tokens=20, draft="ngram"))
    assert generation.tokens == expected[:6] and generation.stats.stop_reason == "eos"


def test_an_all_rejected_tree_still_equals_plain(models):
    target, _ = models
    engine = engine_for(target, k=12)
    for prompt in random_prompts(target.vocab_size, 4, seed=81):
        expected = plain(engine, prompt, 15)
        for doc in range(3):  # continuations that never agree with the target
            engine.corpus.set_document(f"doc{doc}", prompt[-5:] + [(t + 7 + doc) % 500 for t in expected])
        generation = engine.complete(Request(context=prompt, max_new_tokens=15, draft="ngram"))
        assert generation.tokens == expected


def test_an_earlier_output_drafts_the_same_completion_again(tiny_target):
    config = EngineConfig(target="test", max_draft=12, kept_outputs=4, row_cost=0.0)
    engine = CompletionEngine(config, tiny_target)
    prompt = random_prompts(tiny_target.vocab_size, 1, seed=91)[0]
    first = engine.complete(Request(context=prompt, max_new_tokens=30, draft="ngram"))
    again = engine.complete(Request(context=prompt, max_new_tokens=30, draft="ngram"))
    assert again.tokens == first.tokens
    assert again.stats.accepted >= 20 and again.stats.target_forwards < first.stats.target_forwards
    assert again.stats.by_origin["outputs"].accepted >= 20  # credited to the earlier completion


def origin_totals(stats) -> tuple[int, int]:
    return sum(s.drafted for s in stats.by_origin.values()), sum(s.accepted for s in stats.by_origin.values())


@pytest.mark.parametrize("method", ["ngram", "ngram-chain", "hybrid"])
def test_every_drafted_token_is_counted_by_its_origin(models, method):
    """by_origin splits by_source's tokens: an open document's text is "documents", the model's "model"."""
    target, draft = models
    engine = engine_for(target, draft, k=8)
    seen: set[str] = set()
    for prompt in random_prompts(target.vocab_size, 4, seed=17):
        expected = plain(engine, prompt, 24)
        engine.corpus.set_document("doc", prompt[-4:] + corrupted(expected, every=5))
        generation = engine.complete(Request(context=prompt, max_new_tokens=24, draft=method))
        assert generation.tokens == expected
        stats = generation.stats
        assert origin_totals(stats) == (stats.drafted, stats.accepted)
        assert set(stats.by_origin) <= set(ORIGINS)
        assert all(s.accepted <= s.drafted and s.steps > 0 for s in stats.by_origin.values())
        seen |= {name for name, s in stats.by_origin.items() if s.accepted}
    assert "documents" in seen
    assert ("model" in seen) == (method == "hybrid")


@pytest.mark.parametrize("method", ["ngram", "ngram-chain", "hybrid", "model"])
def test_drafts_cut_by_the_budget_equal_plain(models, method):
    """Where an extra verify row (or a draft token) costs a lot, drafts are cut to the size that pays."""
    target, draft = models
    engine = engine_for(target, draft, k=12, row_cost=0.5, draft_cost=0.5)
    full = engine_for(target, draft, k=12)
    cut_drafted = full_drafted = 0
    for i, prompt in enumerate(random_prompts(target.vocab_size, PROMPTS, seed=101)):
        expected = plain(engine, prompt, 30)
        for each in (engine, full):
            each.corpus.set_document("doc", prompt[-4:] + corrupted(expected, every=3 + i % 4))
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft=method))
        assert generation.tokens == expected, f"{method} with cut drafts diverged on prompt {i}"
        cut_drafted += generation.stats.drafted
        full_drafted += full.complete(Request(context=prompt, max_new_tokens=30, draft=method)).stats.drafted
    assert cut_drafted < full_drafted, "the budget should have cut some drafts"


@pytest.mark.parametrize("method", ["ngram", "hybrid"])
def test_prices_learned_while_decoding_keep_the_output(models, method):
    """Prices timed at load and corrected by each step's own timing (step_costs.py) resize drafts
    from step to step on real, varying timings: the output is still plain decoding's."""
    target, draft = models
    config = EngineConfig(
        target="test",
        max_draft=12,
        ngram_min=2,
        ngram_max=6,
        draft_min_prob=0.0,
        kept_outputs=0,
        max_context=512,
    )
    engine = CompletionEngine(config, target, draft)
    assert engine.budget.learn and engine.budget.learn_draft
    rows: list[int] = []
    prices: set[float] = set()  # the row price over the load's, after each step
    observe = engine.budget.observe_step

    priced = False  # whether any step's rows had a price beyond a 1-row step's

    def observe_step(n: int, seconds: float) -> None:
        nonlocal priced
        rows.append(n)
        priced = priced or engine.budget.rows_cost(n) > 1.0  # its rows cost more than a 1-row step
        observe(n, seconds)
        prices.add(engine.budget.costs.row_scale())

    engine.budget.observe_step = observe_step
    for i, prompt in enumerate(random_prompts(target.vocab_size, PROMPTS, seed=131)):
        expected = plain(engine, prompt, 30)
        engine.corpus.set_document("doc", prompt[-4:] + corrupted(expected, every=3 + i % 4))
        rows.clear()
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft=method))
        assert generation.tokens == expected, f"{method} with learned prices diverged on prompt {i}"
        assert sum(n - 1 for n in rows) == generation.stats.drafted  # each step timed with its rows
    assert engine.budget.costs.fit()[0] > 0.0  # the steps' seconds reached the fit
    # and moved the price the drafts were sized at, unless the load found these steps' rows free at
    # these short contexts (a price of 0 stays 0: such a step's load-priced extra cost is 0, and says
    # nothing of rows)
    assert len(prices) > 1 or not priced


def test_the_draft_models_token_cost_is_timed_when_the_engine_loads(models):
    """No --draft-cost: one draft token is timed against a target step, and prices model drafts."""
    target, draft = models
    config = EngineConfig(target="test", max_draft=6, kept_outputs=0, row_cost=0.0)
    engine = CompletionEngine(config, target, draft)
    assert engine.budget.draft_cost > 0.0
    assert len(engine.target_runner) == 0 and len(engine._model_drafter.runner) == 0  # no cache left behind
    prompt = random_prompts(target.vocab_size, 1, seed=7)[0]
    expected = plain(engine, prompt, 20)
    assert engine.complete(Request(context=prompt, max_new_tokens=20, draft="hybrid")).tokens == expected


def test_a_draft_model_sees_a_window_of_the_context_that_moves_in_jumps(tiny_target):
    from completion_engine.drafting.model import ModelDrafter
    from completion_engine.runner import DecoderRunner

    runner = DecoderRunner(tiny_target.weights, exact=False, capacity=256)
    drafter = ModelDrafter(runner, min_prob=0.0, window=16)
    context = random_prompts(tiny_target.vocab_size, 1, seed=41)[0] * 3
    assert len(context) > 40
    drafter.propose(context[:10], 1)
    assert runner.token_ids == context[:10]  # shorter than the window: all of it
    drafter.propose(context[:30], 1)
    assert runner.token_ids == context[22:30]  # past the window: its last half window
    forwards = runner.forwards
    for end in range(31, 39):  # each step extends the cached view: one forward a step, no re-prefill
        drafter.propose(context[:end], 1)
        assert runner.token_ids == context[22:end]
    assert runner.forwards == forwards + 8
    drafter.propose(context[:39], 1)  # 17 tokens would not fit: the window jumps
    assert runner.token_ids == context[31:39]
    drafter.propose(context[:33], 1)  # inside the old start's window, but under half a window of it
    assert runner.token_ids == context[25:33]
    drafter.propose(context[:12], 1)  # a shorter request: all of it again
    assert runner.token_ids == context[:12]


def test_hybrid_keeps_its_short_match_when_model_drafting_does_not_pay(tiny_target):
    from completion_engine.drafting.hybrid import HybridDrafter
    from completion_engine.drafting.model import ModelDrafter
    from completion_engine.drafting.ngram import NgramDrafter
    from completion_engine.runner import DecoderRunner

    context = [5, 6, 7, 8, 9, 5, 6]  # "5 6" matched: a 2-token match, shorter than min_match 3
    ngram = NgramDrafter(None, 2, 4)
    short = ngram.propose(context, 3)
    assert short.tokens and short.match_len == 2
    runner = DecoderRunner(tiny_target.weights, exact=False, capacity=64)
    declined = HybridDrafter(ngram, ModelDrafter(runner, 0.0, size=lambda most: 0), min_match=3)
    assert declined.propose(context, 3).tokens == short.tokens and len(runner) == 0  # the model never ran
    willing = HybridDrafter(ngram, ModelDrafter(runner, 0.0, size=lambda most: 2), min_match=3)
    assert willing.propose(context, 3).source == "model" and len(willing.propose(context, 3).tokens) <= 2
