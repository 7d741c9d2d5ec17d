"""SyntaxChecker: what of a streamed completion to show, when to stop generating it, and what to insert.

    checker = SyntaxChecker(prefix, suffix, detect_language("python", "foo.py"))
    for chunk in engine.stream(...):              # after each accepted chunk
        text += chunk.text
        if (n := checker.stop_at(text)) is not None:
            text = text[:n]; break                # stop: no more target forward passes
        show(checker.visible(text))
    insert(checker.finalize(text))

The constructor does the one-off work: one parse of prefix + suffix, the window around the cursor and the
bracket state at the cursor. Each later call scans only the completion and parses only the window, with
error counts cached per candidate text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from completion_engine.syntax.judges import BracketJudge, DocumentJudge, WindowJudge
from completion_engine.syntax.languages import SPECS, new_parser, spec_for
from completion_engine.syntax.lexer import CLOSERS, leading_closers, open_brackets, scan
from completion_engine.syntax.rules import Stop, cut_before, find_stop, make_cursor, pending_repeat, shape_of
from completion_engine.syntax.window import Window, build_window

_TOKEN = re.compile(r"\w+|\S")


@dataclass(frozen=True, slots=True)
class SyntaxConfig:
    min_repeat_chars: int = 6  # a repeat of the suffix must cover this many non-space chars of whole lines
    max_repeat_lines: int = 3  # ... or this many lines
    finalize_checks: int = 64  # window parses finalize may spend looking for a clean truncation
    document_checks: int = 4  # whole-document reparses finalize may spend confirming one
    verify_document: bool = True  # finalize confirms its answer on the whole document, not just the window
    fallback_scan_chars: int = 65_536  # no grammar: how much of the prefix and suffix the bracket scan reads


def truncation_points(text: str, language: str | None = None) -> list[int]:
    """Where finalize may cut `text`, longest first: line ends, line content starts, before closers, and
    token ends on the first line (so a one-line completion is not cut to nothing).

    >>> truncation_points("f(a, b))\\nx")
    [9, 8, 7, 6, 4, 3, 2, 1, 0]
    """
    lexicon = spec_for(language).lexicon
    points = {0}
    first_line_end = text.find("\n") if "\n" in text else len(text)
    points.update(m.end() for m in _TOKEN.finditer(text, 0, first_line_end))
    for m in re.finditer(r"\n([ \t]*)", text):
        points.update((m.start(), m.end()))
    points.update(offset for offset, char in scan(text, lexicon).events if char in CLOSERS)
    points.discard(len(text))
    return sorted(points, reverse=True)


class SyntaxChecker:
    """Syntax-aware stopping and truncation for one completion request at one cursor."""

    def __init__(
        self, prefix: str, suffix: str, language: str | None, config: SyntaxConfig | None = None
    ) -> None:
        self.language = language if language in SPECS else None
        self.spec = spec_for(self.language)
        self.config = config or SyntaxConfig()
        lexicon = self.spec.lexicon
        parser = new_parser(self.language)
        self._document: DocumentJudge | None = None
        self.window: Window | None = None  # what each check parses (None without a grammar)
        if parser is None:
            self.language = None
            scanned = _tail_lines(prefix, self.config.fallback_scan_chars)
            openers, mode = open_brackets(scanned, lexicon)
            closers = leading_closers(suffix[: self.config.fallback_scan_chars], lexicon, mode)
            self._judge: WindowJudge | BracketJudge = BracketJudge(lexicon, openers, mode, closers)
        else:
            before, after = prefix.encode(), suffix.encode()
            tree = parser.parse(before + after)
            self.window = build_window(tree, before + after, len(before), self.spec.containers)
            self._judge = WindowJudge(parser, self.window)
            if self.window.removed and self.config.verify_document:
                self._document = DocumentJudge(parser, tree, before, after)
            scanned = self.window.prefix.decode(errors="replace")
            openers, mode = open_brackets(scanned, lexicon)
        self.cursor = make_cursor(prefix, suffix, openers, scanned, mode)
        self._counts: dict[str, int] = {}
        self._shown = ""  # the last answer of visible()

    @property
    def baseline(self) -> int:
        """Errors in prefix + suffix alone (in the window), which no accepted text may exceed."""
        return self._judge.baseline

    def errors(self, text: str) -> int:
        """Errors in prefix + text + suffix (in the window), cached."""
        if text not in self._counts:
            self._counts[text] = self._judge(text)
        return self._counts[text]

    def stop(self, completion: str, final: bool = False) -> Stop | None:
        """The stop decision with its reason; `final` when the completion is over."""
        return find_stop(
            completion,
            self.cursor,
            self.spec,
            self.errors,
            self.baseline,
            final=final,
            min_repeat_chars=self.config.min_repeat_chars,
            max_repeat_lines=self.config.max_repeat_lines,
        )

    def stop_at(self, completion: str) -> int | None:
        """None: keep generating. n: stop now and keep completion[:n]."""
        stop = self.stop(completion)
        return None if stop is None else stop.at

    def visible(self, completion: str) -> str:
        """The part safe to show while streaming: whole lines that parse and do not look like the start of a
        repetition of the suffix (or, once a stop is known, everything up to it that parses)."""
        stop = self.stop(completion)
        text = completion if stop is None else completion[: stop.at]
        limit = len(text) if stop is not None else text.rfind("\n")
        hold = pending_repeat(text, self.cursor, self.spec)
        if hold is not None:
            limit = min(limit, hold)
        if limit <= 0:
            return ""
        # What was shown before stays shown while the text extends it: only newer line ends need a parse.
        floor = len(self._shown) if text[:limit].startswith(self._shown) else 0
        lines = shape_of(text, self.cursor, self.spec).lines
        # Line ends where the completion has no bracket of its own left open (else it cannot parse yet).
        ends = [
            ln.end for ln, nxt in zip(lines, lines[1:], strict=False) if nxt.depth == 0 and ln.end < limit
        ]
        self._shown = self._shown if floor else ""
        for end in sorted({limit, *ends}, reverse=True):
            shown = self._trim_end(text[:end])
            if len(shown) <= floor:
                break
            if self.errors(shown) <= self.baseline:
                self._shown = shown
                break
        return self._shown

    def finalize(self, completion: str) -> str:
        """The text to insert: stopped where the rules say, no new parse errors, no repeat of the suffix."""
        stop = self.stop(completion, final=True)
        text = self._trim_end(completion if stop is None else completion[: stop.at])
        checks = {"window": self.config.finalize_checks, "document": self.config.document_checks}
        if self._clean(text, checks):
            return text
        tried = {text}
        for point in truncation_points(text, self.language):
            candidate = self._trim_end(text[:point])
            if candidate in tried:
                continue
            tried.add(candidate)
            if not candidate or self._clean(candidate, checks):
                return candidate
            if checks["window"] <= 0 or checks["document"] <= 0:
                break
        return ""

    def _trim_end(self, text: str) -> str:
        return text[: cut_before(text, len(text), self.cursor)]

    def _clean(self, text: str, checks: dict[str, int]) -> bool:
        """No more errors than prefix + suffix: in the window, then (unless that is the file) in the file."""
        checks["window"] -= text not in self._counts
        if self.errors(text) > self.baseline:
            return False
        if self._document is None:
            return True
        checks["document"] -= 1
        return self._document(text) <= self._document.baseline


def _tail_lines(text: str, limit: int) -> str:
    """The last `limit` characters of text, from a line start."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    return tail[tail.find("\n") + 1 :]
