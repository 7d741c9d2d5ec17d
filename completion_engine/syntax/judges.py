"""Counting the errors of prefix + text + suffix, where text is a candidate completion inserted at the cursor.

    WindowJudge    tree-sitter, on the small window around the cursor (window.py): the per-check judge
    DocumentJudge  tree-sitter, on the whole document, reparsed incrementally: finalize's last word
    BracketJudge   no grammar: bracket and string faults seen from the cursor (lexer.py)

Each has a `baseline`: its count for prefix + suffix alone, which a completion must not exceed.
"""

from __future__ import annotations

from tree_sitter import Parser, Point, Tree

from completion_engine.syntax.languages import Lexicon
from completion_engine.syntax.lexer import Opener, bracket_errors
from completion_engine.syntax.window import Window, count_errors


class WindowJudge:
    def __init__(self, parser: Parser, window: Window) -> None:
        self._parser, self._window = parser, window
        self.baseline = self("")

    def __call__(self, text: str) -> int:
        source = self._window.prefix + text.encode() + self._window.suffix
        return count_errors(self._parser.parse(source).root_node)


def _end_point(start: Point, inserted: bytes) -> Point:
    lines = inserted.count(b"\n")
    if not lines:
        return Point(start.row, start.column + len(inserted))
    return Point(start.row + lines, len(inserted) - inserted.rfind(b"\n") - 1)


class DocumentJudge:
    def __init__(self, parser: Parser, tree: Tree, prefix: bytes, suffix: bytes) -> None:
        self._parser, self._tree, self._prefix, self._suffix = parser, tree, prefix, suffix
        row = prefix.count(b"\n")
        self._cursor = Point(row, len(prefix) - prefix.rfind(b"\n") - 1)
        self.baseline = count_errors(tree.root_node)

    def __call__(self, text: str) -> int:
        inserted = text.encode()
        if not inserted:
            return self.baseline
        edited = self._tree.copy()
        at = len(self._prefix)
        edited.edit(
            start_byte=at,
            old_end_byte=at,
            new_end_byte=at + len(inserted),
            start_point=self._cursor,
            old_end_point=self._cursor,
            new_end_point=_end_point(self._cursor, inserted),
        )
        tree = self._parser.parse(self._prefix + inserted + self._suffix, edited)
        return count_errors(tree.root_node)


class BracketJudge:
    def __init__(self, lexicon: Lexicon, openers: list[Opener], mode: str | None, closers: str) -> None:
        self._lexicon, self._openers, self._mode, self._closers = lexicon, openers, mode, closers
        self.baseline = self("")

    def __call__(self, text: str) -> int:
        return bracket_errors(self._openers, text, self._lexicon, self._mode, self._closers)
