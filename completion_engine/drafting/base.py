"""The drafter protocol: propose tokens, then hear how many the target accepted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from completion_engine.sampling import Sampler
from completion_engine.types import Draft


class Drafter(Protocol):
    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None) -> Draft:
        """Up to k tokens to follow context. sampler None means greedy."""
        ...

    def observe(self, proposed: int, accepted: int) -> None:
        """Feedback after verification, to adapt how much to draft."""
        ...


def empty_draft(source: str) -> Draft:
    return Draft(tokens=[], probs=None, source=source)
