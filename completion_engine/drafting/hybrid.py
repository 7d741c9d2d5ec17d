"""Hybrid drafting: a long enough n-gram match beats the draft model, which fills in otherwise.

Policy: an n-gram match of at least `min_match` tokens (4 by default: README, "The distilled
draft model", measured against 3, 5 and 6) is copied text the target very often
repeats (an identifier list, a repeated call, the code after the cursor), and costs nothing to
make; a shorter or absent match says the text is new, where the draft model's prediction is the
better bet despite its cost per token, unless the draft budget finds that drafting with the model
does not pay here (then the short match is the draft).
"""

from __future__ import annotations

from collections.abc import Sequence

from completion_engine.drafting.model import ModelDrafter
from completion_engine.drafting.ngram import NgramDrafter
from completion_engine.sampling import Sampler
from completion_engine.types import Draft


class HybridDrafter:
    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, min_match: int) -> None:
        self.ngram = ngram
        self.model = model
        self.min_match = min_match

    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None = None) -> Draft:
        draft = self.ngram.propose(context, k, sampler)
        if draft.match_len < self.min_match:
            modelled = self.model.propose(context, k, sampler)
            if modelled.tokens or not draft.tokens:  # the model's budget may say drafting does not pay
                draft = modelled
        return draft
