"""The one path from a cursor to a completion, used by the CLI, the language server and eval.

    cursor ──build_prompt──> Prompt (other files, FIM, healing; exact tokens) ──request_for──> Request
           ──engine.stream + stop_policy──> streamed text ──finalize──> CompletionResult

No torch import here (the language server imports this module): the engine is passed in.
`build_prompt` is deterministic in (cursor, options, the engine's tokenizer), so calling it ahead of
a request (to prefill its context) gives the very tokens the request will use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from completion_engine.crossfile import neighbourhood, render_files, repo_separator, select_snippets
from completion_engine.drafters import drafter_spec
from completion_engine.fim import FIM_CHOICES, choose_fim, suffix_window
from completion_engine.prompt import prompt_window, stable_tail
from completion_engine.stopping import LINE_MODES, limit_lines, line_limit, stop_policy
from completion_engine.types import Request, Stats

if TYPE_CHECKING:
    from completion_engine.engine import CompletionEngine

CHARS_PER_CONTEXT_TOKEN = 6  # generous: code averages 3-4 characters per token
# FIM suffix budget in tokens: in PSM order every keystroke re-prefills the suffix, so keep it short
SUFFIX_TOKENS = {"psm": 128, "spm": 512}
FIM_OVERHEAD_TOKENS = 8  # the template's own tokens


@dataclass(frozen=True, slots=True)
class CompletionOptions:
    """How completions are made: the one options record of the CLI, the server and eval."""

    draft: str = "ngram"  # a name in completion_engine.drafters.DRAFTERS
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0
    syntax: bool = True  # stop and trim with the syntax module (or the blank-line fallback)
    healing: bool = True  # back off the prompt's last token and constrain the first ones to spell it
    fim: str = "auto"  # fill-in-the-middle: "auto" (from the tokenizer) | "off" | a family in FIM_FORMATS
    cross_file_tokens: int = 0  # budget for snippets of other open files (0: none); see crossfile.py
    lines: str = "multi"  # "single" | "multi" | "auto" (multi-line at an empty line or after a block opener)
    max_lines: int = 0  # most lines of a multi-line completion (0: no limit)

    def __post_init__(self) -> None:
        drafter_spec(self.draft)  # ValueError for an unknown name: no silent fall-through
        if self.lines not in LINE_MODES:
            raise ValueError(f"unknown lines mode {self.lines!r}; choose one of {', '.join(LINE_MODES)}")
        if self.max_lines < 0:
            raise ValueError("max_lines must be >= 0")
        if self.fim not in FIM_CHOICES:
            raise ValueError(f"unknown FIM format {self.fim!r}; choose one of {', '.join(FIM_CHOICES)}")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class Cursor:
    """A document split at the cursor."""

    prefix: str  # everything before the cursor
    suffix: str = ""  # everything after it
    path: str = ""  # for the language, and the file's name in a cross-file prompt
    language_id: str = ""  # the editor's language id, when it sent one
    other_files: tuple[tuple[str, str], ...] = ()  # (path, text) of other open documents

    @property
    def line_prefix(self) -> str:
        return self.prefix[self.prefix.rfind("\n") + 1 :]


@dataclass(frozen=True, slots=True)
class Prompt:
    """What the model is asked to continue."""

    context: list[int]  # the exact token ids of the request's context
    heal: str = ""  # text backed off the prompt's end that the completion must start with (not inserted)
    fim: str = ""  # the FIM family whose template the context follows; "" for prefix only
    stop_tokens: frozenset[int] = frozenset()  # the FIM family's end-of-middle tokens


@dataclass(frozen=True, slots=True)
class CompletionResult:
    text: str  # final text to insert
    raw_text: str  # the generation as the stop check cut it, before the final clean-up
    tokens: list[int]  # generated token ids
    stats: Stats
    stopper: str = "none"  # which stop policy cut it: "syntax+scope" | "fallback" | "none"

    @property
    def cancelled(self) -> bool:
        return self.stats.stop_reason == "cancelled"


def build_prompt(engine: CompletionEngine, cursor: Cursor, options: CompletionOptions) -> Prompt:
    """The cursor's prompt: the exact token context a request at this cursor will use.

    The text window and the token tail start at block-aligned places that stay put while the user
    types, so the engine's KV cache of the previous request stays reusable. With a FIM family the
    suffix (from its start, up to a budget) goes into the family's template; see fim.py for the order.
    """
    table = engine.token_table
    max_context = engine.config.max_context
    repo_tokens = other_files_tokens(engine, cursor, options, max_context // 2)
    max_context -= len(repo_tokens)
    fim = choose_fim(options.fim, table.vocabulary)
    suffix_tokens: list[int] = []
    if fim is not None:
        budget = min(SUFFIX_TOKENS[fim.order], max_context // 4)
        suffix_tokens = engine.encode(suffix_window(cursor.suffix, budget * CHARS_PER_CONTEXT_TOKEN))[:budget]
        max_context -= len(suffix_tokens) + FIM_OVERHEAD_TOKENS
    window = prompt_window(cursor.prefix, max_context * CHARS_PER_CONTEXT_TOKEN)
    prefix_tokens = stable_tail(engine.encode(window), max_context)
    heal = ""
    if options.healing:
        prefix_tokens, heal = table.split(prefix_tokens)
    if fim is None:
        return Prompt(context=repo_tokens + prefix_tokens, heal=heal)
    context = fim.tokens(prefix_tokens, suffix_tokens, table.vocabulary.__getitem__, engine.encode)
    stops = frozenset(table.vocabulary[t] for t in fim.stop_tokens if t in table.vocabulary)
    return Prompt(context=repo_tokens + context, heal=heal, fim=fim.name, stop_tokens=stops)


def other_files_tokens(
    engine: CompletionEngine, cursor: Cursor, options: CompletionOptions, most: int
) -> list[int]:
    """Snippets of other open files in the model's repository format, then the current file's header;
    nothing when off, when nothing relates, or when the tokenizer has no file separator."""
    budget = min(options.cross_file_tokens, most)
    separator = repo_separator(engine.token_table.vocabulary) if budget > 0 and cursor.other_files else None
    if separator is None:
        return []
    snippets = select_snippets(neighbourhood(cursor.prefix), cursor.other_files, budget * 3)
    if not snippets:
        return []
    tokens = engine.encode(render_files(snippets, separator, cursor.path or "current"))
    return tokens if len(tokens) <= budget else []


def request_for(prompt: Prompt, options: CompletionOptions) -> Request:
    return Request(
        context=prompt.context,
        max_new_tokens=options.max_new_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        seed=options.seed,
        draft=options.draft,
        heal=prompt.heal,
        stop_tokens=prompt.stop_tokens,
    )


def complete(
    engine: CompletionEngine,
    cursor: Cursor,
    options: CompletionOptions,
    cancel: threading.Event | None = None,
    on_text: Callable[[str], None] | None = None,
    prompt: Prompt | None = None,
) -> CompletionResult:
    """Complete at the cursor. on_text receives the visible completion so far (the whole text)."""
    prompt = prompt or build_prompt(engine, cursor, options)
    policy = stop_policy(cursor.prefix, cursor.suffix, cursor.language_id, cursor.path, options.syntax)
    policy = limit_lines(policy, line_limit(options.lines, options.max_lines, cursor.prefix, cursor.suffix))
    generation = engine.stream(request_for(prompt, options), cancel=cancel, stop_check=policy.stop_at)
    for chunk in generation:
        if on_text is not None and chunk.text:
            on_text(policy.visible(generation.text))
    raw = generation.text
    cancelled = generation.stats.stop_reason == "cancelled"
    text = raw if cancelled else policy.finalize(raw)
    return CompletionResult(text, raw, list(generation.tokens), generation.stats, policy.source)


def complete_file(
    config,
    options: CompletionOptions,
    cursor: Cursor,
    open_files: dict[str, str],
    on_text: Callable[[str], None] | None,
) -> CompletionResult:
    """The CLI's path: load the engine, open the documents, complete at the cursor."""
    from completion_engine.engine import CompletionEngine

    engine = CompletionEngine.from_config(config)
    engine.set_document(cursor.path, cursor.prefix + cursor.suffix)
    for other_path, other_text in open_files.items():
        engine.set_document(other_path, other_text)
    cursor = replace(cursor, other_files=tuple(open_files.items()))
    return complete(engine, cursor, options, on_text=on_text)
