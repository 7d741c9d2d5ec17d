"""Prompt lookup as pure functions over numpy token arrays, plus an index per document.

The drafter looks for the longest earlier occurrence of the context's last tokens and proposes
the tokens that followed it. Worked example (min_n=2, max_n=4, k=3):

    sequence = [1, 2, 3, 4, 2, 3]          tail of the context = [..., 2, 3]
    candidates ending in (2, 3): position 2 (the 3 after 1, 2) -- position 5 is the tail itself
    match length at position 2: 2 tokens ([2, 3]); the 1 before it differs from the 4 before the tail
    draft = sequence[3 : 3 + 3] = [4, 2, 3]

A document index sorts the hashes of every min_n-gram once, so a lookup is a binary search plus a
vectorised backward extension over the candidates, not a scan of every token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit constant; products wrap modulo 2**64
_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Match:
    length: int  # how many tokens of the context tail matched (0: no match)
    end: int  # index in the sequence of the last matched token


NO_MATCH = Match(0, -1)


def ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hash of the n-gram ending at each index i >= n - 1: [len(tokens) - n + 1] uint64."""
    if len(tokens) < n:
        return np.empty(0, dtype=np.uint64)
    t = tokens.astype(np.uint64)
    h = np.zeros(len(tokens) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _HASH_BASE + t[j : len(tokens) - n + 1 + j]
    return h


def ngram_key(tokens: np.ndarray) -> np.uint64:
    """The hash of one n-gram (all of `tokens`): ngram_hashes(tokens, len(tokens))[0], in Python ints
    (a lookup's one key, without numpy's per-call overhead).

    >>> bool(ngram_key(np.array([3, 4])) == ngram_hashes(np.array([3, 4]), 2)[0])
    True
    """
    h, base = 0, int(_HASH_BASE)
    for token in tokens.tolist():
        h = (h * base + token) & _MASK
    return np.uint64(h)


def extend_backwards(sequence: np.ndarray, ends: np.ndarray, tail: np.ndarray, max_n: int) -> np.ndarray:
    """For each candidate end index: how many tokens up to it (at most max_n) equal the tail's last ones.

    One pass over a [candidates, max_n] block: a fixed handful of numpy calls, whatever the match lengths.

    >>> extend_backwards(np.array([1, 2, 3, 9, 2, 3, 7, 2, 3]), np.array([2, 5, 1]), np.array([2, 3]), 4)
    array([2, 2, 0])
    """
    width = min(max_n, len(tail))
    if width == 0 or len(ends) == 0:
        return np.zeros(len(ends), dtype=np.int64)
    back = ends[:, None] - np.arange(width)  # [candidates, width]: the index j tokens before each end
    inside = back >= 0
    same = inside & (sequence[np.where(inside, back, 0)] == tail[: -width - 1 : -1])
    return np.logical_and.accumulate(same, axis=1).sum(axis=1)


def best_match(sequence: np.ndarray, ends: np.ndarray, tail: np.ndarray, min_n: int, max_n: int) -> Match:
    """Among candidate ends, the longest match of at least min_n tokens; ties go to the latest end."""
    if len(ends) == 0:
        return NO_MATCH
    lengths = extend_backwards(sequence, ends, tail, max_n)
    longest = int(lengths.max())
    if longest < min_n:
        return NO_MATCH
    return Match(longest, int(ends[lengths == longest].max()))


def match_in_context(context: np.ndarray, min_n: int, max_n: int) -> Match:
    """Longest earlier occurrence of the context's own tail (the tail itself excluded)."""
    if len(context) <= min_n:
        return NO_MATCH
    tail = context[-max_n:]
    return best_match(context, _context_candidates(context, tail, min_n), tail, min_n, max_n)


def _context_candidates(context: np.ndarray, tail: np.ndarray, min_n: int) -> np.ndarray:
    body = context[:-1]  # an end at the last index would be the tail itself
    candidates = np.flatnonzero(body == tail[-1])
    return candidates[candidates >= min_n - 1]


def all_matches(
    sequence: np.ndarray, ends: np.ndarray, tail: np.ndarray, min_n: int, max_n: int
) -> list[Match]:
    """Every candidate end whose match is at least min_n tokens long, longest first, then latest.

    >>> all_matches(np.array([1, 2, 3, 9, 2, 3, 7, 2, 3]), np.array([2, 5]), np.array([2, 3]), 2, 4)
    [Match(length=2, end=5), Match(length=2, end=2)]
    """
    if len(ends) == 0:
        return []
    lengths = extend_backwards(sequence, ends, tail, max_n)
    keep = lengths >= min_n
    order = np.lexsort((-ends[keep], -lengths[keep]))
    kept_lengths, kept_ends = lengths[keep][order], ends[keep][order]
    return [Match(int(length), int(end)) for length, end in zip(kept_lengths, kept_ends, strict=True)]


def matches_in_context(context: np.ndarray, min_n: int, max_n: int) -> list[Match]:
    """Every earlier occurrence of the context's tail of at least min_n tokens (see all_matches)."""
    if len(context) <= min_n:
        return []
    tail = context[-max_n:]
    return all_matches(context, _context_candidates(context, tail, min_n), tail, min_n, max_n)


class DocumentIndex:
    """The sorted min_n-gram hashes of one document, built once per version of its text."""

    def __init__(self, tokens: np.ndarray, min_n: int) -> None:
        self.tokens = tokens
        self.min_n = min_n
        hashes = ngram_hashes(tokens, min_n)
        order = np.argsort(hashes, kind="stable")  # stable: equal hashes keep ascending positions
        self.sorted_hashes = hashes[order]
        self.sorted_ends = order.astype(np.int64) + (min_n - 1)

    def find(self, tail: np.ndarray, max_n: int) -> Match:
        return best_match(self.tokens, self._candidates(tail), tail, self.min_n, max_n)

    def find_all(self, tail: np.ndarray, max_n: int, key: np.uint64 | None = None) -> list[Match]:
        """key: ngram_key of the tail's last self.min_n tokens, from a caller that looks in several
        documents (DocumentCorpus builds them all with its min_n)."""
        return all_matches(self.tokens, self._candidates(tail, key), tail, self.min_n, max_n)

    def _candidates(self, tail: np.ndarray, key: np.uint64 | None = None) -> np.ndarray:
        """Ends of the min_n-grams equal (by hash) to the tail's last min_n tokens."""
        if len(tail) < self.min_n:
            return np.empty(0, dtype=np.int64)
        if key is None:
            key = ngram_key(tail[-self.min_n :])
        lo = np.searchsorted(self.sorted_hashes, key, side="left")
        hi = np.searchsorted(self.sorted_hashes, key, side="right")
        ends = self.sorted_ends[lo:hi]
        return ends[ends < len(self.tokens) - 1]  # a draft needs at least one following token
