"""When to stop a streamed completion: pure functions of the cursor context and the completion so far.

Glossary:
    line mode   the cursor sits after code on its line, and the completion continues that statement
    block mode  the cursor is at the start of a line (or the completion begins with a newline): the completion
                adds statements to the block the cursor is in
    cut         an offset n into the completion: keep completion[:n]
    checked     a cut taken only if prefix + completion[:n] + suffix parses no worse than prefix + suffix

Rules, each proposing cuts (the earliest acceptable one wins):
    statement   line mode: the first newline after a complete statement ends the completion (checked)
    scope       a closer that closes a bracket opened before the cursor's line: the completion left its scope
    block       a line less indented than the block (line mode: not more indented than the cursor's statement)
    definition  a second definition starts at the completion's level (at top level: after any code)
    repeat      the completion starts reproducing the code after the cursor (checked)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from completion_engine.syntax.languages import LanguageSpec
from completion_engine.syntax.lexer import CLOSERS, LINE_IN_CODE, OPENERS, Opener, scan

_CONTINUES = tuple(",+-*/%=&|<>.?:\\^~!([{")  # a line ending in one of these goes on below


@dataclass(frozen=True, slots=True)
class Cursor:
    """What the rules need to know about the document around the cursor."""

    line_prefix: str  # the cursor's line, up to the cursor
    line_suffix: str  # the cursor's line, after the cursor
    openers: tuple[tuple[str, bool], ...]  # open at the cursor, outermost first: (char, on the cursor's line)
    mode: str | None  # the string/comment delimiter the cursor is inside; None in code
    suffix_head: tuple[str, ...]  # the first non-blank lines after the cursor, stripped (line_suffix first)
    suffix_lead: str  # the whitespace the suffix starts with
    at_end: bool  # nothing but whitespace after the cursor

    @property
    def at_line_start(self) -> bool:
        return not self.line_prefix.strip()

    @property
    def first_suffix_char(self) -> str:
        return self.suffix_head[0][0] if self.suffix_head else ""


def make_cursor(prefix: str, suffix: str, openers: list[Opener], scanned: str, mode: str | None) -> Cursor:
    """`openers` and `mode` come from scanning `scanned`, a text that ends like `prefix` (same last line)."""
    line_start = scanned.rfind("\n") + 1
    head_text = suffix[:8192]
    rest_of_line, _, below = head_text.partition("\n")
    head = [rest_of_line.strip()] if rest_of_line.strip() else []
    head += [line.strip() for line in below.split("\n")[:64] if line.strip()][:8]
    return Cursor(
        line_prefix=prefix[prefix.rfind("\n") + 1 :],
        line_suffix=rest_of_line,
        openers=tuple((o.char, o.offset >= line_start) for o in openers),
        mode=mode,
        suffix_head=tuple(head),
        suffix_lead=suffix[: len(suffix) - len(suffix.lstrip())],
        at_end=not suffix.strip(),
    )


@dataclass(frozen=True, slots=True)
class Line:
    start: int  # offset of the line in the completion (line 0 starts at the cursor, mid-line)
    end: int  # offset of its newline, or len(completion) for the last line
    in_code: bool  # starts outside strings and comments
    depth: int  # brackets open at the line start that the completion or the cursor's line opened


@dataclass(frozen=True, slots=True)
class Shape:
    lines: list[Line]
    exit_at: int | None  # the first closer that closes a bracket opened before the cursor's line


@dataclass(frozen=True, slots=True)
class Stop:
    at: int  # keep completion[:at]
    reason: str  # "statement" | "scope" | "block" | "definition" | "repeat"
    checked: bool  # take it only if the cut parses no worse than prefix + suffix


def shape_of(completion: str, cursor: Cursor, spec: LanguageSpec) -> Shape:
    """The completion's lines with their bracket depth, and where (if at all) it leaves the cursor's scope."""
    outer = list(cursor.openers)  # brackets open at the cursor; those on its line are innermost
    own, on_line = 0, sum(on_cursor_line for _, on_cursor_line in outer)
    exit_at = None
    lines: list[Line] = []
    start, in_code, line_depth = 0, cursor.mode is None, on_line
    for offset, char in scan(completion, spec.lexicon, cursor.mode, newlines=True).events:
        if char in OPENERS:
            own += 1
        elif char in CLOSERS:
            if own:
                own -= 1
            elif on_line:  # closes a bracket of the cursor's statement: still that statement
                outer.pop()
                on_line -= 1
            else:  # closes a bracket from an earlier line, or nothing at all: the completion left its scope
                if outer:
                    outer.pop()
                exit_at = offset if exit_at is None else exit_at
        else:
            lines.append(Line(start, offset, in_code, line_depth))
            start, in_code, line_depth = offset + 1, char == LINE_IN_CODE, own + on_line
    lines.append(Line(start, len(completion), in_code, line_depth))
    return Shape(lines, exit_at)


def indent_width(whitespace: str) -> int:
    return len(whitespace.expandtabs(4))


def join_gap(gap: str, cursor: Cursor) -> str:
    """How much of `gap`, the whitespace before a cut, to keep so the suffix still lines up.

    >>> c = make_cursor("def f():\\n    ", "\\n\\ndef g(): pass\\n", [], "", None)
    >>> code_follows = make_cursor("def f():\\n    ", "return 1\\n", [], "", None)
    >>> join_gap("\\n\\n", c), join_gap("\\n    ", code_follows)
    ('', '\\n    ')
    """
    if cursor.at_end and "\n" not in cursor.suffix_lead:  # end of file: one line break ends the text
        return gap[: gap.find("\n") + 1]
    if gap.endswith(cursor.suffix_lead):
        return gap[: len(gap) - len(cursor.suffix_lead)]
    if "\n" in cursor.suffix_lead or "\n" not in gap:
        return ""
    return gap[: gap.rindex("\n") + 1]


def cut_before(completion: str, pos: int, cursor: Cursor) -> int:
    """The cut that drops completion[pos:] and the whitespace before it that the suffix does not need.

    When code follows the cursor on its line and the kept text spans lines, the kept text must end with a
    newline and the cursor's indentation, so that code stays on a line of its own.
    """
    end = len(completion[:pos].rstrip())
    if cursor.at_line_start and cursor.line_suffix.strip() and "\n" in completion[:end]:
        found = completion.rfind("\n" + cursor.line_prefix, 0, pos)
        if found != -1:
            return found + 1 + len(cursor.line_prefix)
    return end + len(join_gap(completion[end:pos], cursor))


class _View:
    """The completion, its lines and the cursor, with the per-line questions the rules ask."""

    def __init__(self, completion: str, cursor: Cursor, spec: LanguageSpec, shape: Shape) -> None:
        self.completion, self.cursor, self.spec = completion, cursor, spec
        self.lines, self.exit_at = shape.lines, shape.exit_at
        first = self.text(0)
        self.line_mode = not cursor.at_line_start and bool(first.strip())
        self.first_content = next((k for k in range(len(self.lines)) if self.text(k).strip()), None)

    def text(self, k: int) -> str:
        line = self.lines[k]
        return self.completion[line.start : line.end]

    def complete(self, k: int) -> bool:
        return self.lines[k].end < len(self.completion)

    def content_start(self, k: int) -> int:
        text = self.text(k)
        return self.lines[k].start + len(text) - len(text.lstrip())

    def indent(self, k: int) -> int:
        """Indentation width of line k; line 0 sits on the cursor's line."""
        text = self.text(k)
        leading = text[: len(text) - len(text.lstrip())]
        if k == 0:
            line_prefix = self.cursor.line_prefix
            own = line_prefix[: len(line_prefix) - len(line_prefix.lstrip())]
            leading = line_prefix + leading if self.cursor.at_line_start else own
        return indent_width(leading)

    def decided(self, k: int, final: bool) -> bool:
        """Whether line k shows enough to judge by its first word: it is complete, or that word is."""
        text = self.text(k)
        return final or self.complete(k) or " " in text.strip() or text.endswith(" ")

    def later_code_lines(self) -> list[int]:
        """Non-blank lines after the first content line that start in code, outside any bracket it opened."""
        first = 0 if self.line_mode else self.first_content
        if first is None:
            return []
        return [
            k
            for k in range(first + 1, len(self.lines))
            if self.lines[k].in_code and self.lines[k].depth == 0 and self.text(k).strip()
        ]

    def attached_run_start(self, k: int) -> int:
        """The first line of the decorators / attributes / comments directly above line k."""
        indent, attached = self.indent(k), self.spec.attached_start
        while k > 0 and self.text(k - 1).strip().startswith(attached) and self.indent(k - 1) == indent:
            k -= 1
        return k


def _statement_end(view: _View) -> list[Stop]:
    if not view.line_mode or len(view.lines) < 2:
        return []
    first, second = view.lines[0], view.lines[1]
    if not second.in_code or second.depth or (view.exit_at is not None and view.exit_at < first.end):
        return []
    code = (view.cursor.line_prefix + view.text(0)).rstrip()
    in_comment = view.cursor.mode in view.spec.lexicon.line_comments
    if code.endswith(_CONTINUES) and not in_comment:
        return []
    return [Stop(cut_before(view.completion, first.end, view.cursor), "statement", checked=True)]


def _scope_exit(view: _View, judge: Callable[[str], int], final: bool) -> list[Stop]:
    if view.exit_at is None:
        return []
    completion, cursor = view.completion, view.cursor
    before = cut_before(completion, view.exit_at, cursor)
    if completion[view.exit_at] == cursor.first_suffix_char:  # the suffix closes it: the model repeats that
        return [Stop(before, "scope", checked=False)]
    line = next(k for k, ln in enumerate(view.lines) if ln.start <= view.exit_at <= ln.end)
    if not (final or view.complete(line)):
        return []  # wait for the rest of the closer's line
    after = cut_before(completion, view.lines[line].end, cursor)
    keep_closer = judge(completion[:after]) < judge(completion[:before])
    return [Stop(after if keep_closer else before, "scope", checked=False)]


def _dedent(view: _View, final: bool) -> list[Stop]:
    spec = view.spec
    if view.line_mode:
        limit = view.indent(0)
    elif view.first_content is not None:
        limit = view.indent(view.first_content)
    else:
        return []
    stops = []
    for k in view.later_code_lines():
        content = view.text(k).strip()
        # Python's dedent is decided by the first character; elsewhere the first word matters (else, label:).
        python_like = spec.indent_sensitive and not view.line_mode
        if content[0] in CLOSERS or not (python_like or view.decided(k, final)):
            continue
        if content.startswith(spec.comment_start):
            continue
        indent = view.indent(k)
        if view.line_mode:
            fires = indent < limit or (indent == limit and not spec.continuation_start.match(content))
        elif spec.indent_sensitive:
            fires = indent < limit
        else:  # brace languages: only a return to column 0 says the block is over
            fires = indent == 0 < limit and not (spec.dedent_exempt and spec.dedent_exempt.match(content))
        if fires:
            at = cut_before(view.completion, view.content_start(view.attached_run_start(k)), view.cursor)
            stop = Stop(at, "block", checked=view.line_mode and not spec.indent_sensitive)
            if not stop.checked:
                return [*stops, stop]
            stops.append(stop)
    return stops


def _new_definition(view: _View, final: bool) -> list[Stop]:
    """A definition after other code at the completion's own level: at top level after anything, deeper (a
    class body) only after another definition, so a completion writes one method, not a class of them."""
    first = 0 if view.line_mode else view.first_content
    if first is None or any(c in "([" for c, _ in view.cursor.openers):
        return []
    level, starts = view.indent(first), view.spec.definition_start
    first_text = ((view.cursor.line_prefix if view.line_mode else "") + view.text(first)).strip()
    if level != 0 and not (starts.match(first_text) or first_text.startswith(view.spec.attached_start)):
        return []
    for k in view.later_code_lines():
        if not view.decided(k, final):
            continue
        if view.indent(k) == level and starts.match(view.text(k).strip()):
            run = view.attached_run_start(k)
            if any(view.text(j).strip() for j in range(first, run)):
                at = cut_before(view.completion, view.content_start(run), view.cursor)
                return [Stop(at, "definition", checked=False)]
    return []


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _squeeze(text: str) -> str:
    return "".join(text.split())


def repeat_unit(head: tuple[str, ...], min_chars: int, max_lines: int) -> int:
    """How many suffix lines a repetition must cover: enough for `min_chars` non-space characters."""
    total = 0
    for n, line in enumerate(head[:max_lines], start=1):
        total += len(_squeeze(line))
        if total >= min_chars:
            return n
    return min(len(head), max_lines)


def _repeats(view: _View, min_chars: int, max_lines: int, final: bool) -> list[Stop]:
    completion, cursor = view.completion, view.cursor
    stops = []
    if cursor.line_suffix.strip():  # the completion's first line ends with the rest of the cursor's line
        target, first = _squeeze(cursor.line_suffix), view.text(0)
        visible = [i for i, ch in enumerate(first) if not ch.isspace()]
        if len(visible) >= len(target) and _squeeze(first).endswith(target):
            pos = view.lines[0].start + visible[len(visible) - len(target)]
            if not (pos > 0 and _is_word(completion[pos]) and _is_word(completion[pos - 1])):
                stops.append(Stop(cut_before(completion, pos, cursor), "repeat", checked=True))
    unit = repeat_unit(cursor.suffix_head, min_chars, max_lines)
    if not unit:
        return stops
    wanted = cursor.suffix_head[:unit]
    start = 1 if view.line_mode or view.first_content is None else view.first_content
    nonblank = [k for k in range(start, len(view.lines)) if view.text(k).strip()]
    for i, k in enumerate(nonblank):
        window = nonblank[i : i + unit]
        if len(window) < unit or not (final or view.complete(window[-1])):
            break
        if tuple(view.text(j).strip() for j in window) == wanted:
            stops.append(Stop(cut_before(completion, view.content_start(k), cursor), "repeat", checked=True))
    return stops


def pending_repeat(completion: str, cursor: Cursor, spec: LanguageSpec) -> int | None:
    """Where the completion's last lines start to look like the code after the cursor, not yet long enough to
    call it a repetition: text from there on should not be shown yet."""
    view = _View(completion, cursor, spec, shape_of(completion, cursor, spec))
    if not cursor.suffix_head:
        return None
    start = 1 if view.line_mode or view.first_content is None else view.first_content
    nonblank = [k for k in range(start, len(view.lines)) if view.text(k).strip()]
    head = cursor.suffix_head
    for i in range(max(0, len(nonblank) - len(head)), len(nonblank)):  # longer tails cannot match
        k = nonblank[i]
        tail = [view.text(j).strip() for j in nonblank[i:]]
        if view.complete(nonblank[-1]):
            matches = list(head[: len(tail)]) == tail
        else:  # the last line is still being written: it need only begin like its suffix line
            whole = tail[:-1]
            matches = len(head) > len(whole) and list(head[: len(whole)]) == whole
            matches = matches and head[len(whole)].startswith(tail[-1])
        if matches:
            return cut_before(completion, view.content_start(k), cursor)
    return None


def find_stop(
    completion: str,
    cursor: Cursor,
    spec: LanguageSpec,
    judge: Callable[[str], int],
    baseline: int,
    final: bool = False,
    min_repeat_chars: int = 6,
    max_repeat_lines: int = 3,
) -> Stop | None:
    """The earliest acceptable stop in the completion so far, or None to keep generating.

    `judge(text)` counts parse errors in prefix + text + suffix; `baseline` is the count for prefix + suffix.
    `final`: the completion is over, so its last line counts as complete.
    """
    view = _View(completion, cursor, spec, shape_of(completion, cursor, spec))
    stops = [
        *_statement_end(view),
        *_scope_exit(view, judge, final),
        *_dedent(view, final),
        *_new_definition(view, final),
        *_repeats(view, min_repeat_chars, max_repeat_lines, final),
    ]
    for stop in sorted(stops, key=lambda s: s.at):
        if not stop.checked or judge(completion[: stop.at]) <= baseline:
            return stop
    return None
