"""Quality metrics of one completion against the real code, and the speed ratios of a run.

Pure functions on strings and numbers: no model, no engine.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence


def first_line(text: str) -> str:
    """The first line of a completion, without its line break and trailing blanks.

    A body completion starts with the line break that ends the cursor's line: the first line is
    the one after it.
    """
    return text.lstrip("\r\n").split("\n", 1)[0].rstrip()


def first_line_exact_match(completion: str, reference: str) -> bool:
    """Does the completion's first line equal the reference's (trailing blanks ignored)?

    >>> first_line_exact_match("x = 1  \\ny = 2", "x = 1\\nz = 3")
    True
    """
    return first_line(completion) == first_line(reference)


def levenshtein(a: str, b: str) -> int:
    """Characters to insert, delete or substitute to turn a into b (two-row dynamic programme)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def edit_similarity(completion: str, reference: str) -> float:
    """1 - levenshtein / longer length, on the texts with trailing blanks stripped; 1.0 for two empty texts.

    As in CodeXGLUE / RepoBench: 1.0 is identical, 0.0 shares nothing in place.
    """
    a, b = completion.rstrip(), reference.rstrip()
    longest = max(len(a), len(b))
    return 1.0 - levenshtein(a, b) / longest if longest else 1.0


def python_parses(source: str) -> bool:
    """Is this Python source syntactically valid? (compiled by `ast`, never run)."""
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: null bytes in the source
        return False
    return True


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from n samples of which `correct` pass (Chen et al., 2021).

    pass@k = 1 - C(n - c, k) / C(n, k)
    """
    if k > n:
        raise ValueError(f"k={k} exceeds the {n} samples")
    if n - correct < k:
        return 1.0
    return 1.0 - math.prod((n - correct - i) / (n - i) for i in range(k))


def decode_speedup(baseline_decode_s: float, method_decode_s: float) -> float | None:
    """How many times faster a method produced the same completion, decode phase only.

    Time ratio for the same output text rather than a tokens/s ratio: a speculative method may
    verify a few tokens past a stop point that plain decoding never computes.
    """
    if baseline_decode_s <= 0 or method_decode_s <= 0:
        return None
    return baseline_decode_s / method_decode_s


def geometric_mean(values: Sequence[float]) -> float | None:
    positive = [v for v in values if v and v > 0]
    if not positive:
        return None
    return math.exp(sum(math.log(v) for v in positive) / len(positive))


def median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def first_difference(a: str, b: str) -> int | None:
    """Index of the first character where two texts differ; None when they are equal.

    >>> first_difference("abcd", "abxd")
    2
    """
    if a == b:
        return None
    for i, (char_a, char_b) in enumerate(zip(a, b, strict=False)):
        if char_a != char_b:
            return i
    return min(len(a), len(b))
