"""The EAGLE draft head: lossless as a chain, a tree and in hybrid; the sampled path keeps the target's
distribution; the runner's features are the ones plain decoding computes; training and drafting agree."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from completion_engine.config import EngineConfig
from completion_engine.draft_budget import RowCost
from completion_engine.drafting.eagle import MANY_LEAVES, EagleDrafter, EagleHead, EagleWeights, TreeSettings
from completion_engine.eagle import (
    LAYER_FIELDS,
    EagleConfig,
    eagle_weights,
    is_eagle_head,
    load_eagle,
    save_eagle,
)
from completion_engine.engine import CompletionEngine
from completion_engine.kv import PANEL
from completion_engine.models import LoadedModel, ModelLoadError
from completion_engine.runner import DecoderRunner
from completion_engine.types import Request
from tests.conftest import tiny_loaded
from tests.unit.test_lossless import corrupted, engine_for, plain, random_prompts
from tests.unit.test_runner import CancelAfter
from tests.unit.test_sampling import next_token_probs, second_tokens, total_variation


@pytest.fixture(scope="module")
def one_layer_target(tiny_tokenizer) -> LoadedModel:
    return tiny_loaded(tiny_tokenizer, seed=5, layers=1)


def near_head(target: LoadedModel, subset: int = 480, window: int | None = None) -> EagleWeights:
    """A head that mostly agrees with a one-layer target: its layer is the target's, fed the next token.

    Head slot i computes layer(embed(x_{i+1})) (plus a trace of the feature f_i) at position i, where
    the target computes the same layer over x_0 .. x_{i+1}: the same but for the first key.
    """
    w = target.weights
    hidden = w.shape.hidden
    state = {
        "fc": torch.cat([torch.eye(hidden), 0.01 * torch.eye(hidden)], dim=1),
        "feature_norm": torch.ones(hidden),
        **{f"layer.{name}": getattr(w.layers[-1], name) for name in LAYER_FIELDS},
    }
    return eagle_weights(w, state, torch.arange(subset), window)


def eagle_engine(
    target: LoadedModel, k: int = 8, tree: bool = True, window: int | None = None
) -> CompletionEngine:
    # row_cost=draft_cost=0 (engine_for): drafts keep the size the head chose, the same on every machine
    return engine_for(target, near_head(target, window=window), k=k, eagle_tree=tree)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("k", [1, 4, 15])
@pytest.mark.parametrize("shape", ["tree", "chain"])
def test_eagle_greedy_equals_plain(one_layer_target, shape, k, window):
    engine = eagle_engine(one_layer_target, k=k, tree=shape == "tree", window=window)
    accepted = drafted = trees = 0
    for prompt in random_prompts(one_layer_target.vocab_size, 10, seed=k):
        expected = plain(engine, prompt, 40)
        generation = engine.complete(Request(context=prompt, max_new_tokens=40, draft="model"))
        assert generation.tokens == expected, f"eagle {shape} k={k} diverged on prompt {prompt}"
        accepted += generation.stats.accepted
        drafted += generation.stats.drafted
        trees += generation.stats.tree_steps
    assert 0 < accepted < drafted, "the cases should cover both acceptance and rejection"
    assert (trees > 0) == (shape == "tree" and k > 1)  # at k = 1 a tree would hold one node


@pytest.mark.parametrize("price", [0.0, 0.05])
def test_trees_with_nodes_past_the_planned_k_equal_plain(one_layer_target, price):
    engine = eagle_engine(one_layer_target, k=12)
    drafter = engine._model_drafter
    drafter.size = lambda most: max(1, most // 4)  # a few levels planned ...
    # ... and the likely nodes beside them
    drafter.extra_nodes = lambda kept, chances: sum(chance > price for chance in chances)
    sizes, trees = [], 0
    propose = drafter.propose

    def recorded(context, k, sampler=None):
        draft = propose(context, k, sampler)
        sizes.append((len(draft.tokens), max(1, k // 4)))
        return draft

    drafter.propose = recorded
    for prompt in random_prompts(one_layer_target.vocab_size, 8, seed=21):
        expected = plain(engine, prompt, 40)
        generation = engine.complete(Request(context=prompt, max_new_tokens=40, draft="model"))
        assert generation.tokens == expected, f"a tree with nodes past k diverged on prompt {prompt}"
        trees += generation.stats.tree_steps
    assert trees > 0 and any(nodes > k for nodes, k in sizes)


def test_each_step_prices_its_rows_at_its_own_context_length(one_layer_target):
    engine = eagle_engine(one_layer_target, k=4)
    engine.budget.row_cost = RowCost(0.01, 0.05, 0, 400)
    priced, proposed = [], []
    at_context, propose = engine.budget.at_context, engine._model_drafter.propose
    engine.budget.at_context = lambda length: priced.append(length) or at_context(length)

    def recorded(context, k, sampler=None):
        proposed.append(len(context) - 1)  # the cached tokens: all but the pending one
        return propose(context, k, sampler)

    engine._model_drafter.propose = recorded
    prompt = random_prompts(one_layer_target.vocab_size, 1, seed=22)[0]
    engine.complete(Request(context=prompt, max_new_tokens=20, draft="model"))
    # priced before each draft at its cached tokens (the last step, with no room left, drafts nothing)
    assert priced[: len(proposed)] == proposed and len(proposed) > 1 and len(priced) - len(proposed) <= 1
    assert engine.budget.ratio == pytest.approx(engine.budget.row_cost.at(priced[-1]))


def test_eagle_hybrid_equals_plain(one_layer_target):
    engine = eagle_engine(one_layer_target, k=10, tree=False)
    sources = Counter()
    for i, prompt in enumerate(random_prompts(one_layer_target.vocab_size, 10, seed=11)):
        expected = plain(engine, prompt, 40)
        engine.corpus.set_document("doc", prompt[-4:] + corrupted(expected, every=4 + i % 5))
        generation = engine.complete(Request(context=prompt, max_new_tokens=40, draft="hybrid"))
        assert generation.tokens == expected
        sources.update({name: s.drafted for name, s in generation.stats.by_source.items()})
    assert sources["ngram"] > 0 and sources["model"] > 0


def test_eagle_after_reused_prefixes_and_warmups_equals_plain(one_layer_target):
    """Requests that share prefixes (the head keeps its slots) and warm-ups in between."""
    engine = eagle_engine(one_layer_target, k=8, tree=False)
    base = random_prompts(one_layer_target.vocab_size, 1, seed=3)[0] * 3
    for cut in (len(base), len(base) - 5, len(base) + 0, len(base) - 1):
        prompt = base[:cut] + [7, 8]
        expected = plain(engine, prompt, 30)
        engine.warm(prompt)
        assert engine.complete(Request(context=prompt, max_new_tokens=30, draft="model")).tokens == expected


@pytest.mark.parametrize("method", ["model", "hybrid", "ngram", "none"])
def test_a_request_that_drafts_with_the_head_catches_it_up_before_its_first_draft(
    one_layer_target, method, monkeypatch
):
    """The head's pass over the prompt runs once the first token is out, as prefill (warm()), not
    inside the first draft; methods without the head leave it alone."""
    engine = eagle_engine(one_layer_target, k=8)
    prompt = random_prompts(one_layer_target.vocab_size, 1, seed=9)[0] * 4
    expected = plain(engine, prompt, 20)
    drafter = engine._model_drafter
    drafter.head.restart(0)  # cold: nothing of the prompt computed
    events: list[tuple] = []
    warm, propose = drafter.warm, drafter.propose
    monkeypatch.setattr(drafter, "warm", lambda *a: events.append(("warm", len(a[0]))) or warm(*a))
    monkeypatch.setattr(drafter, "propose", lambda *a: events.append(("propose",)) or propose(*a))
    generation = engine.stream(Request(context=prompt, max_new_tokens=20, draft=method))
    chunks = iter(generation)
    next(chunks)  # the first token: no draft, no catch-up yet
    assert events == [] and drafter.head.length == 0
    for _ in chunks:
        pass
    assert generation.tokens == expected
    stats = generation.stats
    if method in ("model", "hybrid"):
        assert events[0] == ("warm", len(prompt)) and ("propose",) in events[1:]
        assert stats.draft_prefill_s > 0 and stats.decode_s < stats.wall_s - stats.prefill_s
    else:
        assert events == [] and drafter.head.length == 0 and stats.draft_prefill_s == 0


def test_a_request_cancelled_after_its_first_token_skips_the_heads_catch_up(one_layer_target):
    engine = eagle_engine(one_layer_target, k=8)
    prompt = random_prompts(one_layer_target.vocab_size, 1, seed=9)[0] * 4
    engine._model_drafter.head.restart(0)
    cancel = threading.Event()
    generation = engine.stream(Request(context=prompt, max_new_tokens=20, draft="model"), cancel=cancel)
    chunks = iter(generation)
    next(chunks)
    cancel.set()
    assert list(chunks) == []
    assert generation.stats.stop_reason == "cancelled" and engine._model_drafter.head.length == 0


def test_a_warm_up_cancelled_while_the_head_catches_up_keeps_what_it_did(one_layer_target):
    from completion_engine.drafting.eagle import SYNC_ROWS

    engine = eagle_engine(one_layer_target, k=8, tree=False)
    prompt = (random_prompts(one_layer_target.vocab_size, 1, seed=5)[0] * 40)[: SYNC_ROWS + 100]
    engine.target_runner.prefill(prompt)
    drafter = engine._model_drafter
    drafter.warm(prompt, CancelAfter(checks=2))  # its first look, one block of the head, then cancelled
    assert drafter.head.length == SYNC_ROWS
    expected = plain(engine, prompt, 30)
    assert engine.complete(Request(context=prompt, max_new_tokens=30, draft="model")).tokens == expected


def test_features_after_a_tree_step_are_those_of_plain_decoding(one_layer_target):
    weights = one_layer_target.weights
    chain = DecoderRunner(weights, exact=True, capacity=512, keep_features=True)
    tree = DecoderRunner(weights, exact=True, capacity=512, keep_features=True)
    context = random_prompts(one_layer_target.vocab_size, 1, seed=4)[0]
    chain.prefill(context)
    tree.prefill(context)
    chain.extend([10, 11, 12])
    tree.verify_tree([10, 20, 11, 21, 12], [-1, 0, 0, 2, 2])  # root 10 -> {20, 11 -> {21, 12}}
    tree.accept_path([0, 2, 4])
    assert tree.token_ids == chain.token_ids
    n = len(chain)
    assert torch.equal(tree.features[:n], chain.features[:n])


def test_best_subtree_keeps_the_likely_nodes_within_the_leaf_budget(one_layer_target):
    engine = eagle_engine(one_layer_target)
    drafter = engine._model_drafter
    # (token, parent, log score, depth): a at -0.1, b under a at -0.2, c at -0.3, d at -0.4, e under b
    nodes = [(1, -1, -0.1, 1), (2, 0, -0.2, 2), (3, -1, -0.3, 1), (4, -1, -0.4, 1), (5, 1, -0.5, 3)]
    draft = drafter._best_subtree(nodes, k=4, max_leaves=2)
    assert (draft.tokens, draft.parents) == ([1, 3, 2, 5], [-1, -1, 0, 2])
    draft = drafter._best_subtree(nodes, k=3, max_leaves=1)
    assert (draft.tokens, draft.parents) == ([1, 2, 5], [-1, 0, 1])


def test_nodes_past_the_best_k_join_as_the_budget_says(one_layer_target):
    drafter = eagle_engine(one_layer_target)._model_drafter
    # (token, parent, log score, depth): chances 0.6, 0.3 (under the first), 0.2, 0.05
    nodes = [
        (1, -1, math.log(0.6), 1),
        (2, 0, math.log(0.3), 2),
        (3, -1, math.log(0.2), 1),
        (4, -1, math.log(0.05), 1),
    ]
    offered = []

    def above(price: float):
        def extra_nodes(kept: int, chances: list[float]) -> int:
            offered.append((kept, chances))
            return sum(chance > price for chance in chances)

        return extra_nodes

    draft = drafter._best_subtree(nodes, k=1, max_leaves=3, most=10, extra_nodes=above(0.1))
    assert (draft.tokens, draft.parents) == ([1, 3, 2], [-1, -1, 0])  # 0.05 does not pay
    assert offered[-1][0] == 1 and offered[-1][1] == pytest.approx([0.3, 0.2, 0.05])  # best first
    draft = drafter._best_subtree(nodes, k=1, max_leaves=3, most=2, extra_nodes=above(0.1))
    assert draft.tokens == [1, 2]  # no more than the step may verify
    draft = drafter._best_subtree(nodes, k=2, max_leaves=3, most=10, extra_nodes=above(1.0))
    assert draft.tokens == [1, 2]  # a price no chance beats: the k best only
    draft = drafter._best_subtree(nodes, k=2, max_leaves=3, most=10)
    assert draft.tokens == [1, 2]  # no budget for extras: the k best only
    draft = drafter._best_subtree(nodes, k=4, max_leaves=1, most=10, extra_nodes=above(0.0))
    assert draft.tokens == [1, 2]  # the leaf budget holds for every node


def test_a_one_level_tree_offers_the_heads_next_best_tokens_beside_its_best(one_layer_target):
    engine = eagle_engine(one_layer_target, k=15)
    drafter = engine._model_drafter
    drafter.size = lambda most: 1  # one level: no head forward past the catch-up
    drafter.extra_nodes = lambda kept, chances: len(chances)  # every node pays
    prompt = random_prompts(one_layer_target.vocab_size, 1, seed=11)[0]
    engine.target_runner.prefill(prompt)
    draft = drafter.propose([*prompt, 5], k=15)
    assert draft.parents == [-1] * drafter.tree.width  # the pending token's likeliest children


def test_tree_drafts_respect_the_settings(one_layer_target):
    engine = eagle_engine(one_layer_target, k=15)
    drafter = engine._model_drafter
    drafter.tree = TreeSettings(width=3, depth=4, max_leaves=2)
    prompt = random_prompts(one_layer_target.vocab_size, 1, seed=9)[0]
    engine.target_runner.prefill(prompt)
    draft = drafter.propose([*prompt, 5], k=15)
    parents = draft.parents
    assert 1 < len(draft.tokens) <= 15 and all(p < i for i, p in enumerate(parents))
    leaves = [i for i in range(len(parents)) if i not in parents]
    assert len(leaves) <= 2
    assert drafter.head.length == len(prompt)  # drafted slots are dropped again


def test_a_small_tree_budget_expands_no_deeper_than_it_can_keep(one_layer_target, monkeypatch):
    engine = eagle_engine(one_layer_target, k=15)
    drafter = engine._model_drafter
    drafter.tree = TreeSettings(width=3, depth=6, max_leaves=2)
    prompt = random_prompts(one_layer_target.vocab_size, 1, seed=10)[0]
    engine.target_runner.prefill(prompt)
    expansions = []
    expand = drafter._expand
    monkeypatch.setattr(drafter, "_expand", lambda *args: expansions.append(1) or expand(*args))
    draft = drafter.propose([*prompt, 5], k=2)  # 2 nodes: at most 2 levels, so one expansion
    assert len(draft.tokens) <= 2 and len(expansions) == 1


def test_head_needs_features_and_a_matching_context(one_layer_target):
    runner = DecoderRunner(one_layer_target.weights, exact=True, capacity=256)
    with pytest.raises(ValueError, match="keep_features"):
        EagleDrafter(runner, near_head(one_layer_target), 0.0, None)
    engine = eagle_engine(one_layer_target)
    engine.target_runner.prefill([5, 6, 7])
    assert engine._model_drafter.propose([5, 6], k=4).tokens == []  # not the runner's context + 1


def test_sampling_with_the_head_matches_the_target_distribution(one_layer_target):
    """The token after a verify step of the head's sampled chain follows the target's distribution."""
    engine = eagle_engine(one_layer_target, k=3)
    prompt, temperature = [5, 6, 7, 8, 5, 6, 7], 0.6
    t1 = int(next_token_probs(engine, prompt, temperature).argmax())
    second = next_token_probs(engine, [*prompt, t1], temperature)
    buckets = {(int(t),): float(second[t]) for t in torch.topk(second, 6).indices}
    buckets[("other",)] = 1.0 - sum(buckets.values())
    counts, accepted, drafted = second_tokens(engine, prompt, t1, buckets, "model", temperature, runs=1200)
    samples = sum(counts.values())
    assert samples > 150 and 0 < accepted < drafted
    assert total_variation(counts, buckets, samples) < 1.5 * (len(buckets) / samples) ** 0.5


def drafting_and_training_gap(target: LoadedModel, weights: EagleWeights) -> float:
    """Relative difference of the head's g over a prefilled context: training's module against drafting's."""
    from eval.train_eagle import TrainableHead

    trainable = TrainableHead(target.weights, weights.vocab_map, weights.feature_layers)
    with torch.no_grad():
        trainable.fc.copy_(weights.fc.float())
        trainable.feature_norm.copy_(weights.feature_norm.float())
        for name, param in trainable.layer.items():
            param.copy_(getattr(weights.layer, name).float())
    runner = DecoderRunner(
        target.weights, exact=True, capacity=256, keep_features=True, feature_layers=weights.feature_layers
    )
    context = random_prompts(target.vocab_size, 1, seed=6)[0]
    runner.prefill(context)
    features = runner.features[: len(context) - 1]
    with torch.no_grad():
        trained = trainable(features[None].float(), torch.tensor(context[1:])[None])[0]
        drafted = EagleHead(weights, 256).forward(features, context[1:], range(len(context) - 1))
    return float((trained - drafted.float()).norm() / trained.norm())


def test_drafting_computes_what_training_computes(one_layer_target):
    # the same maths; only the drafting side's bf16 rounding differs
    assert drafting_and_training_gap(one_layer_target, near_head(one_layer_target)) < 0.02


def test_saved_head_loads_and_is_checked(one_layer_target, tmp_path):
    weights = near_head(one_layer_target)
    config = EagleConfig(subset_size=480, target="tiny", hidden=weights.shape.hidden, window=512)
    save_eagle(tmp_path, weights, config)
    assert is_eagle_head(str(tmp_path)) and not is_eagle_head(str(tmp_path / "nothing"))
    loaded = load_eagle(one_layer_target.weights, tmp_path)
    assert torch.equal(loaded.fc, weights.fc) and torch.equal(loaded.vocab_map, weights.vocab_map)
    assert loaded.window == 512
    stored = load_file(str(tmp_path / "eagle.safetensors"))  # the head's parameters in bf16
    assert {t.dtype for name, t in stored.items() if name != "vocab_map"} == {torch.bfloat16}
    assert stored["vocab_map"].dtype == torch.long
    assert torch.equal(loaded.layer.qkv, weights.layer.qkv)
    with pytest.raises(ModelLoadError, match="not installed"):
        load_eagle(one_layer_target.weights, tmp_path / "missing")
    wide = tiny_loaded(one_layer_target.tokenizer, seed=5, layers=1, hidden=32)
    with pytest.raises(ModelLoadError, match="width"):
        load_eagle(wide.weights, tmp_path)


def test_training_can_continue_from_a_saved_head(one_layer_target, tmp_path):
    from eval.train_eagle import TrainableHead, load_head_state

    weights = near_head(one_layer_target)
    save_eagle(tmp_path, weights, EagleConfig(subset_size=480, target="tiny", hidden=weights.shape.hidden))
    target = one_layer_target.weights
    state, layers = load_head_state(tmp_path, target.shape.hidden)
    assert layers == ()
    trainable = TrainableHead(target, state["vocab_map"])
    trainable.start_from(state)
    exported, saved = trainable.export(target), load_eagle(target, tmp_path)
    assert torch.equal(exported.vocab_map, saved.vocab_map) and torch.equal(exported.fc, saved.fc)
    assert torch.equal(exported.feature_norm, saved.feature_norm)
    for name in ("input_norm", "qkv", "out", "post_norm", "gate_up", "down"):
        assert torch.equal(getattr(exported.layer, name), getattr(saved.layer, name)), name
    with pytest.raises(SystemExit, match="no EAGLE head"):
        load_head_state(tmp_path / "missing", target.shape.hidden)
    with pytest.raises(SystemExit, match="width"):
        load_head_state(tmp_path, target.shape.hidden + 1)


def test_the_heads_token_cost_is_timed_when_the_engine_loads(one_layer_target):
    config = EngineConfig(target="test", max_draft=4, kept_outputs=0, row_cost=0.0)
    engine = CompletionEngine(config, one_layer_target, near_head(one_layer_target))
    assert engine.budget.draft_cost > 0.0
    assert engine._model_drafter.head.length == 0 and engine._model_drafter.head.tokens == []
    prompt = random_prompts(one_layer_target.vocab_size, 1, seed=5)[0]
    expected = plain(engine, prompt, 12)
    assert engine.complete(Request(context=prompt, max_new_tokens=12, draft="model")).tokens == expected


def vars_of(linears) -> list:
    """The callables of a HeadLinears."""
    return [getattr(linears, field.name) for field in dataclasses.fields(linears)]


@pytest.fixture(scope="module")
def float32_target(tiny_tokenizer) -> LoadedModel:
    """A float32 target: its runners, and so the head's Linears, run on the row-invariant kernel."""
    return tiny_loaded(tiny_tokenizer, seed=5, layers=1, dtype=torch.float32)


def test_on_the_kernel_the_heads_linears_are_packed_and_compute_what_torch_does(float32_target):
    from completion_engine import row_invariant

    weights = near_head(float32_target)
    with row_invariant.numerics_mode("float32"):  # built as it runs below (AMX-ordered panels refuse it)
        packed = EagleHead(weights, 256)
        assert packed.keys.dtype == row_invariant.cache_dtype(True, weights.shape.head_dim) == torch.bfloat16
    assert all(isinstance(linear, row_invariant.PackedLinear) for linear in vars_of(packed.linears))
    # the Linears against torch's: a float32 cache, as torch's head keeps (the kernel reads either; a
    # bf16 cache's attention is test_row_invariant's)
    packed.keys, packed.values = packed.keys.float(), packed.values.float()

    def bf16(m: torch.Tensor) -> torch.Tensor:  # the panels hold the Linears' weights in bf16
        return m.bfloat16().float()

    w = weights.layer
    linears = ("qkv", "out", "gate_up", "down")
    layer = dataclasses.replace(w, **{name: bf16(getattr(w, name)) for name in linears})
    rounded = dataclasses.replace(weights, fc=bf16(weights.fc), head=bf16(weights.head), layer=layer)
    plain_torch = EagleHead(rounded, 256, packed=False)
    assert not any(isinstance(linear, row_invariant.PackedLinear) for linear in vars_of(plain_torch.linears))
    features = torch.randn(40, weights.shape.hidden, generator=torch.Generator().manual_seed(0))
    tokens = (random_prompts(float32_target.vocab_size, 1, seed=8)[0] * 4)[:40]
    # float32 inputs (the bf16 dot mode rounds them, which torch's path does not)
    with torch.inference_mode(), row_invariant.numerics_mode("float32"):
        for head in (packed, plain_torch):
            head.forward(features[:39], tokens[:39], range(39))  # a catch-up block, then one draft row
        rows = [head.forward(features[39:], tokens[39:], [39]) for head in (packed, plain_torch)]
        logits = [head.logits(row) for head, row in zip((packed, plain_torch), rows, strict=True)]
    torch.testing.assert_close(rows[0], rows[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_a_windowed_head_sees_only_its_window_in_blocks_and_row_by_row(float32_target):
    """A row at position p sees the slots from p - window + 1 on, rounded down to a panel (view_start)."""
    window, n = 40, 100
    weights = near_head(float32_target, window=window)
    hidden = weights.shape.hidden
    dtype = weights.embed.dtype
    features = torch.randn(n, hidden, generator=torch.Generator().manual_seed(1)).to(dtype)
    tokens = (random_prompts(float32_target.vocab_size, 1, seed=9)[0] * 30)[:n]
    other = features.clone()
    other[:PANEL] = torch.randn(PANEL, hidden, generator=torch.Generator().manual_seed(2)).to(dtype)

    def rows(head: EagleHead, feats: torch.Tensor, block: int) -> torch.Tensor:
        return torch.cat(
            [
                head.forward(feats[i : i + block], tokens[i : i + block], range(i, min(n, i + block)))
                for i in range(0, n, block)
            ]
        )

    with torch.inference_mode():
        blocks = rows(EagleHead(weights, 128), features, 15)
        singly = rows(EagleHead(weights, 128), features, 1)
        changed = rows(EagleHead(weights, 128), other, 15)
        unwindowed = rows(EagleHead(dataclasses.replace(weights, window=None), 128), other, 15)
    torch.testing.assert_close(blocks, singly, rtol=1e-4, atol=1e-4)
    # a row at 71 sees from round_down(71 - 39, 32) = 32: the changed first panel is out of its view
    # and of later rows'; the row at 70 sees from 0
    seen_from = PANEL + window - 1
    assert torch.equal(blocks[seen_from:], changed[seen_from:])
    assert not torch.equal(blocks[seen_from:], unwindowed[seen_from:])
    assert not torch.equal(blocks[seen_from - 1], changed[seen_from - 1])
    with pytest.raises(ValueError, match="catch-up block"):  # its last row's view starts past its first
        EagleHead(weights, 128).forward(features, tokens, range(n), last_only=True)


@pytest.mark.parametrize("window", [None, 40])
def test_a_head_tree_row_sees_the_context_and_its_own_path(float32_target, window):
    """A tree level's rows (tree=(root, parents)) get what a causal forward over their path gives,
    from the view of their position (tree_view), on the kernel and on torch's ops."""
    weights = near_head(float32_target, window=window)
    hidden = weights.shape.hidden
    context = 75  # with the window, the rows see from slot 32 on (tree_view(75, ...) = 32)
    features = torch.randn(context + 5, hidden, generator=torch.Generator().manual_seed(3))
    tokens = (random_prompts(float32_target.vocab_size, 1, seed=4)[0] * 20)[: context + 5]
    # slots 75, 76: roots; 77: child of 76; 78, 79: children of 77 and 75 (the rows asked)
    parents = [-1, -1, 1, 2, 0]
    paths = {3: [1, 2, 3], 4: [0, 4]}
    depth = {0: 1, 1: 1, 2: 2}

    def prefilled(packed: bool) -> EagleHead:
        head = EagleHead(weights, 128, packed=packed)
        head.forward(features[:context], tokens[:context], range(context))
        return head

    with torch.inference_mode():
        for packed in (True, False):
            head = prefilled(packed)
            assert head.tree_view(context, [context + 1, context + 2]) == (0 if window is None else 32)
            level = slice(context, context + 3)
            head.forward(
                features[level],
                tokens[level],
                [context + depth[j] - 1 for j in range(3)],
                tree=(context, parents[:3]),
            )
            asked = slice(context + 3, context + 5)
            rows = head.forward(
                features[asked], tokens[asked], [context + 2, context + 1], tree=(context, parents)
            )
            for row, node in enumerate((3, 4)):
                chain = prefilled(packed)
                slots = [context + j for j in paths[node]]
                expected = chain.forward(
                    features[slots], [tokens[s] for s in slots], range(context, context + len(slots))
                )[-1]
                if packed:  # the kernel's tree rows: the bits of a chain over the path
                    assert torch.equal(rows[row], expected)
                else:
                    torch.testing.assert_close(rows[row], expected, rtol=1e-4, atol=1e-4)
            with pytest.raises(ValueError, match="tree's nodes"):  # nodes that are not the slots from root
                head.forward(features[:1], tokens[:1], [context], tree=(context, [-1]))


@pytest.mark.parametrize("feature_window", [None, 8 + PANEL])
def test_a_windowed_heads_catch_up_skips_old_slots_and_predicts_what_computing_all_would(
    float32_target, feature_window
):
    window = 8
    weights = near_head(float32_target, window=window)
    runner = DecoderRunner(
        float32_target.weights, exact=True, capacity=256, keep_features=True, feature_window=feature_window
    )
    drafter = EagleDrafter(runner, weights, 0.0, None)
    base = random_prompts(float32_target.vocab_size, 1, seed=12)[0] * 8
    # long; shorter, sharing a prefix (slots never computed are needed; with a feature window the
    # target kept no features there, up to the last panel: no draft); longer again; a step on (the
    # cached slots are kept: the first computed slot stays). A computed slot's first is a panel's.
    third = base[:30] + [5] + base[40:70]
    firsts = (32, 0, 32, 32) if feature_window is None else (32, None, 32, 32)
    contexts = (base[:60], base[:30] + [5], third, third + base[70:73])
    for context, first in zip(contexts, firsts, strict=True):
        slots = len(context) - 1
        runner.prefill(context[:-1])
        with torch.inference_mode():
            predicted = drafter._sync(context, slots)
        if first is None:
            assert predicted is None  # (the head keeps its slots for a later catch-up)
            assert not bool(runner.features_valid[: slots - 1].all())
            continue
        with torch.inference_mode():
            # what computing every slot from the first gives
            reference = EagleHead(weights, 256)
            reference.restart(first)
            full = reference.forward(
                runner.features[first:slots], context[first + 1 : slots + 1], range(first, slots)
            )
        assert drafter.head.first == first  # the window's slots were computed, not those before
        assert bool(runner.features_valid[first:slots].all())  # from features the target computed
        torch.testing.assert_close(predicted, full[-1:], rtol=1e-5, atol=1e-5)


def test_a_feature_window_keeps_the_last_features_and_the_same_bits(float32_target):
    """A prefill with a feature window computes the last layer only for its last positions."""
    weights = float32_target.weights
    rows = DecoderRunner(weights, exact=True, capacity=64).prefill_rows  # a prefill forward's
    n = 2 * rows + 44  # three blocks
    whole = DecoderRunner(weights, exact=True, capacity=n + 64, keep_features=True)
    windowed = DecoderRunner(weights, exact=True, capacity=n + 64, keep_features=True, feature_window=40)
    prompt = random_prompts(float32_target.vocab_size, 1, seed=13)[0]
    context = (prompt * (n // len(prompt) + 1))[:n]
    logits = [runner.prefill(context)[0] for runner in (whole, windowed)]
    assert torch.equal(logits[0], logits[1])
    assert windowed.features_valid[:n].tolist() == [False] * (n - 40) + [True] * 40
    assert torch.equal(windowed.features[n - 40 : n], whole.features[n - 40 : n])
    steps = [runner.extend([3, 4, 5], all_logits=True) for runner in (whole, windowed)]
    assert torch.equal(steps[0], steps[1]) and bool(windowed.features_valid[n : n + 3].all())
    assert torch.equal(windowed.features[n : n + 3], whole.features[n : n + 3])
    shorter = [runner.prefill(context[:200] + [7])[0] for runner in (whole, windowed)]  # reuses 200
    assert torch.equal(shorter[0], shorter[1])
    assert windowed.features_valid[:201].tolist() == [False] * 200 + [True]  # 161..199 were never kept
    # a prefill cancelled in its second block (the cache keeps the first), then steps: every step's
    # features are kept again
    windowed.truncate(0)
    assert windowed.prefill(context, CancelAfter(checks=1))[0] is None
    assert len(windowed) == rows
    windowed.extend([3, 4, 5])
    assert bool(windowed.features_valid[rows : rows + 3].all())


def test_a_windowed_head_after_reused_prefixes_and_warmups_on_the_kernel_equals_plain(float32_target):
    """The runner keeps features for a window only: shorter contexts, warm-ups and restarts."""
    engine = eagle_engine(float32_target, k=6, tree=False, window=6)
    base = random_prompts(float32_target.vocab_size, 1, seed=3)[0] * 6
    drafted = 0
    for cut in (len(base), len(base) - 20, len(base) - 19, len(base) + 0, 12):
        prompt = base[:cut] + [7, 8]
        expected = plain(engine, prompt, 30)
        engine.warm(prompt)
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft="model"))
        assert generation.tokens == expected
        drafted += generation.stats.drafted
    assert drafted > 0


@pytest.mark.parametrize("kernel", [False, True])
def test_the_drafters_head_is_packed_exactly_where_the_targets_runner_is(float32_target, kernel):
    from completion_engine import row_invariant

    runner = DecoderRunner(
        float32_target.weights, exact=True, capacity=256, keep_features=True, row_invariant_kernel=kernel
    )
    drafter = EagleDrafter(runner, near_head(float32_target), 0.0, None)
    packed = [isinstance(linear, row_invariant.PackedLinear) for linear in vars_of(drafter.head.linears)]
    assert packed == [kernel] * len(packed)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("tree", [False, True])
def test_eagle_on_the_kernel_equals_plain(float32_target, tree, window):
    from completion_engine.row_invariant import PackedLinear

    engine = eagle_engine(float32_target, k=6, tree=tree, window=window)
    assert engine.target_runner.feature_window == (None if window is None else window + PANEL)
    assert all(isinstance(linear, PackedLinear) for linear in vars_of(engine._model_drafter.head.linears))
    accepted = drafted = 0
    for prompt in random_prompts(float32_target.vocab_size, 6, seed=12):
        expected = plain(engine, prompt, 30)
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft="model"))
        assert generation.tokens == expected, f"eagle (tree={tree}) diverged on prompt {prompt}"
        accepted += generation.stats.accepted
        drafted += generation.stats.drafted
    assert 0 < accepted < drafted, "the cases should cover both acceptance and rejection"


def test_eagle_tree_option_reaches_the_config_and_needs_a_head(one_layer_target):
    import argparse

    from completion_engine.defaults import EAGLE_NAME
    from completion_engine.options import add_engine_arguments, eagle_tree_problem, engine_config

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config(parser.parse_args(["--eagle-tree"])).eagle_tree is True
    assert engine_config(parser.parse_args([])).eagle_tree is None  # trees wherever a head drafts
    assert engine_config(parser.parse_args(["--no-eagle-tree"])).eagle_tree is False
    # the command lines refuse it before loading anything
    head = parser.parse_args(["--eagle-tree", "--draft-model", EAGLE_NAME])
    assert eagle_tree_problem(head) is None and eagle_tree_problem(parser.parse_args([])) is None
    assert "needs an EAGLE draft head" in eagle_tree_problem(parser.parse_args(["--eagle-tree"]))
    inexact = parser.parse_args(["--eagle-tree", "--draft-model", EAGLE_NAME, "--inexact"])
    assert "exact verifier" in eagle_tree_problem(inexact)
    with pytest.raises(ValueError, match="needs an EAGLE draft head"):
        CompletionEngine(EngineConfig(target="test", eagle_tree=True), one_layer_target)  # no draft at all
    with pytest.raises(ValueError, match="needs an EAGLE draft head"):
        engine_for(one_layer_target, one_layer_target, eagle_tree=True)  # a draft model, not a head


def test_training_labels_are_the_targets_choice_and_its_top_tokens_on_the_subset(one_layer_target):
    from eval.train_eagle import (
        IGNORE,
        TOP,
        EagleSettings,
        TrainableHead,
        head_loss,
        subset_targets,
        target_pass,
    )

    target = one_layer_target.weights
    windows = torch.randint(
        2, one_layer_target.vocab_size, (3, 24), generator=torch.Generator().manual_seed(8)
    )
    data = target_pass(target, windows, desc="test")
    assert data.top_ids.shape == (3, 24, TOP)
    # the choice is a most probable token (argmax and topk may break a tie differently)
    is_choice = data.top_ids.long() == data.choices[..., None]
    assert bool(is_choice.any(-1).all())
    assert torch.equal(data.top_logprobs[is_choice], data.top_logprobs[..., 0].flatten())
    assert bool((data.top_logprobs <= 0).all()) and bool((data.top_logprobs.diff(dim=-1) <= 0).all())
    # a subset that holds every other token the target ranks first or second somewhere
    firsts = torch.unique(data.top_ids[..., :2])
    vocab_map = firsts[::2].long()
    labels = subset_targets(data, vocab_map, one_layer_target.vocab_size)
    inside = torch.isin(data.choices, vocab_map)
    assert torch.equal(labels.choice == IGNORE, ~inside)
    assert torch.equal(vocab_map[labels.choice[inside]], data.choices[inside])
    kept = labels.top_probs > 0
    assert torch.equal(vocab_map[labels.top_rows[kept]], data.top_ids[kept].long())
    assert bool(torch.isin(data.top_ids[~kept].long(), vocab_map).logical_not().all())
    sums = labels.top_probs.sum(-1)
    some = kept.any(-1)
    assert torch.allclose(sums[some], torch.ones(int(some.sum()))) and bool((sums[~some] == 0).all())
    head = TrainableHead(target, vocab_map)
    loss, agreement = head_loss(head, data, torch.arange(3), labels, EagleSettings())
    loss.backward()
    assert torch.isfinite(loss) and 0.0 <= agreement <= 1.0 and head.fc.grad is not None


def test_ttt_mask_lets_a_chain_token_see_the_true_prefix_then_its_chain():
    from eval.train_eagle import ttt_mask

    assert torch.equal(ttt_mask(4, 1), torch.ones(4, 4).tril().bool())  # depth 1: causal over f
    mask = ttt_mask(5, 3)  # keys: depth 1's 0..4, depth 2's 0..4, depth 3's 0..4
    assert mask[4].nonzero().flatten().tolist() == [0, 1, 2, 5 + 3, 10 + 4]  # p = 2, then slots 3, 4
    assert mask[2].nonzero().flatten().tolist() == [0, 5 + 1, 10 + 2]  # p = 0
    assert int(mask.sum(1).min()) >= 1  # no row without a key (rows t < 2 are not trained)


@pytest.mark.parametrize("p", [0, 3, 9])
def test_unrolled_depths_are_the_chain_drafting_computes(one_layer_target, p):
    # depth j at position p + j - 1 = the j-th token of a chain drafted after position p: the head's
    # layer over the target's features up to p, then its own guesses
    from eval.train_eagle import TrainableHead

    target = one_layer_target.weights
    head = TrainableHead(target, torch.arange(480))
    torch.manual_seed(3)
    with torch.no_grad():
        head.fc.add_(0.05 * torch.randn_like(head.fc))
    ids = torch.tensor(random_prompts(one_layer_target.vocab_size, 1, seed=9)[0][:16])[None]
    runner = DecoderRunner(target, exact=True, capacity=64, keep_features=True)
    runner.prefill(ids[0].tolist())
    features = runner.features[: ids.shape[1] - 1][None].float()
    next_ids = ids[:, 1:]
    with torch.no_grad():
        unrolled = head.unrolled(features, next_ids, 3)
        chain = features[:, : p + 1]
        for j in range(1, 4):
            g = head(chain, next_ids[:, : p + j])[:, -1]
            gap = (unrolled[j - 1][:, p + j - 1] - g).norm() / g.norm()  # float32 sums in other orders
            assert gap < 1e-5, (j, float(gap))
            chain = torch.cat([chain, g[:, None]], dim=1)


def test_training_text_comes_from_the_train_roots_or_else_the_stdlib_without_the_evaluations(tmp_path):
    import argparse

    from eval.train_draft import add_train_arguments, training_files

    stdlib, other = tmp_path / "lib", tmp_path / "other"
    for path in ("os.py", "email/parser.py", "http/client.py", "json/decoder.py", "asyncio/tasks.py"):
        (stdlib / path).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / path).write_text("x = 1\n")
    for path in ("pkg/mod.py", "test/test_mod.py"):
        (other / path).parent.mkdir(parents=True, exist_ok=True)
        (other / path).write_text("y = 2\n")
    (other / "README").write_text("not code\n")
    (other / "empty").mkdir()
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)

    def names(*argv: str) -> list[str]:
        args = parser.parse_args(["--stdlib", str(stdlib), *argv])
        return [str(p.relative_to(tmp_path)) for p in training_files(args)]

    assert names() == [
        "lib/asyncio/tasks.py",
        "lib/os.py",
    ]  # the evaluation's and held-out packages are not read
    # another tree is read whole (its own test/ too), each file once however the roots overlap
    assert names("--train-root", str(other), "--train-root", str(other / "pkg")) == [
        "other/pkg/mod.py",
        "other/test/test_mod.py",
    ]
    # a root above the standard library still never trains on the held-out package
    assert "lib/http/client.py" not in names("--train-root", str(tmp_path))
    assert "lib/os.py" in names("--train-root", str(tmp_path))
    with pytest.raises(SystemExit, match="is not a folder"):
        names("--train-root", str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="no Python files"):
        names("--train-root", str(other / "empty"))


def test_an_eagle_head_drafts_trees_by_default_where_the_verifier_is_exact(one_layer_target):
    head = near_head(one_layer_target)
    assert engine_for(one_layer_target, head)._model_drafter.tree is not None  # eagle_tree None
    assert engine_for(one_layer_target, head, eagle_tree=False)._model_drafter.tree is None


@pytest.mark.parametrize("seed", [13, 14, 15])
def test_each_expanded_node_gets_the_heads_top_tokens_after_its_own_path(float32_target, seed):
    # the tree's content, not only its losslessness: an expanded node's children are the head's
    # `width` likeliest tokens after the node's path, drafted one token at a time as a chain (on the
    # kernel a tree row gets its path's bits); a row mixed up between parents changes them
    engine = eagle_engine(float32_target, k=15)
    drafter = engine._model_drafter
    drafter.tree = TreeSettings(width=2, depth=3, max_leaves=MANY_LEAVES)
    drafter.size = lambda most: most  # every drafted node kept: 2 + 4 + 4 of 15
    prompt = random_prompts(float32_target.vocab_size, 1, seed=seed)[0]
    runner = engine.target_runner
    runner.prefill(prompt)
    context, committed = [*prompt, 5], len(prompt)
    draft = drafter.propose(context, k=15)
    assert len(draft.tokens) == 10

    def top_after(path: list[int]) -> set[int]:
        predicted = drafter._sync(context, committed)
        for depth, token in enumerate(path):
            predicted = drafter.head.forward(predicted, [token], [committed + depth])
        rows = drafter.head.logits(predicted)[0].topk(2).indices.tolist()
        drafter.head.truncate(committed)
        return {drafter._token_of[row] for row in rows}

    paths = {-1: []}
    for node, (token, parent) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
        paths[node] = [*paths[parent], token]
    parents_with_children = set(draft.parents)
    assert len(parents_with_children) == 5  # the pending token, then 2 nodes a level for 2 levels
    for parent in parents_with_children:
        children = {t for t, p in zip(draft.tokens, draft.parents, strict=True) if p == parent}
        assert children == top_after(paths[parent]), f"node {parent} (path {paths[parent]})"
