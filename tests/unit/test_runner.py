"""The shape-bucketed runner: correct against transformers, bit-identical however rows are batched."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from completion_engine import row_invariant
from completion_engine.kv import KVCache, common_prefix_len
from completion_engine.models import LoadedModel
from completion_engine.runner import (
    ANY_ROWS,
    DECODE_ROWS,
    PREFILL_ROWS,
    DecoderRunner,
    full_decode_rows_only,
    prefill_boundary,
    reusable_prefix,
)
from completion_engine.tiny import build_model
from completion_engine.weights import decoder_weights_from_hf
from tests.conftest import numerics_or_skip


def tokens(count: int, vocab: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(count)]


# Each exactness test runs on every way the runner multiplies: torch's kernels in bf16 and in float32
# (MKL on a CPU, with probed row buckets), and row_invariant's float32 kernel (no padding at all), on
# bf16 panels with float32 inputs and in the bf16 dot mode (bf16 inputs) with vdpbf16ps (AVX512-BF16)
# and on AMX tiles (AMX-BF16). The third entry: the kernel's numerics (None: the process's own).
PRECISIONS = {
    "bf16": ("tiny_target", {}, None),
    "fp32-row-invariant": ("tiny_target_fp32", {"row_invariant_kernel": True}, None),
    "fp32-row-invariant-bf16-panels": (
        "tiny_target_fp32_bf16_valued",
        {"row_invariant_kernel": True},
        "float32",
    ),
    "fp32-row-invariant-bf16-dot": (
        "tiny_target_fp32_bf16_valued",
        {"row_invariant_kernel": True},
        "bf16dot",
    ),
    "fp32-row-invariant-bf16-amx": ("tiny_target_fp32_bf16_valued", {"row_invariant_kernel": True}, "amx"),
    "fp32-torch": ("tiny_target_fp32", {"row_invariant_kernel": False}, None),
}


@dataclass
class RunnerFactory:
    model: LoadedModel
    options: dict

    @property
    def vocab(self) -> int:
        return self.model.vocab_size

    def __call__(self, capacity: int = 1024, **extra) -> DecoderRunner:
        return DecoderRunner(self.model.weights, exact=True, capacity=capacity, **self.options, **extra)


@pytest.fixture(params=list(PRECISIONS))
def make_runner(request) -> Iterator[RunnerFactory]:
    yield from runner_factory(request)


def runner_factory(request) -> Iterator[RunnerFactory]:
    """The factory for the precision named by request.param, in its numerics while the test runs."""
    fixture, options, numerics = PRECISIONS[request.param]
    factory = RunnerFactory(request.getfixturevalue(fixture), options)
    with numerics_or_skip(numerics):  # None: the process's own
        yield factory


@pytest.mark.parametrize("exact", [True, False])
def test_logits_match_transformers_in_fp32(exact):
    model = build_model(vocab_size=300, seed=0)
    ids = tokens(150, 300)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0]
    runner = DecoderRunner(
        decoder_weights_from_hf(model, torch.float32, torch.device("cpu")), exact, capacity=512
    )
    got = runner.extend(ids, all_logits=True)
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()


@pytest.mark.parametrize("prefix_len", [5, 100, 120, 250])  # 120 + 16 crosses the 128-key bucket boundary
def test_verify_block_equals_decode_steps_bit_for_bit(make_runner, prefix_len):
    runner = make_runner()
    ids = tokens(prefix_len + 16, make_runner.vocab, seed=prefix_len)
    runner.extend(ids[:prefix_len])
    block = runner.extend(ids[prefix_len:], all_logits=True)  # one forward of 16 rows
    runner.truncate(prefix_len)
    steps = torch.cat([runner.extend([t], all_logits=True) for t in ids[prefix_len:]])  # 16 forwards of 1 row
    assert torch.equal(block, steps)


def test_probed_decode_buckets_give_the_bits_of_full_decode_forwards(make_runner):
    """Whatever smaller decode forwards the probe admits on this machine, each row keeps its bits:
    steps of 1 token, blocks of 3, 5 and 11 (4-, 8- and 16-row forwards where admitted) against a
    runner that only ever runs DECODE_ROWS-row forwards."""
    probed = make_runner()
    full = make_runner(decode_buckets=(DECODE_ROWS,))
    assert probed.decode_buckets[-1] == DECODE_ROWS and full.decode_buckets == (DECODE_ROWS,)
    ids = tokens(150, make_runner.vocab, seed=7)
    for runner in (probed, full):
        runner.prefill(ids[:120])
    for size in (1, 3, 5, 11, 1):
        block = ids[len(probed) : len(probed) + size]
        assert torch.equal(probed.extend(block, all_logits=True), full.extend(block, all_logits=True))
    tree = [-1, 0, 1, 0, 3]  # a 5-node tree: an 8-row forward where admitted
    nodes = ids[len(probed) : len(probed) + 5]
    assert torch.equal(probed.verify_tree(nodes, tree), full.verify_tree(nodes, tree))


@pytest.mark.parametrize("native", ["avx512_bf16", "amx_bf16"])
def test_where_the_cpu_multiplies_bf16_every_decode_forward_is_full(tiny_target, monkeypatch, native):
    """oneDNN's native bf16 GEMMs round 1-8 and 16 rows differently on rare inputs (a Zen 4 here):
    no probe of a few tokens can admit smaller forwards there."""
    monkeypatch.setattr(row_invariant, "cpu_flags", lambda: frozenset({"avx2", native}))
    assert DecoderRunner(tiny_target.weights, exact=True, capacity=256).decode_buckets == (DECODE_ROWS,)


def test_off_the_cpu_every_decode_forward_is_full():
    """cuBLAS's GEMMs for fewer rows passed the probe on an H200 and still left a 16-row block's bits
    on real tokens (runner._probe_decode_buckets): no probe admits smaller forwards off the CPU."""
    for device in ("cuda", "mps"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert full_decode_rows_only(torch.device(device), dtype)
    assert not full_decode_rows_only(torch.device("cpu"), torch.float32)


def test_decode_buckets_must_include_the_full_decode_forward(tiny_target):
    with pytest.raises(ValueError, match="must end with DECODE_ROWS"):
        DecoderRunner(tiny_target.weights, exact=True, capacity=256, decode_buckets=(4, 8))


def test_prefill_chunking_does_not_change_bits(make_runner):
    ids = tokens(300, make_runner.vocab, seed=1)
    whole = make_runner().extend(ids)
    pieces = make_runner()
    for start in range(0, 300, 37):
        last = pieces.extend(ids[start : start + 37])
    assert torch.equal(whole, last)


def test_kv_rollback_gives_the_logits_of_a_fresh_prefill(make_runner):
    ids = tokens(80, make_runner.vocab, seed=2)
    runner = make_runner()
    runner.extend(ids[:50])
    runner.extend(tokens(12, make_runner.vocab, seed=3), all_logits=True)  # a draft that gets rejected
    runner.truncate(50)
    runner.extend(tokens(7, make_runner.vocab, seed=4))  # and another
    runner.truncate(50)
    after_rollback = runner.extend(ids[50:], all_logits=True)
    fresh = make_runner()
    fresh.extend(ids[:50])
    assert torch.equal(after_rollback, fresh.extend(ids[50:], all_logits=True))
    assert runner.token_ids == ids


def test_capacity_is_enforced(tiny_target):
    runner = DecoderRunner(tiny_target.weights, exact=True, capacity=128)
    with pytest.raises(ValueError, match="exceeds capacity"):
        runner.extend(tokens(runner.capacity + 1, tiny_target.vocab_size))


# -- the prefill bucket: context blocks in PREFILL_ROWS forwards, the tail and generation in DECODE_ROWS


def test_cold_prefill_schedule_and_last_logits(make_runner):
    ids = tokens(300, make_runner.vocab, seed=5)
    runner = make_runner()
    logits, computed = runner.prefill(ids)
    assert computed == 300
    boundary = prefill_boundary(300)
    if runner.any_schedule:  # on the kernel no schedule: blocks of prefill_rows, the rest in one forward
        assert runner.cache.row_buckets == [ANY_ROWS] * 300 and runner.forwards == -(
            -300 // runner.prefill_rows
        )
    else:
        assert runner.cache.row_buckets == [PREFILL_ROWS] * boundary + [DECODE_ROWS] * (300 - boundary)
    # the same positions computed by decode forwards only give other bits, but the same shape of answer
    assert logits.shape == (1, make_runner.vocab)


@pytest.mark.parametrize(
    "edit",
    [
        "append one token",  # typing at the end: the tail is decode-bucket, reused as is
        "change the last token",
        "change a token inside the prefill blocks",  # reuse stops mid-block: a part-filled prefill forward
        "grow across a block boundary",  # decode-bucket positions become prefill positions
        "accept generated tokens into the context",
        "shrink",
    ],
)
def test_warm_prefill_gives_the_bits_of_a_cold_one(make_runner, edit):
    vocab = make_runner.vocab
    first = tokens(250, vocab, seed=6)
    generated = tokens(40, vocab, seed=7)
    second = {
        "append one token": first + [3],
        "change the last token": first[:-1] + [(first[-1] + 1) % vocab],
        "change a token inside the prefill blocks": first[:100] + [(first[100] + 1) % vocab] + first[101:],
        "grow across a block boundary": first + tokens(30, vocab, seed=8),
        "accept generated tokens into the context": first + generated,
        "shrink": first[:140],
    }[edit]
    warm = make_runner()
    warm.prefill(first)
    warm.extend(generated[:1])
    warm.extend(generated[1:12], all_logits=True)  # a verify block
    warm_logits, computed = warm.prefill(second)
    cold = make_runner()
    cold_logits, _ = cold.prefill(second)
    assert torch.equal(warm_logits, cold_logits)
    assert warm.cache.row_buckets == cold.cache.row_buckets
    assert computed < len(second) or edit == "change a token inside the prefill blocks"
    follow = tokens(16, vocab, seed=9)
    assert torch.equal(warm.extend(follow, all_logits=True), cold.extend(follow, all_logits=True))


KERNEL_PRECISIONS = [
    name for name, (_, options, _) in PRECISIONS.items() if options.get("row_invariant_kernel")
]


@pytest.fixture(params=KERNEL_PRECISIONS)
def make_kernel_runner(request) -> Iterator[RunnerFactory]:
    yield from runner_factory(request)


def test_on_the_kernel_any_schedule_gives_the_bits_of_a_cold_prefill(make_kernel_runner):
    """No row buckets on the kernel: steps, verify blocks of any size and prefills all agree."""
    vocab = make_kernel_runner.vocab
    ids = tokens(300, vocab, seed=21)
    follow = tokens(5, vocab, seed=22)
    cold = make_kernel_runner()
    cold_logits, _ = cold.prefill(ids)
    expected = cold.extend(follow, all_logits=True)
    rng = random.Random(23)
    mixed = make_kernel_runner()
    mixed.prefill(ids[:70])
    position = 70
    while position < len(ids):  # verify blocks of 1 to DECODE_ROWS tokens, as drafts leave them
        size = min(rng.randint(1, DECODE_ROWS), len(ids) - position)
        logits = mixed.extend(ids[position : position + size], all_logits=True)
        position += size
    assert mixed.forwards > 20 and torch.equal(logits[-1:], cold_logits)
    assert torch.equal(mixed.extend(follow, all_logits=True), expected)


def test_on_the_kernel_generated_tokens_that_become_context_are_kept(make_kernel_runner):
    vocab = make_kernel_runner.vocab
    context, generated = tokens(250, vocab, seed=24), tokens(40, vocab, seed=25)
    warm = make_kernel_runner()
    warm.prefill(context)
    for begin in range(0, 40, 8):  # decoded in verify blocks
        warm.extend(generated[begin : begin + 8], all_logits=True)
    logits, computed = warm.prefill(context + generated + [7])  # the completion accepted, one more key
    assert computed == 1
    assert torch.equal(logits, make_kernel_runner().prefill(context + generated + [7])[0])


def test_on_the_kernel_a_prefill_skips_the_last_layer_rows_nobody_reads(make_kernel_runner):
    """Without features, a prefill block computes the last layer's keys and values only (its last
    block, one row more): the same logits and cache as a runner that computes every row."""
    ids = tokens(300, make_kernel_runner.vocab, seed=26)
    lean, full = make_kernel_runner(), make_kernel_runner(keep_features=True)
    assert torch.equal(lean.prefill(ids)[0], full.prefill(ids)[0])
    assert torch.equal(lean.extend(ids[:3]), full.extend(ids[:3]))  # a step's last row, on those keys
    padded, every_row = make_kernel_runner(decode_buckets=(DECODE_ROWS,)), make_kernel_runner()
    for runner in (padded, every_row):  # padded rows take the step-by-step path: all rows computed
        runner.prefill(ids)
    assert torch.equal(padded.extend(ids[:3]), every_row.extend(ids[:3], all_logits=True)[-1:])
    last = lean.shape.n_layers - 1
    assert torch.equal(lean.cache.keys[last], full.cache.keys[last])
    assert torch.equal(lean.cache.values[last], full.cache.values[last])


def test_typing_at_the_end_recomputes_only_the_tail(make_runner):
    ids = tokens(700, make_runner.vocab, seed=10)
    runner = make_runner()
    runner.prefill(ids[:650])
    forwards = runner.forwards
    _, computed = runner.prefill(ids[:651])
    assert computed == 1  # only the new token
    assert runner.forwards == forwards + 1


def test_reusable_prefix_needs_the_bucket_a_cold_run_uses():
    P, D = PREFILL_ROWS, DECODE_ROWS
    context = list(range(400))
    # cached as a cold run leaves 400 positions: three prefill blocks and a decode tail of 16
    cached, buckets = context, [P] * 384 + [D] * 16
    assert reusable_prefix(cached, buckets, context) == 400
    assert reusable_prefix(cached, buckets, context + list(range(100))) == 400  # still three blocks
    assert reusable_prefix(cached, buckets, context + list(range(260))) == 384  # five: 384.. is prefill
    assert reusable_prefix(cached, buckets, context[:300] + [7]) == 256  # two: 256.. is decode
    assert reusable_prefix(cached, [D] * 400, context) == 0
    assert reusable_prefix([1, 2], [D, D], [9]) == 0


def test_decode_forward_attention_does_not_depend_on_the_other_rows(make_runner):
    # rows 0..14 of a verify block sit in calls with different neighbours than in 1-token steps
    prefix = tokens(125, make_runner.vocab, seed=11)  # the block crosses a key bucket at 128
    block = tokens(15, make_runner.vocab, seed=12)
    runner = make_runner()
    runner.prefill(prefix)
    together = runner.extend(block, all_logits=True)
    runner.truncate(len(prefix))
    pairs = torch.cat([runner.extend(block[i : i + 2], all_logits=True) for i in range(0, 15, 2)])
    assert torch.equal(together, pairs)


def test_a_cancelled_prefill_keeps_what_it_did_and_a_repeat_costs_nothing(make_runner):
    ids = tokens(600, make_runner.vocab, seed=13)
    cancel = threading.Event()
    cancel.set()
    runner = make_runner()
    logits, computed = runner.prefill(ids, cancel)
    assert logits is None and computed == 0 and len(runner) == 0
    partial = make_runner()
    partial.prefill(ids[:300])  # as if a warm-up had been cut short after 300 positions
    cold_logits, _ = make_runner().prefill(ids)
    warm_logits, computed = partial.prefill(ids)
    # the part-done tail block is redone on torch's kernels; on the kernel every position is kept
    assert torch.equal(warm_logits, cold_logits) and computed == 600 - (300 if partial.any_schedule else 256)
    again, computed = partial.prefill(ids)
    assert computed == 0 and torch.equal(again, cold_logits)
    partial.extend(tokens(5, make_runner.vocab, seed=14), all_logits=True)  # generate, then re-ask
    again, computed = partial.prefill(ids)
    assert computed == 0 and torch.equal(again, cold_logits)


# -- token trees: one forward verifies several continuations, each with the bits of plain decoding


def random_tree(rng: random.Random, nodes: int, vocab: int) -> tuple[list[int], list[int]]:
    """A random token tree: node 0 the root, siblings with distinct tokens."""
    tokens, parents = [rng.randrange(vocab)], [-1]
    while len(tokens) < nodes:
        parent = rng.randrange(len(tokens))
        siblings = {tokens[i] for i, p in enumerate(parents) if p == parent}
        token = rng.randrange(vocab)
        if token not in siblings:
            tokens.append(token)
            parents.append(parent)
    return tokens, parents


def path_to(node: int, parents: list[int]) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize("prefix_len", [3, 120, 250])  # 120 + depth crosses a key bucket
@pytest.mark.parametrize("nodes", [1, 5, 16])
def test_every_tree_node_has_the_logits_of_decoding_its_path(make_runner, prefix_len, nodes):
    rng = random.Random(prefix_len * 100 + nodes)
    vocab = make_runner.vocab
    prefix = tokens(prefix_len, vocab, seed=prefix_len)
    runner = make_runner()
    runner.prefill(prefix)
    for shape in range(3):
        tree_tokens, parents = random_tree(rng, nodes, vocab)
        tree_logits = runner.verify_tree(tree_tokens, parents)
        assert len(runner) == prefix_len  # verification alone keeps no tree position
        for node in range(nodes):
            path = [tree_tokens[i] for i in path_to(node, parents)]
            chain = runner.extend(path, all_logits=True)  # the same tokens as one verify block
            runner.truncate(prefix_len)
            assert torch.equal(tree_logits[node], chain[-1]), f"tree {shape}, node {node} differs"


def test_accepting_a_path_leaves_the_cache_of_plain_decoding(make_runner):
    rng = random.Random(7)
    vocab = make_runner.vocab
    prefix = tokens(200, vocab, seed=15)
    tree_tokens, parents = random_tree(rng, 14, vocab)
    leaf = max(range(14), key=lambda n: len(path_to(n, parents)))
    path = path_to(leaf, parents)
    after = tokens(6, vocab, seed=16)

    runner = make_runner()
    runner.prefill(prefix)
    runner.verify_tree(tree_tokens, parents)
    runner.accept_path(path)
    assert runner.token_ids == prefix + [tree_tokens[i] for i in path]
    plain = make_runner()
    plain.prefill(prefix)
    for i in path:
        plain.extend([tree_tokens[i]])
    assert plain.cache.row_buckets == runner.cache.row_buckets
    assert torch.equal(runner.extend(after, all_logits=True), plain.extend(after, all_logits=True))


@pytest.mark.parametrize("panels", [False, True])
def test_gathering_positions_moves_every_layers_keys_and_values(panels):
    layers, kv_heads, head_dim = 3, 2, 40  # 40: the values' last panel is part padding
    cache = KVCache(layers, kv_heads, head_dim, 128, torch.float32, torch.device("cpu"), panels=panels)
    expected = KVCache(layers, kv_heads, head_dim, 128, torch.float32, torch.device("cpu"), panels=panels)
    keys = torch.randn(layers, kv_heads, 80, head_dim, generator=torch.Generator().manual_seed(3))
    values = torch.randn(layers, kv_heads, 80, head_dim, generator=torch.Generator().manual_seed(4))
    sources = [31, 32, 45, 70]  # across panels; the targets 30 .. 33 overlap the first two sources
    moved = list(range(80))
    moved[30:34] = sources
    for layer in range(layers):
        cache.write(layer, 0, keys[layer], values[layer])
        expected.write(layer, 0, keys[layer][:, moved], values[layer][:, moved])
    cache.gather(30, sources)
    assert torch.equal(cache.keys, expected.keys) and torch.equal(cache.values, expected.values)
    with pytest.raises(ValueError, match="KV cache full"):
        cache.gather(126, sources)
    with pytest.raises(ValueError, match="rising positions"):
        cache.gather(30, [29, 40])  # a source before its target
    with pytest.raises(ValueError, match="rising positions"):
        cache.gather(30, [45, 40])


def test_a_tree_needs_parents_before_children():
    from completion_engine.runner import TreePlan

    with pytest.raises(ValueError, match="parents"):
        TreePlan.of([-1, 2, 0], layers=1)
    with pytest.raises(ValueError, match="parents"):
        TreePlan.of([0], layers=1)


class CancelAfter(threading.Event):
    """A cancel that is set from its (checks + 1)-th look on: the runner looks once a layer."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks

    def is_set(self) -> bool:
        self.checks -= 1
        return self.checks < 0


def test_a_prefill_cancelled_inside_a_forward_resumes_with_the_bits_of_a_cold_run(make_runner):
    rows = make_runner().prefill_rows  # 128, or on the kernel 512
    ids = tokens(2 * rows + 88, make_runner.vocab, seed=18)
    runner = make_runner(capacity=len(ids) + 64)
    layers = runner.shape.n_layers
    # two whole prefill forwards, then cancelled after the first layer of the third
    logits, computed = runner.prefill(ids, CancelAfter(checks=2 * layers + 1))
    assert logits is None and computed == 2 * rows and len(runner) == 2 * rows
    resumed, computed = runner.prefill(ids, threading.Event())
    cold, _ = make_runner(capacity=len(ids) + 64).prefill(ids)
    assert computed == len(ids) - 2 * rows and torch.equal(resumed, cold)


def test_a_cancellable_fast_prefill_stops_within_a_block(tiny_target):
    """Draft models prefill in fast mode; a warm-up's cancel stops them within a block of PREFILL_ROWS."""
    ids = tokens(600, tiny_target.vocab_size, seed=17)
    runner = DecoderRunner(tiny_target.weights, exact=False, capacity=1024)
    layers = runner.shape.n_layers
    # two blocks, then cancelled after the first layer of the third
    logits, computed = runner.prefill(ids, CancelAfter(checks=2 * layers + 1))
    assert logits is None and computed == 2 * PREFILL_ROWS and len(runner) == 2 * PREFILL_ROWS
    logits, computed = runner.prefill(ids, threading.Event())  # resumed: the rest, in blocks
    assert computed == 600 - 2 * PREFILL_ROWS and logits.shape == (1, tiny_target.vocab_size)


@pytest.mark.parametrize("numerics", ["float32", "amx", "bf16dot"])
def test_a_runner_on_bf16_linears_keeps_a_bf16_cache(
    tiny_target_fp32_bf16_valued, tiny_target_fp32, numerics
):
    # so that every exactness test of a bf16-valued model above runs attention over a bf16 cache too
    # (the fma chains over its widened values; on AMX tiles, or with vdpbf16ps)
    def cache_dtype(model) -> torch.dtype:
        return DecoderRunner(
            model.weights, exact=True, capacity=64, row_invariant_kernel=True
        ).cache.keys.dtype

    with numerics_or_skip(numerics):
        assert cache_dtype(tiny_target_fp32_bf16_valued) == torch.bfloat16
        assert cache_dtype(tiny_target_fp32) == torch.float32  # float32 panels: fma chains throughout


def test_common_prefix_len_is_the_first_difference_for_lists_tuples_and_every_split():
    rng = random.Random(5)
    for _ in range(3000):
        a = [rng.randint(0, 2) for _ in range(rng.randint(0, 300))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 2) for _ in range(rng.randint(0, 80))]
        want = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        for first, second in ((a, b), (b, a), (tuple(a), b), (a, tuple(b))):
            assert common_prefix_len(first, second) == want
