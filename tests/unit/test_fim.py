"""FIM prompts per family: detection from tiny tokenizers carrying each family's tokens, the exact
prompt strings, the stop at the end of the middle, and how much of the KV cache survives an edit."""

from __future__ import annotations

import pytest

from completion_engine.completion import (
    SUFFIX_TOKENS,
    CompletionOptions,
    Cursor,
    build_prompt,
    complete,
    request_for,
)
from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine
from completion_engine.fim import FIM_FORMATS, detect_fim
from completion_engine.tiny import build_tokenizer
from completion_engine.types import Request
from tests.conftest import tiny_loaded

PREFIX, SUFFIX = "def area(r):\n    return ", "\n\nprint(area(2))\n"

FAMILY_TOKENS = {
    "qwen2.5-coder": (
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|fim_pad|>",
        "<|file_sep|>",
        "<|repo_name|>",
    ),
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<file_sep>", "<repo_name>"),
    "santacoder": ("<fim-prefix>", "<fim-suffix>", "<fim-middle>", "<fim-pad>"),
    "deepseek-coder": ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    "codellama": ("<PRE>", "<SUF>", "<MID>", "<EOT>"),
    "codestral": ("[SUFFIX]", "[PREFIX]"),
}

EXPECTED_PROMPTS = {
    "qwen2.5-coder": f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>",
    "starcoder": f"<fim_prefix><fim_suffix>{SUFFIX}<fim_middle>{PREFIX}",
    "santacoder": f"<fim-prefix><fim-suffix>{SUFFIX}<fim-middle>{PREFIX}",
    "deepseek-coder": f"<｜fim▁begin｜>{PREFIX}<｜fim▁hole｜>{SUFFIX}<｜fim▁end｜>",
    "codellama": f"<PRE> <SUF>{SUFFIX} <MID> {PREFIX}",
    "codestral": f"[SUFFIX]{SUFFIX}[PREFIX]{PREFIX}",
}


@pytest.fixture(scope="module")
def tokenizers():
    return {family: build_tokenizer(extra_special=tokens) for family, tokens in FAMILY_TOKENS.items()}


def engine_for(tokenizer, max_context: int = 512) -> CompletionEngine:
    target = tiny_loaded(tokenizer, seed=1)
    return CompletionEngine(EngineConfig(target="test", max_context=max_context, max_draft=6), target)


@pytest.mark.parametrize("family", FAMILY_TOKENS)
def test_the_family_is_detected_from_its_special_tokens(tokenizers, family):
    assert detect_fim(tokenizers[family].get_vocab()).name == family


def test_no_fim_tokens_no_fim(tiny_tokenizer):
    assert detect_fim(tiny_tokenizer.get_vocab()) is None
    engine = engine_for(tiny_tokenizer)
    prompt = build_prompt(engine, Cursor(PREFIX, SUFFIX), CompletionOptions(healing=False))
    assert prompt.fim == "" and engine.decode(prompt.context) == PREFIX


@pytest.mark.parametrize("family", FAMILY_TOKENS)
def test_the_exact_prompt_string(tokenizers, family):
    assert FIM_FORMATS[family].render(PREFIX, SUFFIX) == EXPECTED_PROMPTS[family]
    tokenizer = tokenizers[family]
    engine = engine_for(tokenizer)
    prompt = build_prompt(engine, Cursor(PREFIX, SUFFIX), CompletionOptions(healing=False))
    assert prompt.fim == family
    text = tokenizer.decode(prompt.context, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert text == EXPECTED_PROMPTS[family]


def test_an_override_picks_the_format_and_off_turns_it_off(tokenizers):
    engine = engine_for(tokenizers["starcoder"])
    off = build_prompt(engine, Cursor(PREFIX, SUFFIX), CompletionOptions(fim="off", healing=False))
    assert off.fim == "" and engine.decode(off.context) == PREFIX
    with pytest.raises(ValueError, match="unknown FIM format"):
        CompletionOptions(fim="fancy")


@pytest.mark.parametrize("family", ["qwen2.5-coder", "starcoder"])
def test_healing_applies_to_the_end_of_the_prefix(tokenizers, family):
    engine = engine_for(tokenizers[family])
    prompt = build_prompt(engine, Cursor("def f(x):\n        ", SUFFIX), CompletionOptions())
    assert prompt.heal and "def f(x):\n        ".endswith(prompt.heal)
    result = complete(
        engine, Cursor("def f(x):\n        ", SUFFIX), CompletionOptions(max_new_tokens=8, syntax=False)
    )
    assert engine.decode(result.tokens).startswith(prompt.heal)


def test_the_middle_ends_at_the_familys_end_token_plain_and_speculative(tokenizers):
    """The end-of-middle tokens (<fim_pad>, <file_sep>) reach the request and end it like EOS."""
    tokenizer = tokenizers["starcoder"]
    engine = engine_for(tokenizer)
    prompt = build_prompt(engine, Cursor(PREFIX, SUFFIX), CompletionOptions(healing=False))
    ends = {tokenizer.convert_tokens_to_ids(t) for t in ("<fim_pad>", "<file_sep>")}
    assert request_for(prompt, CompletionOptions()).stop_tokens == prompt.stop_tokens == ends
    free = engine.complete(Request(context=prompt.context, max_new_tokens=20, draft="none")).tokens
    end = frozenset({free[5]})  # stand-in: a random model never writes <fim_pad> on cue
    engine.corpus.set_document("doc", prompt.context[-3:] + free)
    for method in ("none", "ngram"):
        generation = engine.complete(
            Request(context=prompt.context, max_new_tokens=20, draft=method, stop_tokens=end)
        )
        assert generation.tokens == free[: free.index(free[5])]
        assert generation.stats.stop_reason == "eos"


@pytest.mark.parametrize("family", ["starcoder", "qwen2.5-coder", "codestral"])
def test_kv_reuse_after_typing_one_character(tokenizers, family):
    """SPM puts the suffix first: an edit at the cursor re-prefills a few tokens. PSM re-prefills the
    suffix after the edit too, which its budget (SUFFIX_TOKENS["psm"]) bounds."""
    engine = engine_for(tokenizers[family])
    options = CompletionOptions(max_new_tokens=2, syntax=False)
    suffix = "\n" + "\n".join(f"    total += item_{i}" for i in range(40)) + "\n"
    first = complete(engine, Cursor(PREFIX + "rad", suffix), options)
    typed = complete(engine, Cursor(PREFIX + "radi", suffix), options)
    context = len(build_prompt(engine, Cursor(PREFIX + "radi", suffix), options).context)
    assert first.stats.prefill_tokens >= 100  # cold: the whole prompt
    if FIM_FORMATS[family].order == "spm":
        assert typed.stats.prefill_tokens <= 4
    else:
        assert 100 <= typed.stats.prefill_tokens <= SUFFIX_TOKENS["psm"] + 8
    assert typed.stats.prefill_tokens < context
