"""A bracket scanner that skips strings and comments: where brackets open and close, and where lines start.

It is deliberately approximate (no regex literals, no string interpolation): the parser is the judge of
errors; this only tells the stop rules how deep the completion is and which lines start in code.

A scan resumes in a *mode*: None in code, else the delimiter the text is inside ('"', '\"\"\"', '/*', '//').
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from completion_engine.syntax.languages import Lexicon

OPENERS = "([{"
CLOSERS = ")]}"
MATCHING = {")": "(", "]": "[", "}": "{"}
LINE_IN_CODE = "\n"  # event: a newline after which the next line starts in code
LINE_IN_TEXT = "\v"  # event: a newline inside a string or block comment

Event = tuple[int, str]  # (offset, a bracket or one of the two line events)


@dataclass(frozen=True, slots=True)
class Opener:
    char: str  # "(", "[" or "{"
    offset: int  # where it is in the scanned text


@dataclass(frozen=True, slots=True)
class Scan:
    events: list[Event]
    mode: str | None  # where the text ends: None in code, else the open delimiter


@cache
def _token_pattern(lexicon: Lexicon, newlines: bool) -> re.Pattern[str]:
    starts = [*lexicon.line_comments, *lexicon.quotes]
    if lexicon.block_comment:
        starts.insert(0, lexicon.block_comment[0])
    alternatives = [re.escape(s) for s in sorted(starts, key=len, reverse=True)] + [r"[()\[\]{}]"]
    if newlines:
        alternatives.append(r"\n")
    return re.compile("|".join(alternatives))


@cache
def _string_end(quote: str, multiline: bool) -> re.Pattern[str]:
    # Lazily consume escapes and other characters up to the closing quote (or, for one-line strings,
    # up to the newline that ends an unterminated one).
    body = r"(?:\\.|[^\\])*?" if multiline else r"(?:\\.|[^\\\n])*?"
    end = re.escape(quote) if multiline else rf"(?:{re.escape(quote)}|(?=\n))"
    return re.compile(body + end, re.DOTALL)


_CHAR_LITERAL = re.compile(r"'(?:\\[^']{1,10}|[^\\'\n])'")


def _text_newlines(text: str, start: int, end: int, events: list[Event]) -> None:
    at = text.find("\n", start, end)
    while at != -1:
        events.append((at, LINE_IN_TEXT))
        at = text.find("\n", at + 1, end)


def _skip(text: str, pos: int, mode: str, lexicon: Lexicon, newlines: bool, events: list[Event]) -> int:
    """From `pos` inside `mode`, the offset just past its end, or -1 if the text ends inside it."""
    if mode in lexicon.line_comments:
        end = text.find("\n", pos)
        return end  # the newline itself is scanned as code
    if lexicon.block_comment and mode == lexicon.block_comment[0]:
        close = lexicon.block_comment[1]
        end = text.find(close, pos)
        if newlines:
            _text_newlines(text, pos, len(text) if end == -1 else end, events)
        return -1 if end == -1 else end + len(close)
    multiline = mode in lexicon.multiline_quotes
    found = _string_end(mode, multiline).match(text, pos)
    if found is None:  # unterminated at the end of the text
        if newlines and multiline:
            _text_newlines(text, pos, len(text), events)
        return -1
    if newlines and multiline:
        _text_newlines(text, pos, found.end(), events)
    return found.end()


def scan(text: str, lexicon: Lexicon, mode: str | None = None, newlines: bool = False) -> Scan:
    """Brackets outside strings and comments (and, if asked, line events), starting in `mode`.

    >>> from completion_engine.syntax.languages import SPECS
    >>> scan('f("(", [x]) # (', SPECS["python"].lexicon).events
    [(1, '('), (7, '['), (9, ']'), (10, ')')]
    """
    pattern = _token_pattern(lexicon, newlines)
    events: list[Event] = []
    pos = 0
    if mode is not None:
        pos = _skip(text, 0, mode, lexicon, newlines, events)
        if pos == -1:
            return Scan(events, mode)
    while (found := pattern.search(text, pos)) is not None:
        token, start, pos = found.group(), found.start(), found.end()
        if token in OPENERS or token in CLOSERS:
            events.append((start, token))
        elif token == "\n":
            events.append((start, LINE_IN_CODE))
        elif lexicon.char_quote and token == "'":
            literal = _CHAR_LITERAL.match(text, start)
            pos = literal.end() if literal else pos
        else:
            pos = _skip(text, pos, token, lexicon, newlines, events)
            if pos == -1:
                return Scan(events, token)
    return Scan(events, None)


def open_brackets(text: str, lexicon: Lexicon) -> tuple[list[Opener], str | None]:
    """Brackets still open at the end of `text`, outermost first, and the mode it ends in.

    A closer that matches nothing is ignored: the text is the document's prefix, which may start mid-file.
    """
    result = scan(text, lexicon)
    stack: list[Opener] = []
    for offset, char in result.events:
        if char in OPENERS:
            stack.append(Opener(char, offset))
        elif stack:
            stack.pop()
    return stack, result.mode


def leading_closers(text: str, lexicon: Lexicon, mode: str | None) -> str:
    """The closers at the start of `text` (the suffix) that match nothing inside it, in order.

    >>> from completion_engine.syntax.languages import SPECS
    >>> leading_closers("x)]\\n(y)}", SPECS["python"].lexicon, None)
    ')]}'
    """
    depth, closers = 0, []
    for _, char in scan(text, lexicon, mode).events:
        if char in OPENERS:
            depth += 1
        elif depth:
            depth -= 1
        else:
            closers.append(char)
    return "".join(closers)


def bracket_errors(openers: list[Opener], text: str, lexicon: Lexicon, mode: str | None, closers: str) -> int:
    """Bracket faults in prefix + text + suffix, seen from the cursor: mismatched closers in `text`, then the
    brackets left open against the suffix's leading `closers`. Also 1 if `text` ends in a string or comment
    that it did not start in. The fallback error measure for languages without a grammar.

    >>> from completion_engine.syntax.languages import FALLBACK
    >>> bracket_errors([Opener("(", 0)], "a, [b", FALLBACK.lexicon, None, ")")  # "[" open, ")" meets "["
    2
    """
    stack = [o.char for o in openers]
    faults = 0
    result = scan(text, lexicon, mode)
    for _, char in result.events:
        if char in OPENERS:
            stack.append(char)
        elif not stack or stack.pop() != MATCHING[char]:
            faults += 1
    faults += abs(len(stack) - len(closers))
    faults += sum(MATCHING[c] != o for o, c in zip(reversed(stack), closers, strict=False))
    ends_in_comment = mode is None and result.mode in lexicon.line_comments  # the suffix's newline ends it
    if result.mode != mode and not ends_in_comment:
        faults += 1
    return faults
