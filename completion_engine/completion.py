"""One completion at a cursor: prefix and suffix in, syntax-checked text and stats out."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine
from completion_engine.types import Request, Stats


@dataclass(frozen=True, slots=True)
class CompletionResult:
    text: str  # final text to insert
    streamed: str  # what was streamed before the final checks
    stats: Stats


@dataclass(frozen=True, slots=True)
class CompletionOptions:
    max_new_tokens: int = 64
    draft: str = "ngram"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    syntax: bool = True  # stop and truncate with the syntax checker


def syntax_checker(prefix: str, suffix: str, language_id: str | None, path: str | None):
    """The syntax module's checker for this cursor, or None when the module is absent."""
    try:
        from completion_engine.syntax import SyntaxChecker, detect_language
    except ImportError:
        return None
    return SyntaxChecker(prefix, suffix, detect_language(language_id, path))


def complete_at(
    engine: CompletionEngine,
    prefix: str,
    suffix: str,
    options: CompletionOptions,
    path: str | None = None,
    language_id: str | None = None,
    cancel: threading.Event | None = None,
    on_text: Callable[[str], None] | None = None,
) -> CompletionResult:
    checker = syntax_checker(prefix, suffix, language_id, path) if options.syntax else None
    request = Request(
        context=engine.encode(prefix),
        max_new_tokens=options.max_new_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        seed=options.seed,
        draft=options.draft,
    )
    generation = engine.stream(request, cancel=cancel, stop_check=checker.stop_at if checker else None)
    streamed = ""
    for chunk in generation:
        streamed += chunk.text
        if on_text is not None and chunk.text:
            on_text(chunk.text)
    text = checker.finalize(generation.text) if checker else generation.text
    return CompletionResult(text=text, streamed=streamed, stats=generation.stats)


def complete_file(
    config: EngineConfig,
    args,
    path: str,
    text: str,
    cursor,
    open_files: dict[str, str],
    on_text: Callable[[str], None] | None,
) -> CompletionResult:
    """The CLI's path: load the engine, open the documents, complete at the cursor."""
    engine = CompletionEngine.from_config(config)
    engine.set_document(path, text)
    for other_path, other_text in open_files.items():
        engine.set_document(other_path, other_text)
    options = CompletionOptions(
        max_new_tokens=args.max_new_tokens,
        draft=args.draft,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        syntax=not args.no_syntax,
    )
    return complete_at(engine, cursor.prefix, cursor.suffix, options, path=path, on_text=on_text)
