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


def greedy_choices(logits: torch.Tensor) -> list[int]:
    """Each row's argmax, a NaN counting as largest: plain decoding's and verification's choice.

    The first index of the row's largest logit (or of its first NaN), as torch's `max` over the last
    dim gives it. On the CPU numpy's argmax finds the same index at a tenth of the time: its SIMD
    loop takes ~4 us a 49k-token float32 row there, torch's `max` ~45 us and its `argmax`, which
    runs scalar, ~60 us. Elsewhere (a GPU) torch's `max`.

    >>> greedy_choices(torch.tensor([[0.0, 2.0, 2.0], [3.0, 1.0, 3.0]]))
    [1, 0]
    """
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.detach().numpy().argmax(axis=-1).tolist()
    return logits.max(dim=-1).indices.tolist()


def greedy_accept(draft: Sequence[int], target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix of the draft equal to the target's argmax, then the target's next token.

    target_logits: [n + 1, vocab]; row i predicts the token after draft[:i].
    """
    choices = greedy_choices(target_logits)
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


def greedy_accept_tree(
    tokens: Sequence[int], parents: Sequence[int], target_logits: torch.Tensor
) -> tuple[list[int], int]:
    """Walk a verified token tree as greedy decoding would; return (the path kept, the next token).

    tokens[0] is the root (the pending token, already chosen); target_logits[i] predicts the token
    after node i's root-to-node path. From the root, follow the child whose token is the target's
    argmax; stop where no child is. The path (root first) holds exactly the tokens plain greedy
    decoding would produce, since every node's logits are those of decoding its path.

    >>> import torch
    >>> logits = torch.zeros(4, 9); logits[0, 5] = logits[2, 7] = logits[3, 1] = 1.0
    >>> greedy_accept_tree([4, 6, 5, 7], [-1, 0, 0, 2], logits)  # root -> 6 | root -> 5 -> 7
    ([0, 2, 3], 1)
    """
    choices = greedy_choices(target_logits)
    children: dict[int, dict[int, int]] = {}
    for node in range(1, len(tokens)):
        children.setdefault(parents[node], {})[tokens[node]] = node
    path = [0]
    while (child := children.get(path[-1], {}).get(choices[path[-1]])) is not None:
        path.append(child)
    return path, choices[path[-1]]
