"""The drafter registry: every draft method by name, what builds it, and whether it needs a draft model.

Everything that lists, checks or builds draft methods derives from `DRAFTERS` (the command lines'
choices, the server's option check, eval's plan, the engine's choice). No torch import here: the
language server validates names with it. A factory receives the engine's parts and builds the
drafter for one request (None for plain decoding).

>>> [name for name in DRAFTERS]
['none', 'ngram', 'ngram-chain', 'model', 'hybrid']
>>> needs_draft_model("hybrid"), needs_draft_model("ngram")
(True, False)
>>> drafter_spec("fancy")
Traceback (most recent call last):
...
ValueError: unknown draft method 'fancy'; choose one of none, ngram, ngram-chain, model, hybrid
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from completion_engine.drafting import Drafter


@dataclass(frozen=True, slots=True)
class DrafterParts:
    """What a factory may build from: the engine's shared drafters and settings."""

    ngram: Any  # NgramDrafter over the open-document corpus
    model: Any | None  # ModelDrafter, or None without a draft model
    hybrid_min_match: int


Factory = Callable[[DrafterParts], "Drafter | None"]


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    name: str
    factory: Factory
    needs_draft_model: bool
    summary: str


def _none(parts: DrafterParts) -> None:
    return None


def _ngram(parts: DrafterParts):
    return parts.ngram


def _ngram_chain(parts: DrafterParts):
    from completion_engine.drafting.ngram import NgramDrafter

    ngram = parts.ngram
    return NgramDrafter(ngram.corpus, ngram.min_n, ngram.max_n, tree=False)


def _model(parts: DrafterParts):
    return parts.model


def _hybrid(parts: DrafterParts):
    from completion_engine.drafting.hybrid import HybridDrafter

    return HybridDrafter(parts.ngram, parts.model, parts.hybrid_min_match)


DRAFTERS: dict[str, DrafterSpec] = {
    spec.name: spec
    for spec in (
        DrafterSpec("none", _none, False, "plain decoding, no drafts"),
        DrafterSpec("ngram", _ngram, False, "a tree of what followed the same n-gram in the open documents"),
        DrafterSpec("ngram-chain", _ngram_chain, False, "the single longest n-gram match, as one chain"),
        DrafterSpec("model", _model, True, "a small draft model"),
        DrafterSpec("hybrid", _hybrid, True, "a long n-gram match, else the draft model"),
    )
}

DRAFT_METHODS: tuple[str, ...] = tuple(DRAFTERS)
NEEDS_DRAFT_MODEL = "needs a draft model (--draft-model)"


def drafter_spec(name: str) -> DrafterSpec:
    """The registry entry; ValueError naming the choices for an unknown name."""
    try:
        return DRAFTERS[name]
    except KeyError:
        raise ValueError(f"unknown draft method {name!r}; choose one of {', '.join(DRAFT_METHODS)}") from None


def needs_draft_model(name: str) -> bool:
    return drafter_spec(name).needs_draft_model


def draft_problem(name: str, has_draft_model: bool) -> str | None:
    """Why this method cannot run here, or None.

    >>> draft_problem("model", False)
    "draft method 'model' needs a draft model (--draft-model)"
    >>> draft_problem("ngram", False) is None
    True
    """
    try:
        spec = drafter_spec(name)
    except ValueError as error:
        return str(error)
    if spec.needs_draft_model and not has_draft_model:
        return f"draft method {name!r} {NEEDS_DRAFT_MODEL}"
    return None
