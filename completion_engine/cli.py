"""`spec-complete`: complete a file at a position, serve editors, evaluate, benchmark."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from completion_engine.completion import Cursor
from completion_engine.drafters import DRAFT_METHODS, draft_problem
from completion_engine.fim import FIM_CHOICES
from completion_engine.options import (
    add_engine_arguments,
    apply_threads_argument,
    completion_options,
    eagle_tree_problem,
    engine_config,
    resolve_draft_defaults,
)


class UsageError(Exception):
    """Bad input from the command line: printed as one line, exit code 2."""


def split_at(text: str, line: int, col: int, path: str = "") -> Cursor:
    """Split text at a 0-based (line, column) position, as LSP counts them (columns in characters here)."""
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        raise UsageError(f"line {line} is out of range: the file has {len(lines)} lines (0-based)")
    if not 0 <= col <= len(lines[line]):
        raise UsageError(
            f"column {col} is out of range: line {line} has {len(lines[line])} characters (0-based)"
        )
    offset = sum(len(x) + 1 for x in lines[:line]) + col
    return Cursor(text[:offset], text[offset:], path=path)


def read_source(path: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"file not found: {path}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None


def add_complete_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the file to complete")
    parser.add_argument("--line", type=int, required=True, help="0-based line of the cursor")
    parser.add_argument("--col", type=int, required=True, help="0-based column of the cursor")
    parser.add_argument(
        "--open", action="append", default=[], metavar="OTHER_FILE", help="another open file (n-gram)"
    )
    parser.add_argument(
        "--draft",
        default=None,
        help=f"draft method: {' | '.join(DRAFT_METHODS)} (default: hybrid with a draft model, else ngram)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-syntax", action="store_true", help="show the raw model output, no syntax checks"
    )
    parser.add_argument("--fim", default="auto", choices=FIM_CHOICES, help="fill-in-the-middle format")
    parser.add_argument(
        "--cross-file-tokens", type=int, default=0, help="budget for snippets of --open files (0: none)"
    )
    parser.add_argument(
        "--no-healing", action="store_true", help="no token healing: continue from the prompt's last token"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    add_engine_arguments(parser)


class _Printer:
    """Prints the growing completion as deltas; remembers what it printed."""

    def __init__(self) -> None:
        self.printed = ""

    def __call__(self, visible: str) -> None:
        if visible.startswith(self.printed):
            print(visible[len(self.printed) :], end="", flush=True)
            self.printed = visible


def run_complete(args: argparse.Namespace) -> int:
    from completion_engine.completion import complete_file

    resolve_draft_defaults(args)
    apply_threads_argument(args)
    problem = draft_problem(args.draft, args.draft_model is not None) or eagle_tree_problem(args)
    if problem:
        raise UsageError(problem)
    text = read_source(args.file)
    cursor = split_at(text, args.line, args.col, path=args.file)
    others = {path: read_source(path) for path in args.open}
    printer = None if args.json else _Printer()
    result = complete_file(engine_config(args), completion_options(args), cursor, others, printer)
    if args.json:
        print(json.dumps({"text": result.text, **result.stats.as_dict()}))
    else:
        if result.text != printer.printed:
            print(f"\n--- final text (after syntax/stop checks) ---\n{result.text}", end="")
        print("\n---")
        print(format_stats(result.stats.as_dict()))
    return 0


def format_stats(stats: dict) -> str:
    decode_s = stats["decode_s"]
    catch_up = f"  draft catch-up {stats['draft_prefill_s']:.3f} s" if stats["draft_prefill_s"] else ""
    lines = [
        f"tokens {stats['tokens']}  target forwards {stats['target_forwards']}  "
        f"drafted {stats['drafted']}  accepted {stats['accepted']}  "
        f"mean accepted length {stats['mean_accepted_len']}",
        f"prefill {stats['prefill_tokens']} tokens in {stats['prefill_s']:.3f} s  "
        f"ttft {stats['ttft_s']:.3f} s{catch_up}  "
        f"decode {decode_s:.3f} s ({stats['decode_tokens_per_s']} tok/s)  wall {stats['wall_s']:.3f} s  "
        f"stop: {stats['stop_reason']}",
    ]
    for name, s in stats["by_source"].items():
        rate = s["accepted"] / s["drafted"] if s["drafted"] else 0.0
        lines.append(
            f"  {name}: drafted {s['drafted']}  accepted {s['accepted']} ({rate:.0%})  steps {s['steps']}"
        )
    if stats.get("by_origin"):
        lines.append(
            "  from: "
            + "  ".join(f"{name} {s['accepted']}/{s['drafted']}" for name, s in stats["by_origin"].items())
        )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Command:
    module: str  # imported only when this command runs: `serve` must start before torch is imported
    add_arguments: str
    run: str
    help: str


COMMANDS = {
    "complete": Command(
        "completion_engine.cli", "add_complete_arguments", "run_complete", "complete a file at a position"
    ),
    "serve": Command(
        "lsp_server.cli", "add_serve_arguments", "run_serve", "serve completions over LSP (stdio or ws)"
    ),
    "eval": Command("eval.cli", "add_eval_arguments", "run_eval", "offline evaluation: humaneval | repo"),
    "bench": Command("eval.cli", "add_bench_arguments", "run_bench", "speed benchmark of the draft methods"),
    "train-draft": Command("eval.train_draft", "add_train_arguments", "run_train", "distil the draft model"),
}


def chosen_command(argv: list[str]) -> str | None:
    return next((a for a in argv if a in COMMANDS), None)


def build_parser(chosen: str | None) -> argparse.ArgumentParser:
    """Every command is listed; only the chosen one's module is imported to define its arguments."""
    parser = argparse.ArgumentParser(prog="spec-complete", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command_parser = sub.add_parser(name, help=command.help, description=command.help)
        if name == chosen:
            getattr(importlib.import_module(command.module), command.add_arguments)(command_parser)
    return parser


def is_user_error(error: Exception) -> bool:
    """Errors caused by the input (a path, a position, a model): one line and exit code 2."""
    if isinstance(error, UsageError):
        return True
    models = sys.modules.get("completion_engine.models")
    return models is not None and isinstance(error, models.ModelLoadError)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(chosen_command(argv)).parse_args(argv)
    command = COMMANDS[args.command]
    try:
        return getattr(importlib.import_module(command.module), command.run)(args)
    except Exception as error:  # noqa: BLE001 - only the expected kinds are shown as one line
        if not is_user_error(error):
            raise
        print(f"spec-complete: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
