"""The shape-bucketed runner: correct against transformers, bit-identical however rows are batched."""

from __future__ import annotations

import random

import pytest
import torch

from completion_engine.runner import DecoderRunner
from completion_engine.tiny import build_model
from completion_engine.weights import decoder_weights_from_hf


def tokens(count: int, vocab: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(count)]


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
def test_bf16_verify_block_equals_decode_steps_bit_for_bit(tiny_target, prefix_len):
    runner = DecoderRunner(tiny_target.weights, exact=True, capacity=1024)
    ids = tokens(prefix_len + 16, tiny_target.vocab_size, seed=prefix_len)
    runner.extend(ids[:prefix_len])
    block = runner.extend(ids[prefix_len:], all_logits=True)  # one forward of 16 rows
    runner.truncate(prefix_len)
    steps = torch.cat([runner.extend([t], all_logits=True) for t in ids[prefix_len:]])  # 16 forwards of 1 row
    assert torch.equal(block, steps)


def test_prefill_chunking_does_not_change_bits(tiny_target):
    ids = tokens(300, tiny_target.vocab_size, seed=1)
    whole = DecoderRunner(tiny_target.weights, exact=True, capacity=1024).extend(ids)
    pieces = DecoderRunner(tiny_target.weights, exact=True, capacity=1024)
    for start in range(0, 300, 37):
        last = pieces.extend(ids[start : start + 37])
    assert torch.equal(whole, last)


def test_kv_rollback_gives_the_logits_of_a_fresh_prefill(tiny_target):
    ids = tokens(80, tiny_target.vocab_size, seed=2)
    runner = DecoderRunner(tiny_target.weights, exact=True, capacity=1024)
    runner.extend(ids[:50])
    runner.extend(tokens(12, tiny_target.vocab_size, seed=3), all_logits=True)  # a draft that gets rejected
    runner.truncate(50)
    runner.extend(tokens(7, tiny_target.vocab_size, seed=4))  # and another
    runner.truncate(50)
    after_rollback = runner.extend(ids[50:], all_logits=True)
    fresh = DecoderRunner(tiny_target.weights, exact=True, capacity=1024)
    fresh.extend(ids[:50])
    assert torch.equal(after_rollback, fresh.extend(ids[50:], all_logits=True))
    assert runner.token_ids == ids


def test_capacity_is_enforced(tiny_target):
    runner = DecoderRunner(tiny_target.weights, exact=True, capacity=128)
    with pytest.raises(ValueError, match="exceeds capacity"):
        runner.extend(tokens(runner.capacity + 1, tiny_target.vocab_size))
