"""Speculative sampling preserves the target's distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine
from completion_engine.sampling import Sampler, top_p_filter
from completion_engine.types import Request
from completion_engine.verify import greedy_accept, greedy_choices, rejection_sample

VOCAB = 5
SAMPLES = 20_000
# With 20,000 samples over at most 25 outcomes the expected total-variation error is about 0.01;
# a biased sampler (for example one that always keeps the draft) is off by 0.1 or more.
TV_BOUND = 0.03


def markov(seed: int) -> torch.Tensor:
    """A random next-token table: row i is the distribution after token i."""
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(VOCAB, VOCAB, generator=generator) * 1.5, dim=-1)


def total_variation(counts: Counter, expected: dict, samples: int) -> float:
    keys = set(counts) | set(expected)
    return 0.5 * sum(abs(counts.get(k, 0) / samples - expected.get(k, 0.0)) for k in keys)


def speculative_pair(
    p: torch.Tensor, q: torch.Tensor | None, start: int, sampler: Sampler
) -> tuple[int, int]:
    """Two tokens after `start` by one or two speculative steps with a 2-token draft."""
    if q is None:  # a point-mass (n-gram) draft: always propose the tokens 0, 1
        draft, draft_probs = [0, 1], None
    else:
        first = sampler.sample(q[start])
        second = sampler.sample(q[first])
        draft, draft_probs = [first, second], torch.stack([q[start], q[first]])
    target_probs = torch.stack([p[start], p[draft[0]], p[draft[1]]])
    accepted, token = rejection_sample(draft, draft_probs, target_probs, sampler)
    out = [*draft[:accepted], token]
    if len(out) < 2:  # one more plain step from the target
        out.append(sampler.sample(p[out[-1]]))
    return out[0], out[1]


@pytest.mark.parametrize("draft_kind", ["model", "point-mass"])
def test_joint_distribution_of_two_tokens_matches_the_target(draft_kind):
    p, q = markov(0), markov(1)
    sampler = Sampler.seeded(1.0, 1.0, seed=3)
    counts = Counter(
        speculative_pair(p, q if draft_kind == "model" else None, 2, sampler) for _ in range(SAMPLES)
    )
    expected = {(a, b): float(p[2, a] * p[a, b]) for a in range(VOCAB) for b in range(VOCAB)}
    assert total_variation(counts, expected, SAMPLES) < TV_BOUND


def test_a_biased_sampler_would_fail_the_bound():
    """The bound has teeth: taking the draft token every time is far from p."""
    p, q = markov(0), markov(1)
    sampler = Sampler.seeded(1.0, 1.0, seed=4)
    counts = Counter((sampler.sample(q[2]),) for _ in range(SAMPLES))
    expected = {(a,): float(p[2, a]) for a in range(VOCAB)}
    assert total_variation(counts, expected, SAMPLES) > 3 * TV_BOUND


def test_greedy_accept_takes_the_longest_agreeing_prefix():
    logits = torch.eye(6)[[1, 2, 5, 4]]  # argmaxes 1, 2, 5, 4
    assert greedy_accept([1, 2, 3], logits) == (2, 5)  # 1, 2 agree; 3 != 5 -> recovered token 5
    assert greedy_accept([1, 2, 5], logits) == (3, 4)  # all agree -> bonus token 4
    assert greedy_accept([], logits[:1]) == (0, 1)


def test_greedy_choices_are_argmax_even_with_ties_and_masked_tokens():
    generator = torch.Generator().manual_seed(5)
    logits = torch.randint(-3, 4, (64, 300), generator=generator).float()  # many ties a row
    logits[::3, ::2] = float("-inf")  # as token healing masks
    logits[5] = float("-inf")
    logits[5, 299] = 0.0
    assert greedy_choices(logits) == logits.argmax(dim=-1).tolist()
    assert greedy_choices(logits.double()) == logits.argmax(dim=-1).tolist()  # torch's path


def test_greedy_choices_take_the_first_nan_as_torch_does():
    logits = torch.zeros(4, 50)
    logits[0, 7] = logits[0, 9] = float("nan")
    logits[1, 3] = float("inf")
    logits[1, 4] = float("nan")
    logits[2, :] = float("-inf")
    logits[3, 10] = logits[3, 40] = 1.0
    expected = [7, 4, 0, 10]
    assert torch.max(logits, dim=-1).indices.tolist() == expected
    assert greedy_choices(logits) == expected


def test_greedy_choices_agree_with_torch_on_vocabulary_sized_rows_and_views():
    generator = torch.Generator().manual_seed(11)
    logits = torch.randn(6, 49_157, generator=generator)  # past the last whole SIMD block: a tail
    logits[0, 40_000] = float("nan")  # far into the row
    logits[1, 49_156] = float("nan")  # in the tail
    logits[2, 10] = logits[2, 30_000] = 50.0  # a tie, far apart
    logits[3] = -1.0
    logits[3, 5], logits[3, 9] = -0.0, 0.0  # -0.0 == +0.0: the first
    logits[4, 3] = float("inf")
    expected = torch.max(logits, dim=-1).indices.tolist()
    assert expected[:5] == [40_000, 49_156, 10, 5, 3]
    assert greedy_choices(logits) == expected
    assert greedy_choices(logits[:, ::2]) == torch.max(logits[:, ::2], dim=-1).indices.tolist()  # strided
    assert greedy_choices(logits[2].view(1, -1)) == [10]
    assert greedy_choices(logits.clone().requires_grad_()) == expected


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    assert torch.allclose(top_p_filter(probs, 0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_engine_sampling_matches_the_target_distribution(tiny_target):
    """End to end: the token after a verify step with an n-gram draft follows the target's distribution.

    Runs are conditioned on the most likely first token t1; the document drafts the most likely
    second token after it, so the verify step both accepts and rejects across seeds.
    """
    # row_cost=0: the draft keeps its size on every machine (a cost timed at load could cut it)
    engine = CompletionEngine(EngineConfig(target="t", max_draft=4, row_cost=0.0), tiny_target)
    prompt, temperature = [5, 6, 7, 8, 5, 6, 7], 0.7
    first = next_token_probs(engine, prompt, temperature)
    t1 = int(first.argmax())
    second = next_token_probs(engine, [*prompt, t1], temperature)
    engine.corpus.set_document("d", [*prompt[-3:], t1, int(second.argmax()), 9, 9])
    buckets = {(int(t),): float(second[t]) for t in torch.topk(second, 6).indices}
    buckets[("other",)] = 1.0 - sum(buckets.values())
    counts, accepted, _ = second_tokens(engine, prompt, t1, buckets, "ngram", temperature, runs=1500)
    samples = sum(counts.values())
    assert samples > 250 and 0 < accepted < samples  # both branches of the verify step were taken
    # sqrt(buckets / samples) / 2 is about the expected total-variation error; allow 3 times it
    assert total_variation(counts, buckets, samples) < 1.5 * (len(buckets) / samples) ** 0.5


def second_tokens(
    engine: CompletionEngine,
    prompt: list[int],
    t1: int,
    buckets: dict,
    draft: str,
    temperature: float,
    runs: int,
) -> tuple[Counter, int, int]:
    """Seeded 3-token runs that start with t1: the second token's bucket counts, accepted and drafted."""
    counts: Counter = Counter()
    accepted = drafted = 0
    for seed in range(runs):
        generation = engine.complete(
            Request(context=prompt, max_new_tokens=3, draft=draft, temperature=temperature, seed=seed)
        )
        if generation.tokens[0] != t1:
            continue
        key = (generation.tokens[1],)
        counts[key if key in buckets else ("other",)] += 1
        accepted += generation.stats.accepted
        drafted += generation.stats.drafted
    return counts, accepted, drafted


def next_token_probs(engine: CompletionEngine, context: list[int], temperature: float) -> torch.Tensor:
    runner = engine.target_runner
    runner.truncate(0)
    logits = runner.extend(context)[0]
    runner.truncate(0)
    return torch.softmax(logits / temperature, dim=-1)
