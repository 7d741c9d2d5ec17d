"""The drafter protocol: propose tokens (how many pays is the engine's DraftBudget's to learn)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from completion_engine.sampling import Sampler
from completion_engine.types import Draft


class Drafter(Protocol):
    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None) -> Draft:
        """Up to k tokens to follow context. sampler None means greedy."""
        ...


def empty_draft(source: str) -> Draft:
    return Draft(tokens=[], probs=None, source=source)
