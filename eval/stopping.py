"""Where a completion ends: by scope, and by syntax when the syntax module is there.

A stop check maps the completion so far to None (go on) or the number of characters to keep. It
must give the same cut however the text arrives (token by token, or a verified block at a time),
otherwise plain and speculative decoding would end the same token stream at different places.
Each heuristic below decides at the earliest character that settles it, so it does.

- Body completions (the cursor ends the line before a function body) stop by scope: at the first
  line indented less than the body, where the function has ended. With the syntax module the
  earlier of its stop and the scope stop wins.
- Statement completions stop by the syntax module, or without it at the statement's end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

StopAt = Callable[[str], "int | None"]

BRACKETS = {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}


def dedent_stop(text: str, min_indent: int, at_line_start: bool = False) -> int | None:
    """Cut before the first line that starts with code indented less than min_indent: the body ended.

    at_line_start: the completion begins a new line, so its first line counts too; otherwise the
    first line is the rest of the cursor's line and only later lines can end the body. Blank lines
    never decide; a line decides at its first non-blank character. The cut drops the line break
    before the dedented line.

    >>> dedent_stop("\\n    return x\\n\\ndef g():", 4)  # keeps "\\n    return x\\n"
    14
    """
    start = 0 if at_line_start else text.find("\n") + 1
    while at_line_start or start > 0:
        at_line_start = False
        end = text.find("\n", start)
        line = text[start:] if end < 0 else text[start:end]
        stripped = line.lstrip(" \t")
        if stripped and len(line) - len(stripped) < min_indent:
            return max(start - 1, 0)
        if end < 0:
            return None
        start = end + 1
    return None


def statement_end_stop(text: str) -> int | None:
    """Cut at the first line break outside brackets opened by the completion: the statement ended.

    A bracket the completion closes without opening was open in the prefix (the cursor sat inside
    it); closing it lowers the depth below zero, which still counts as outside. Strings are not
    parsed: a bracket inside a string literal counts as well (a heuristic).

    >>> statement_end_stop("foo(a,\\n    b)\\nx = 1")
    13
    """
    depth = 0
    for index, char in enumerate(text):
        if char == "\n":
            if depth <= 0 and text[:index].strip():
                return index
        else:
            depth += BRACKETS.get(char, 0)
    return None


def earliest(*checks: StopAt) -> StopAt:
    """A stop check that stops at the earliest cut any of `checks` asks for."""

    def stop_at(text: str) -> int | None:
        cuts = [cut for cut in (check(text) for check in checks) if cut is not None]
        return min(cuts) if cuts else None

    return stop_at


@dataclass(frozen=True, slots=True)
class Stopper:
    """The stop check of one case and the clean-up of its final text."""

    stop_at: StopAt
    finalize: Callable[[str], str]
    kind: str  # what decides the stop: "syntax+scope" | "syntax" | "scope" | "statement end"


def heuristic_stopper(mode: str, min_indent: int = 0) -> Stopper:
    """mode "body": stop by scope (a dedent below min_indent); "statement": at the statement's end."""
    if mode == "body":
        return Stopper(lambda text: dedent_stop(text, min_indent), _rstrip, "scope")
    if mode == "statement":
        return Stopper(statement_end_stop, _rstrip, "statement end")
    raise ValueError(f"unknown stop mode {mode!r}")


def make_stopper(prefix: str, suffix: str, language: str, mode: str, min_indent: int = 0) -> Stopper:
    """The syntax module's checker (with the scope stop for bodies); without it, the heuristics."""
    try:
        from completion_engine.syntax import SyntaxChecker
    except ImportError:
        return heuristic_stopper(mode, min_indent)
    checker = SyntaxChecker(prefix, suffix, language)
    if mode == "body":
        scope = heuristic_stopper(mode, min_indent).stop_at
        return Stopper(earliest(checker.stop_at, scope), checker.finalize, "syntax+scope")
    return Stopper(checker.stop_at, checker.finalize, "syntax")


def syntax_module_available() -> bool:
    try:
        from completion_engine.syntax import SyntaxChecker  # noqa: F401
    except ImportError:
        return False
    return True


def stopper_description() -> str:
    """How completions of this run end, for the report."""
    if syntax_module_available():
        return "the syntax module, and by scope for bodies"
    return "scope for bodies, statement end for statements (heuristics; no syntax module)"


def _rstrip(text: str) -> str:
    return text.rstrip()
