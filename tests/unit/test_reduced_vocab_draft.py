"""A draft whose LM head covers only part of the vocabulary (as the shipped distilled draft)."""

from __future__ import annotations

import torch
from test_lossless import random_prompts

from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine
from completion_engine.models import LoadedModel
from completion_engine.runner import DecoderWeights
from completion_engine.types import Request


def subset_draft(model: LoadedModel, keep: int) -> LoadedModel:
    vocab_map = torch.arange(0, model.vocab_size, model.vocab_size // keep)[:keep]
    w = model.weights
    weights = DecoderWeights(
        w.shape, w.embed, w.layers, w.final_norm, w.lm_head[vocab_map], w.inv_freq, w.rope_scale
    )
    return LoadedModel("subset", weights, model.tokenizer, model.eos_token_ids, vocab_map=vocab_map)


def test_greedy_with_a_reduced_head_equals_plain(tiny_target, tiny_near_draft):
    draft = subset_draft(tiny_near_draft, keep=256)
    engine = CompletionEngine(
        EngineConfig(target="t", max_draft=6, draft_min_prob=0.0, row_cost=0.0, draft_cost=0.0),
        tiny_target,
        draft,
    )
    allowed = set(draft.vocab_map.tolist())
    for prompt in random_prompts(tiny_target.vocab_size, 6, seed=31):
        plain = engine.complete(Request(context=prompt, max_new_tokens=24, draft="none")).tokens
        proposed = engine.drafter_for("model").propose(prompt, 6)
        assert proposed.tokens and set(proposed.tokens) <= allowed
        assert engine.complete(Request(context=prompt, max_new_tokens=24, draft="model")).tokens == plain


def test_sampling_draft_probs_cover_the_target_vocabulary(tiny_target, tiny_near_draft):
    draft = subset_draft(tiny_near_draft, keep=128)
    engine = CompletionEngine(
        EngineConfig(target="t", max_draft=4, draft_min_prob=0.0, row_cost=0.0, draft_cost=0.0),
        tiny_target,
        draft,
    )
    from completion_engine.sampling import Sampler

    proposal = engine.drafter_for("model").propose([5, 6, 7, 8], 3, Sampler.seeded(1.0, 1.0, 0))
    assert proposal.probs.shape == (len(proposal.tokens), tiny_target.vocab_size)
    outside = torch.ones(tiny_target.vocab_size, dtype=torch.bool)
    outside[draft.vocab_map] = False
    assert torch.all(proposal.probs[:, outside] == 0)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(len(proposal.tokens)))
