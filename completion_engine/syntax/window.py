"""A small stand-in for a large document: the document with far-away whole statements cut out.

Checking a completion means parsing prefix + completion + suffix. On a 5,000-line file a full parse costs
tens of milliseconds and even an incremental one a few, because error recovery after an unclosed bracket
ripples to the end of the file. So the checker parses a *window* instead: the document minus every complete,
error-free statement or member that is not next to the cursor, at every level of nesting. What stays is the
skeleton around the cursor (each enclosing header and its closing brace) and one neighbour on each side at
each level, so a completion parses in the window as it would in the file, at a cost that does not grow
with the file.

Only children of *container* nodes (module, block, class body, ...) are cut, and only whole lines of them, so
the window stays well-formed wherever the document was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tree_sitter import Node, Tree

_LINE_TAIL = re.compile(rb"[ \t]*[,;]?[ \t]*\r?(\n|$)")  # what may follow a cut child on its last line
_BLANK_LINES = re.compile(rb"([ \t]*\r?\n)*")


@dataclass(frozen=True, slots=True)
class Window:
    prefix: bytes  # the document before the cursor, far statements removed
    suffix: bytes  # the document after the cursor, far statements removed
    removed: int  # bytes cut out; 0 means the window is the whole document


def count_errors(node: Node) -> int:
    """ERROR and MISSING nodes in the subtree (descending only where tree-sitter flags an error)."""
    total, stack = 0, [node]
    while stack:
        current = stack.pop()
        total += current.is_error or current.is_missing
        if current.has_error:
            stack.extend(current.children)
    return total


def _line_span(node: Node, source: bytes, cursor: int) -> tuple[int, int] | None:
    """The whole lines `node` occupies (with the blank lines after it), or None if it shares a line with
    other code or holds the cursor."""
    line_start = source.rfind(b"\n", 0, node.start_byte) + 1
    if source[line_start : node.start_byte].strip():
        return None
    tail = _LINE_TAIL.match(source, node.end_byte)
    if tail is None:
        return None
    end = _BLANK_LINES.match(source, tail.end()).end()
    if line_start < cursor < end:
        end = tail.end()  # keep the blank lines up to the cursor's line
    return (line_start, end) if end <= cursor or line_start >= cursor else None


def _kept(children: list[Node], cursor: int) -> set[int]:
    """Indices of the children to keep: the one holding the cursor and the nearest real (non-comment)
    neighbour on each side, with any comments in between."""
    before = [i for i, c in enumerate(children) if c.end_byte <= cursor]
    after = [i for i, c in enumerate(children) if c.start_byte >= cursor and c.end_byte > cursor]
    kept = {i for i, c in enumerate(children) if c.start_byte < cursor < c.end_byte}
    for side in (reversed(before), after):
        for i in side:
            kept.add(i)
            if not children[i].is_extra:
                break
    return kept


def _cuts(
    node: Node, source: bytes, cursor: int, containers: frozenset[str], out: list[tuple[int, int]]
) -> None:
    children = node.named_children
    kept = _kept(children, cursor) if node.type in containers else set(range(len(children)))
    for i, child in enumerate(children):
        span = None if i in kept or child.has_error else _line_span(child, source, cursor)
        if span is not None:
            out.append(span)
        elif child.end_point.row > child.start_point.row:  # only multi-line nodes can hold removable lines
            _cuts(child, source, cursor, containers, out)


def _without(source: bytes, cuts: list[tuple[int, int]], lo: int, hi: int) -> bytes:
    """source[lo:hi] minus the (sorted, disjoint) cuts that lie inside it."""
    pieces, at = [], lo
    for start, end in cuts:
        if lo <= start and end <= hi:
            pieces.append(source[at:start])
            at = end
    pieces.append(source[at:hi])
    return b"".join(pieces)


def build_window(tree: Tree, source: bytes, cursor: int, containers: frozenset[str]) -> Window:
    """The window around byte offset `cursor` of `source`, which `tree` is the parse of."""
    found: list[tuple[int, int]] = []
    _cuts(tree.root_node, source, cursor, containers, found)
    cuts: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if not cuts or start >= cuts[-1][1]:
            cuts.append((start, end))
    return Window(
        prefix=_without(source, cuts, 0, cursor),
        suffix=_without(source, cuts, cursor, len(source)),
        removed=sum(end - start for start, end in cuts),
    )
