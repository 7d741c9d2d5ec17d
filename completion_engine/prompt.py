"""Which part of the text before the cursor becomes the model's context.

The engine keeps the previous request's KV cache and prefills only what differs, so the context's
start must not move on every keystroke: both windows below start at a block-aligned position that
stays put while the cursor moves within a block.
"""

from __future__ import annotations

CHARS_PER_BLOCK = 4096
TOKENS_PER_STEP = 256


def prompt_window(prefix: str, max_chars: int, block: int = CHARS_PER_BLOCK) -> str:
    """The end of `prefix` to tokenise: from a line start after a block-aligned cut, about max_chars long.

    The cut falls at offset 4 (inside "cd"); the window starts at the next line:

    >>> prompt_window("ab\\ncd\\nef", max_chars=4, block=2)
    'ef'
    >>> prompt_window("ab\\ncd\\nef", max_chars=8, block=2)
    'ab\\ncd\\nef'
    """
    if len(prefix) <= max_chars:
        return prefix
    cut = (len(prefix) - max_chars) // block * block
    newline = prefix.find("\n", cut, cut + block)
    return prefix[newline + 1 if newline >= 0 else cut :]


def stable_tail(tokens: list[int], max_tokens: int, step: int = TOKENS_PER_STEP) -> list[int]:
    """At most max_tokens from the end, dropped from the front in whole steps so the start rarely moves.

    Two tokens too many: one whole step of 2 goes.

    >>> stable_tail([1, 2, 3, 4, 5, 6, 7], max_tokens=5, step=2)
    [3, 4, 5, 6, 7]
    >>> stable_tail([1, 2, 3, 4, 5, 6, 7], max_tokens=4, step=2)
    [5, 6, 7]
    """
    if len(tokens) <= max_tokens:
        return tokens
    drop = -(-(len(tokens) - max_tokens) // step) * step
    return tokens[drop:]
