"""Drafting with a small causal LM that keeps its own KV cache."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from completion_engine.draft_budget import MODEL, best_time
from completion_engine.drafting.base import empty_draft
from completion_engine.runner import DECODE_ROWS, DecoderRunner
from completion_engine.sampling import Sampler
from completion_engine.types import Draft

DRAFT_WINDOW = 1024  # context tokens a draft model sees at most: its prefill and attention stay cheap


class ModelDrafter:
    """Greedy (or sampled) decoding with the draft model, stopping early when it gets unsure.

    How many tokens to draft comes from `size` (the engine's DraftBudget.plan, which weighs what
    was accepted at each depth against the cost of drafting and verifying a token).
    """

    source = MODEL

    def __init__(
        self,
        runner: DecoderRunner,
        min_prob: float,
        vocab_map: torch.Tensor | None = None,
        target_vocab: int | None = None,
        size: Callable[[int], int] | None = None,
        window: int = DRAFT_WINDOW,
    ) -> None:
        self.runner = runner
        self.vocab_map = vocab_map  # draft head row -> token id, for a head over a subset of the vocabulary
        self.target_vocab = target_vocab or runner.shape.vocab
        self.min_prob = min_prob
        self.size = size  # most -> how many to draft now (None: most)
        self.window = window  # the most context tokens the draft model sees (see _window_start)
        self._start = 0

    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None = None) -> Draft:
        if self.size is not None:
            k = self.size(k)
        if k <= 0 or not context:
            return empty_draft(self.source)
        logits = self._sync(context)
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        for _ in range(k):
            probs = sampler.probs(logits[-1]) if sampler else torch.softmax(logits[-1], dim=-1)
            row = sampler.sample(probs) if sampler else int(probs.argmax())
            if sampler is None and float(probs[row]) < self.min_prob and tokens:
                break
            token = row if self.vocab_map is None else int(self.vocab_map[row])
            tokens.append(token)
            dists.append(self._over_target_vocab(probs) if sampler else probs)
            if len(tokens) == k:
                break
            logits = self.runner.extend([token])
        return Draft(tokens=tokens, probs=torch.stack(dists) if sampler else None, source=self.source)

    def _over_target_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """q over the target's vocabulary: tokens outside the draft head's subset get probability 0."""
        if self.vocab_map is None and len(probs) == self.target_vocab:
            return probs
        full = torch.zeros(self.target_vocab, dtype=probs.dtype, device=probs.device)
        index = (
            self.vocab_map if self.vocab_map is not None else torch.arange(len(probs), device=probs.device)
        )
        return full.scatter(0, index, probs)

    def warm(self, context: Sequence[int], cancel: threading.Event | None = None) -> None:
        """Bring the draft's cache to `context` ahead of a request; a set `cancel` stops within a layer."""
        if context:
            self._sync(context, cancel)

    def _sync(self, context: Sequence[int], cancel: threading.Event | None = None) -> torch.Tensor | None:
        """Bring the draft cache to the window of `context`; the logits after it (None: cancelled)."""
        return self.runner.prefill(context[self._window_start(len(context)) :], cancel)[0]

    def _window_start(self, length: int) -> int:
        """Where the draft's view of a context of `length` tokens starts: it sees at most `window`
        tokens, and the start moves in jumps of half a window, so that between jumps each step
        extends the cached prefix rather than shifting it.

        Why: a cold draft prefill of a whole 3,900-token context took 2.3 s on one thread (0.8 s at
        2,000 tokens), a third of a 64-token completion's decoding; at 1,024 tokens it takes 0.3 s.
        """
        window = min(self.window, self.runner.capacity - DECODE_ROWS)  # room for the drafted tokens
        if length <= window:
            self._start = 0
        elif not self._start + window // 2 <= length <= self._start + window:
            self._start = length - window // 2  # also where an unrelated request left a start behind
        return self._start

    def token_seconds(self, context: int = 256) -> float:
        """The best time of one draft token after `context` tokens: what drafting is priced by."""
        runner = self.runner
        runner.prefill([0] * context)

        def token() -> None:
            runner.extend([0])
            if runner.device.type == "cuda":
                torch.cuda.synchronize()  # time the work, not its launch (as the target's step is)
            runner.truncate(context)

        seconds = best_time(token)
        runner.truncate(0)
        return seconds
