"""Where a completion ends and what of it is shown: the syntax module when it is there, else a fallback.

The fallback stops before a blank line or before a line indented less than the cursor's line: the
end of the block the cursor is in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from lsp_server.documents import CursorContext

logger = logging.getLogger(__name__)

SYNTAX_PREFIX_CHARS = 32_000
SYNTAX_SUFFIX_CHARS = 8_000


def _same(text: str) -> str:
    return text


@dataclass(frozen=True, slots=True)
class Shaper:
    """How one completion is cut and shown; `stop_at` is the engine's stop_check."""

    stop_at: Callable[[str], int | None] | None = None  # completion so far -> chars to keep, or None
    visible: Callable[[str], str] = _same  # what to stream of the completion so far
    finalize: Callable[[str], str] = _same  # the completion as answered
    source: str = "none"  # "syntax" | "fallback" | "none"


def indentation(line_prefix: str) -> int:
    """Columns of leading whitespace of the cursor's line (all of it when the line is blank so far)."""
    return len(line_prefix) - len(line_prefix.lstrip(" \t"))


def fallback_stop(completion: str, indent: int) -> int | None:
    """Chars to keep: up to the line break before a blank line or a line indented less than `indent`.

    The first line continues the cursor's line and is always kept. A last line that is still only
    whitespace is not judged yet.

    >>> fallback_stop("x = 1\\n\\ny = 2", 0)
    5
    >>> fallback_stop("a\\n    b\\nc", 4)
    7
    >>> fallback_stop("a\\n    b", 4) is None
    True
    """
    lines = completion.split("\n")
    kept = len(lines[0])
    for number, line in enumerate(lines[1:], start=1):
        complete = number < len(lines) - 1
        content = line.strip()
        if not content:
            if complete:
                return kept
        elif len(line) - len(line.lstrip(" \t")) < indent:
            return kept
        kept += 1 + len(line)
    return None


def fallback_shaper(cursor: CursorContext) -> Shaper:
    indent = indentation(cursor.line_prefix)

    def stop_at(completion: str) -> int | None:
        return fallback_stop(completion, indent)

    def finalize(completion: str) -> str:
        keep = stop_at(completion)
        return (completion if keep is None else completion[:keep]).rstrip()

    return Shaper(stop_at=stop_at, visible=_same, finalize=finalize, source="fallback")


def syntax_shaper(cursor: CursorContext, language_id: str, path: str) -> Shaper | None:
    """A Shaper from completion_engine.syntax (which has its own rules for unknown languages), or None.

    The checker parses the text around the cursor: at most SYNTAX_PREFIX_CHARS before it and
    SYNTAX_SUFFIX_CHARS after, from a line start, so a huge document costs no more than a big one.
    """
    try:
        from completion_engine.syntax import SyntaxChecker, detect_language
    except ImportError:
        return None
    prefix = cursor.prefix
    if len(prefix) > SYNTAX_PREFIX_CHARS:
        start = prefix.find("\n", len(prefix) - SYNTAX_PREFIX_CHARS)
        prefix = prefix[start + 1 :] if start >= 0 else prefix[-SYNTAX_PREFIX_CHARS:]
    try:
        checker = SyntaxChecker(
            prefix, cursor.suffix[:SYNTAX_SUFFIX_CHARS], detect_language(language_id, path)
        )
    except Exception:  # a bug there must not cost the completion: fall back
        logger.exception("the syntax checker failed for %s; using the fallback", path)
        return None
    return Shaper(
        stop_at=_guarded(checker.stop_at, lambda text: None),
        visible=_guarded(checker.visible, _same),
        finalize=_guarded(checker.finalize, _same),
        source="syntax",
    )


def _guarded(method: Callable, fallback: Callable) -> Callable:
    """The method, or the fallback's answer when the method raises (logged once per call site)."""

    def call(text: str):
        try:
            return method(text)
        except Exception:
            logger.exception(
                "the syntax checker's %s failed; ignoring it", getattr(method, "__name__", "method")
            )
            return fallback(text)

    return call


def shaper_for(cursor: CursorContext, language_id: str, path: str, syntax: bool) -> Shaper:
    """Syntax off: the raw completion (up to max tokens). On: the syntax module, else the fallback."""
    if not syntax:
        return Shaper()
    return syntax_shaper(cursor, language_id, path) or fallback_shaper(cursor)
