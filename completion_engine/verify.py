"""Verification: which drafted tokens the target keeps, and the token it adds.

Glossary (one verify step, draft d_1..d_n, target distributions p_0..p_n from one forward over
[pending, d_1, ..., d_n]):
- accepted: the drafted tokens kept, always a prefix d_1..d_a;
- recovered: the target's own token at the first rejection (greedy: its argmax; sampling: a draw
  from the residual distribution);
- bonus: the extra token drawn from p_n when every drafted token was accepted.
Each step therefore yields a + 1 tokens for one target forward.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from completion_engine.sampling import Sampler


def greedy_accept(draft: Sequence[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix of the draft equal to the target's argmax, then the target's next token.

    target_logits: [n + 1, vocab]; row i predicts the token after draft[:i].
    """
    choices = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft) and choices[accepted] == draft[accepted]:
        accepted += 1
    return accepted, choices[accepted]


def rejection_sample(
    draft: Sequence[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor, sampler: Sampler
) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): output ~ p exactly.

    p: target probs [n + 1, vocab]; q: draft probs [n, vocab] (None: point masses, q(d_i) = 1).
    For each drafted token x = d_i:
      accept with probability min(1, p(x) / q(x));
      on rejection, draw from norm(max(0, p - q)) and stop.
    If all n are accepted, draw a bonus token from p_n.
    Why it is exact: P(out = y) = q(y) min(1, p(y)/q(y)) + (1 - sum_z min(p(z), q(z))) r(y)
                               = min(p(y), q(y)) + max(0, p(y) - q(y)) = p(y).
    """
    for i, token in enumerate(draft):
        p = target_probs[i]
        q_token = 1.0 if draft_probs is None else float(draft_probs[i, token])
        p_token = float(p[token])
        if q_token > 0 and sampler.uniform() < min(1.0, p_token / q_token):
            continue
        return i, sampler.sample(residual(p, draft_probs[i] if draft_probs is not None else None, token))
    return len(draft), sampler.sample(target_probs[len(draft)])


def residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """norm(max(0, p - q)); for a point mass at `token` that is p with `token` removed."""
    if q is None:
        r = p.clone()
        r[token] = 0.0
    else:
        r = torch.clamp(p - q, min=0.0)
    total = r.sum()
    if total <= 0:  # p == q: rejection has probability 0, but guard against rounding
        return p
    return r / total
