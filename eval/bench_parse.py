"""Do completions keep the file parseable? Cursors at statement starts inside real functions.

    python -m eval.bench_parse [--root DIR] [--points 50] [--seed 0] [--variants healing,no-healing]

Each cursor sits after the indentation of a statement inside a function body (the rest of the line
and of the file after it, as a user who starts typing there sees it). Every variant completes each
cursor through the one completion path (`completion_engine.completion.complete`); the file with the
completion inserted must parse (`ast.parse`), and the completion's first line must not start with
whitespace (the cursor's line already has its indentation). Default package: the standard
library's `http`, which the shipped draft was not trained on (eval/train_draft.py holds it out) and
no test, prompt rule or benchmark of ours was tuned on.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
import time
from dataclasses import dataclass, replace
from pathlib import Path

from completion_engine.completion import CompletionOptions, Cursor, complete
from completion_engine.options import add_engine_arguments, apply_threads_argument, engine_config

DEFAULT_PACKAGE = "http"
VARIANTS = {
    "healing": {"healing": True},
    "no-healing": {"healing": False},
}


@dataclass(frozen=True, slots=True)
class StatementCursor:
    path: str
    line: int  # 1-based
    prefix: str  # the file up to the statement's first character (its indentation included)
    suffix: str  # the statement and everything after it


def statement_cursors(path: str, text: str) -> list[StatementCursor]:
    """Every statement start inside a function body (nested blocks too), in file order.

    >>> [c.line for c in statement_cursors("m.py", "def f():\\n    x = 1\\n    if x:\\n        y = 2\\n")]
    [2, 3, 4]
    """
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    found: set[tuple[int, int]] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.stmt) and inner is not node and inner.lineno > node.lineno:
                    line_text = lines[inner.lineno - 1]
                    if line_text[: inner.col_offset].strip() == "":  # the statement starts its line
                        found.add((inner.lineno, inner.col_offset))
    cursors = []
    for line, column in sorted(found):
        offset = starts[line - 1] + column
        cursors.append(StatementCursor(path, line, text[:offset], text[offset:]))
    return cursors


def pick_cursors(root: Path, points: int, seed: int) -> list[StatementCursor]:
    candidates = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        candidates.extend(statement_cursors(str(path.relative_to(root)), text))
    return sorted(random.Random(seed).sample(candidates, min(points, len(candidates))), key=lambda c: c.path)


def judge(cursor: StatementCursor, completion: str) -> dict:
    """Does the file parse with the completion inserted; does the completion repeat indentation?"""
    try:
        ast.parse(cursor.prefix + completion + cursor.suffix)
        parses = True
    except SyntaxError:
        parses = False
    return {
        "parses": parses,
        "leading_whitespace": completion[:1] in (" ", "\t") and completion.strip() != "",
        "empty": completion.strip() == "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench_parse", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--root", default=None, help=f"source folder (default: the stdlib's {DEFAULT_PACKAGE})"
    )
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}"
    )
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--open-files", type=int, default=3, help="other files of the package, opened")
    parser.add_argument("--out", default=None, help="write one JSON row per cursor and variant here")
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    apply_threads_argument(args)
    from completion_engine.engine import CompletionEngine

    root = Path(args.root or Path(sysconfig.get_paths()["stdlib"]) / DEFAULT_PACKAGE)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    engine = CompletionEngine.from_config(engine_config(args))
    cursors = pick_cursors(root, args.points, args.seed)
    files = {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}
    base = CompletionOptions(draft=args.draft, max_new_tokens=args.max_new_tokens)
    rows, opened = [], []
    started = time.perf_counter()
    for index, cursor in enumerate(cursors):
        for doc in opened:
            engine.remove_document(doc)
        opened = [cursor.path, *[p for p in files if p != cursor.path][: args.open_files]]
        for doc in opened:
            engine.set_document(doc, files[doc])
        for variant in variants:
            options = replace(base, **VARIANTS[variant])
            result = complete(engine, Cursor(cursor.prefix, cursor.suffix, cursor.path, "python"), options)
            row = {"path": cursor.path, "line": cursor.line, "variant": variant, "text": result.text}
            row.update(judge(cursor, result.text))
            rows.append(row)
            print(
                f"[{index + 1}/{len(cursors)}] {variant:>10} {cursor.path}:{cursor.line} "
                f"parses={row['parses']} {result.text.split(chr(10))[0][:60]!r}",
                file=sys.stderr,
                flush=True,
            )
    if args.out:
        Path(args.out).write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    print(
        f"{len(cursors)} cursors at statement starts in {root} (seed {args.seed}), {args.draft} drafts, "
        f"{args.max_new_tokens} new tokens, context {args.max_context}; {time.perf_counter() - started:.0f} s"
    )
    print("| variant | file parses | first line starts with whitespace | empty |")
    print("|---|---|---|---|")
    for variant in variants:
        mine = [row for row in rows if row["variant"] == variant]
        parses = sum(row["parses"] for row in mine)
        print(
            f"| {variant} | {parses}/{len(mine)} ({parses / len(mine):.0%}) | "
            f"{sum(row['leading_whitespace'] for row in mine)} | {sum(row['empty'] for row in mine)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
