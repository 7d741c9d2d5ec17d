"""Where a completion ends and what of it is shown: one policy for the CLI, the server and eval.

A stop check maps the completion so far to None (go on) or the number of characters to keep. It
must give the same cut however the text arrives (token by token, or a verified block at a time),
otherwise plain and speculative decoding would end the same token stream at different places.
Each check below decides at the earliest character that settles it, so it does.

The policy: the syntax module's checker, and the scope stop (a line indented less than the block
the cursor is in ends the completion), whichever cuts first. Without the syntax module (tree-sitter
missing) a fallback stops before a blank line or a dedent. When code follows the cursor on its line
(the cursor at a statement start, after the indentation), the final text ends with a line break and
the indentation, so that code moves down to its own line. For Python, CPython's parser checks the
final text last (python_guard).
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

StopAt = Callable[[str], "int | None"]

SYNTAX_PREFIX_CHARS = 32_000
SYNTAX_SUFFIX_CHARS = 8_000
PYTHON_GUARD_CHARS = 400_000


def _same(text: str) -> str:
    return text


@dataclass(frozen=True, slots=True)
class StopPolicy:
    """How one completion is cut and shown; `stop_at` is the engine's stop_check."""

    stop_at: StopAt | None = None  # completion so far -> chars to keep, or None
    visible: Callable[[str], str] = _same  # what to stream of the completion so far
    finalize: Callable[[str], str] = _same  # the completion as answered
    source: str = "none"  # "syntax+scope" | "fallback" | "none"


def indentation(line_prefix: str) -> int:
    """Columns of leading whitespace of the cursor's line (all of it when the line is blank so far)."""
    return len(line_prefix) - len(line_prefix.lstrip(" \t"))


def scope_indent(prefix: str) -> tuple[int, bool]:
    """(indentation below which the cursor's block has ended, whether the completion starts a line).

    The cursor's line decides; one that ends a block opener (`:`) opens a deeper block. On an empty
    line (cursor at column 0) the last non-blank line decides, and the completion's first line
    counts as a line of the block.

    >>> scope_indent("def f():\\n    x = 1\\n    ")
    (4, False)
    >>> scope_indent("def f(x):")
    (1, False)
    >>> scope_indent("def f():\\n    # the body\\n")
    (4, True)
    """
    line_prefix = prefix[prefix.rfind("\n") + 1 :]
    if line_prefix:
        return indentation(line_prefix) + line_prefix.rstrip().endswith(":"), False
    previous = next((line for line in reversed(prefix.split("\n")) if line.strip()), "")
    return indentation(previous) + previous.rstrip().endswith(":"), True


def dedent_stop(text: str, min_indent: int, at_line_start: bool = False) -> int | None:
    """Cut before the first line that starts with code indented less than min_indent: the block ended.

    at_line_start: the completion begins a new line, so its first line counts too; otherwise the
    first line is the rest of the cursor's line and only later lines can end the block. Blank lines
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


def earliest(*checks: StopAt) -> StopAt:
    """A stop check that stops at the earliest cut any of `checks` asks for.

    >>> earliest(lambda t: None, lambda t: 5, lambda t: 3)("abcdefg")
    3
    """

    def stop_at(text: str) -> int | None:
        cuts = [cut for cut in (check(text) for check in checks) if cut is not None]
        return min(cuts) if cuts else None

    return stop_at


def line_break_before_code(prefix: str, suffix: str) -> str:
    """What a completion must end with when code follows the cursor on its line: a line break and the
    cursor's indentation, so that the code moves down intact ("" when nothing follows).

    >>> line_break_before_code("def f():\\n    ", "return 1\\n"), line_break_before_code("x = ", "1")
    ('\\n    ', '')
    """
    line_prefix = prefix[prefix.rfind("\n") + 1 :]
    rest_of_line = suffix.split("\n", 1)[0]
    if line_prefix.strip() or not rest_of_line.strip():
        return ""
    return "\n" + line_prefix


def end_before_code(completion: str, joiner: str) -> str:
    """The completion ended by `joiner` (see line_break_before_code); a blank one becomes empty.

    A last line that opens a block (ends with ":") is dropped: the code that follows at the cursor's
    indentation could not be its body.

    >>> end_before_code("x = 1\\n  ", "\\n    "), end_before_code("  ", "\\n    ")
    ('x = 1\\n    ', '')
    >>> end_before_code("x = 1\\n    if x:", "\\n    "), end_before_code("if x:", "\\n    ")
    ('x = 1\\n    ', '')
    """
    if not joiner:
        return completion
    lines = completion.rstrip().split("\n")
    while lines and lines[-1].rstrip().endswith(":"):
        lines.pop()
    kept = "\n".join(lines).rstrip()
    return kept + joiner if kept.strip() else ""


def is_python(language_id: str, path: str) -> bool:
    return language_id.lower() == "python" or path.endswith((".py", ".pyi"))


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


def python_guard(prefix: str, suffix: str, completion: str, joiner: str = "") -> str:
    """Python's own parser has the last word (tree-sitter forgives what CPython does not: a block
    opener with no indented body, a nested `def` whose body is not indented). If the file parses
    without the completion but not with it, drop whole lines from the end until it parses again.

    >>> python_guard("def f():\\n    ", "return 1\\n", "if x:\\n    ", "\\n    ")
    ''
    >>> python_guard("def f():\\n    ", "return 1\\n", "y = 2\\n    if y:\\n    ", "\\n    ")
    'y = 2\\n    '
    """
    if len(prefix) + len(suffix) > PYTHON_GUARD_CHARS:  # a few ms per parse below this size
        return completion
    if not completion or _parses(prefix + completion + suffix) or not _parses(prefix + suffix):
        return completion
    lines = completion.rstrip().split("\n")
    for keep in range(len(lines) - 1, 0, -1):
        kept = "\n".join(lines[:keep])
        candidate = end_before_code(kept, joiner) if joiner else kept.rstrip()
        if candidate.strip() and _parses(prefix + candidate + suffix):
            return candidate
    return ""


def fallback_policy(prefix: str, suffix: str = "") -> StopPolicy:
    indent, _ = scope_indent(prefix)
    joiner = line_break_before_code(prefix, suffix)

    def stop_at(completion: str) -> int | None:
        return fallback_stop(completion, indent)

    def finalize(completion: str) -> str:
        keep = stop_at(completion)
        return end_before_code((completion if keep is None else completion[:keep]).rstrip(), joiner)

    return StopPolicy(stop_at=stop_at, visible=_same, finalize=finalize, source="fallback")


def syntax_policy(prefix: str, suffix: str, language_id: str, path: str) -> StopPolicy | None:
    """The syntax module's checker with the scope stop, or None when the module is absent or fails.

    The checker parses the text around the cursor: at most SYNTAX_PREFIX_CHARS before it and
    SYNTAX_SUFFIX_CHARS after, from a line start, so a huge document costs no more than a big one.
    """
    try:
        from completion_engine.syntax import SyntaxChecker, detect_language
    except ImportError:
        return None
    window = prefix
    if len(window) > SYNTAX_PREFIX_CHARS:
        start = window.find("\n", len(window) - SYNTAX_PREFIX_CHARS)
        window = window[start + 1 :] if start >= 0 else window[-SYNTAX_PREFIX_CHARS:]
    try:
        checker = SyntaxChecker(window, suffix[:SYNTAX_SUFFIX_CHARS], detect_language(language_id, path))
    except Exception:  # a bug there must not cost the completion: fall back
        logger.exception("the syntax checker failed for %s; using the fallback", path)
        return None
    indent, at_line_start = scope_indent(prefix)
    joiner = line_break_before_code(prefix, suffix)
    checked_finalize = _guarded(checker.finalize, _same)
    python = is_python(language_id, path)

    def scope(text: str) -> int | None:
        return dedent_stop(text, indent, at_line_start)

    def finalize(text: str) -> str:
        # with code after the cursor on its line, a completion ends with a line break first
        final = checked_finalize(end_before_code(text, joiner))
        return python_guard(prefix, suffix, final, joiner) if python else final

    return StopPolicy(
        stop_at=earliest(_guarded(checker.stop_at, lambda text: None), scope),
        visible=_guarded(checker.visible, _same),
        finalize=finalize,
        source="syntax+scope",
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


def stop_policy(prefix: str, suffix: str, language_id: str, path: str, syntax: bool) -> StopPolicy:
    """Syntax off: the raw completion (up to max tokens). On: syntax and scope, else the fallback."""
    if not syntax:
        return StopPolicy()
    policy = syntax_policy(prefix, suffix, language_id, path)
    if policy is not None:
        return policy
    fallback = fallback_policy(prefix, suffix)
    if not is_python(language_id, path):
        return fallback
    joiner = line_break_before_code(prefix, suffix)

    def finalize(text: str) -> str:
        return python_guard(prefix, suffix, fallback.finalize(text), joiner)

    return StopPolicy(fallback.stop_at, fallback.visible, finalize, fallback.source)


LINE_MODES = ("single", "multi", "auto")
# a line ending in one of these opens a block, where "auto" goes multi-line
BLOCK_OPENERS = (":", "{", "(", "[", "=>")


def line_limit(mode: str, max_lines: int, prefix: str, suffix: str) -> int:
    """How many lines a completion at this cursor may have (0: no limit).

    "auto" is multi-line where a block is being written: at an empty line, or after a block opener;
    elsewhere it finishes the current line only.

    >>> line_limit("auto", 0, "if x:\\n    ", "\\n"), line_limit("auto", 5, "def f(", ")")
    (0, 5)
    >>> line_limit("auto", 5, "x = f", "")
    1
    """
    if mode == "single":
        return 1
    line_before = prefix[prefix.rfind("\n") + 1 :]
    line_after = suffix.split("\n", 1)[0]
    at_opener = line_before.rstrip().endswith(BLOCK_OPENERS)
    if mode == "auto" and (line_before + line_after).strip() and not at_opener:
        return 1
    return max_lines


def cut_at_line(max_lines: int) -> StopAt:
    """A stop check keeping the first `max_lines` lines (the line break ending the last one is cut).

    It depends only on the text, so it cuts in the same place however the text arrives.

    >>> cut_at_line(2)("a\\nb\\nc"), cut_at_line(1)("abc")
    (3, None)
    """

    def stop_at(text: str) -> int | None:
        end = -1
        for _ in range(max_lines):
            end = text.find("\n", end + 1)
            if end < 0:
                return None
        return end

    return stop_at


def limit_lines(policy: StopPolicy, max_lines: int) -> StopPolicy:
    """The policy, also stopping after `max_lines` lines (0: unchanged)."""
    if max_lines <= 0:
        return policy
    limit = cut_at_line(max_lines)
    stop_at = limit if policy.stop_at is None else earliest(policy.stop_at, limit)
    return StopPolicy(stop_at, policy.visible, policy.finalize, policy.source)


def policy_description() -> str:
    """How completions end, for eval reports."""
    try:
        from completion_engine.syntax import SyntaxChecker  # noqa: F401
    except ImportError:
        return "blank line or dedent (fallback; no syntax module)"
    return "the syntax module, and a dedent below the cursor's block"
