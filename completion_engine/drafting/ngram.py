"""N-gram (prompt lookup) drafting over the context and every open document."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from completion_engine.drafting.base import empty_draft
from completion_engine.drafting.ngram_index import (
    NO_MATCH,
    DocumentIndex,
    Match,
    match_in_context,
    matches_in_context,
    ngram_key,
)
from completion_engine.drafting.tree import Continuation, candidate_tree
from completion_engine.sampling import Sampler
from completion_engine.types import CONTEXT, DOCUMENTS, Draft


class DocumentCorpus:
    """Token sequences of the open documents, most recently updated last, with a cap on total tokens;
    each with its origin (DOCUMENTS, or OUTPUTS for the engine's earlier completions)."""

    def __init__(self, min_n: int, max_tokens: int = 2_000_000) -> None:
        self.min_n = min_n
        self.max_tokens = max_tokens
        self._docs: OrderedDict[str, DocumentIndex] = OrderedDict()
        self._origins: dict[str, str] = {}

    def set_document(self, doc_id: str, tokens: Sequence[int], origin: str = DOCUMENTS) -> None:
        """Add or replace a document; it becomes the most recent. The oldest go when over the cap."""
        self._docs.pop(doc_id, None)
        self._docs[doc_id] = DocumentIndex(np.asarray(tokens, dtype=np.int64), self.min_n)
        self._origins[doc_id] = origin
        while self.total_tokens > self.max_tokens and len(self._docs) > 1:
            del self._origins[self._docs.popitem(last=False)[0]]

    def remove_document(self, doc_id: str) -> None:
        self._docs.pop(doc_id, None)
        self._origins.pop(doc_id, None)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._docs

    def __len__(self) -> int:
        return len(self._docs)

    @property
    def total_tokens(self) -> int:
        return sum(len(d.tokens) for d in self._docs.values())

    def most_recent_first(self) -> list[tuple[DocumentIndex, str]]:
        """The documents, most recently updated first, each with its origin."""
        return [(doc, self._origins[doc_id]) for doc_id, doc in reversed(self._docs.items())]


def find_draft(
    context: np.ndarray, corpus: DocumentCorpus | None, min_n: int, max_n: int, k: int
) -> tuple[Match, np.ndarray, str]:
    """(match, what followed it, its origin): the longest match over the context, then the documents,
    most recent first; a tie keeps the earlier find."""
    best, source, origin = match_in_context(context, min_n, max_n), context, CONTEXT
    if corpus is not None and best.length < max_n:
        tail = context[-max_n:]
        for doc, doc_origin in corpus.most_recent_first():
            found = doc.find(tail, max_n)
            if found.length > best.length:
                best, source, origin = found, doc.tokens, doc_origin
                if best.length >= max_n:
                    break
    if best is NO_MATCH or best.length == 0:
        return NO_MATCH, source[:0], origin
    if source is context:
        return best, continue_periodically(context, best.end, k), origin
    return best, source[best.end + 1 : best.end + 1 + k], origin


MAX_CONTINUATIONS = 16  # candidates merged into one tree: the longest matches, the most recent first


def find_continuations(
    context: np.ndarray, corpus: DocumentCorpus | None, min_n: int, max_n: int, k: int
) -> tuple[int, list[Continuation]]:
    """(longest match length, what followed each of the longest matches) in the context and the documents.

    Matches one token shorter than the longest are kept too: they often carry the right branch.
    """
    found = [(m, context, CONTEXT) for m in matches_in_context(context, min_n, max_n)]
    if corpus is not None:
        tail = context[-max_n:]
        # the same key in every document (None: a tail shorter than their n-grams finds nothing)
        key = ngram_key(tail[-corpus.min_n :]) if len(tail) >= corpus.min_n else None
        for doc, origin in corpus.most_recent_first():
            found += [(m, doc.tokens, origin) for m in doc.find_all(tail, max_n, key)]
    if not found:
        return 0, []
    longest = max(match.length for match, _, _ in found)
    found = [f for f in found if f[0].length >= max(min_n, longest - 1)]
    found.sort(key=lambda f: -f[0].length)  # stable: the context first, then the most recent documents
    continuations = []
    for match, source, origin in found[:MAX_CONTINUATIONS]:
        if origin == CONTEXT:
            tokens = continue_periodically(context, match.end, k)
        else:
            tokens = source[match.end + 1 : match.end + 1 + k]
        continuations.append(Continuation(tokens.tolist(), float(match.length), origin))
    return longest, continuations


def continue_periodically(context: np.ndarray, end: int, k: int) -> np.ndarray:
    """The k tokens after context[end], reading on into the draft itself past the context's end.

    A match d tokens back predicts that the text repeats with period d: [a, b, a, b, a] matched at
    index 3 (period 2) continues [b, a, b, ...] rather than stopping after the one known token.
    """
    period = len(context) - 1 - end
    start = end + 1
    known = context[start:]
    reps = -(-k // period) if period > 0 else 1
    return np.tile(known, reps)[:k] if len(known) else known


class NgramDrafter:
    """Prompt lookup. With `tree`, greedy requests get a candidate tree of every likely continuation
    (drafting/tree.py); sampled ones, and `tree=False`, a chain from the single longest match."""

    source = "ngram"

    def __init__(
        self, corpus: DocumentCorpus | None, min_n: int = 2, max_n: int = 8, tree: bool = True
    ) -> None:
        self.corpus = corpus
        self.min_n = min_n
        self.max_n = max_n
        self.tree = tree

    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None = None) -> Draft:
        if k <= 0:
            return empty_draft(self.source)
        ctx = np.asarray(context[-4096:] if len(context) > 4096 else context, dtype=np.int64)
        if self.tree and sampler is None:
            longest, continuations = find_continuations(ctx, self.corpus, self.min_n, self.max_n, k)
            if not continuations:
                return empty_draft(self.source)
            tokens, parents, origins = candidate_tree(continuations, k)
            chain = parents == list(range(-1, len(parents) - 1))
            return Draft(tokens, None, self.source, longest, None if chain else parents, origins)
        match, tokens, origin = find_draft(ctx, self.corpus, self.min_n, self.max_n, k)
        if match.length == 0:
            return empty_draft(self.source)
        return Draft(
            tokens=tokens.tolist(),
            probs=None,
            source=self.source,
            match_len=match.length,
            origins=[origin] * len(tokens),
        )
