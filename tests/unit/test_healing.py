"""Token healing: the constraint is the argmax over allowed tokens, and speculation keeps it exact."""

from __future__ import annotations

import inspect
import random
import textwrap

import pytest
import torch

from completion_engine.completion import CompletionOptions, Cursor, build_prompt, complete
from completion_engine.engine import CompletionEngine
from completion_engine.healing import TokenTable, allowed_tokens, ends_in_blank, heal_split, remaining_heal
from completion_engine.types import Draft, Request
from tests.unit.test_lossless import engine_for  # drafts keep their size on every machine

SOURCE = textwrap.dedent(inspect.getsource(textwrap))


def plain(engine: CompletionEngine, context: list[int], heal: str, max_new: int) -> list[int]:
    return engine.complete(Request(context=context, max_new_tokens=max_new, draft="none", heal=heal)).tokens


def healed_prompts(engine: CompletionEngine, count: int, seed: int) -> list[tuple[list[int], str]]:
    """Cursors in real code: after indentation, inside identifiers and operators; those that heal."""
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < count:
        end = rng.randrange(200, len(SOURCE) - 1)
        prefix = SOURCE[max(0, end - 400) : end]
        context, heal = engine.token_table.split(engine.encode(prefix))
        if heal:
            prompts.append((context, heal))
    return prompts


def constrained_reference(engine: CompletionEngine, context: list[int], heal: str, steps: int) -> list[int]:
    """Greedy decoding the slow, obvious way: a fresh forward over the whole sequence per token, the
    argmax over the tokens allowed by what is left to spell."""
    runner, table, tokens = engine.target_runner, engine.token_table, []
    for _ in range(steps):
        runner.truncate(0)
        logits = runner.extend(context + tokens)[0].float()
        remaining = remaining_heal(heal, engine.decode(tokens))
        if remaining is not None:
            allowed = allowed_tokens(table.texts, remaining, table.special, ends_in_blank(heal))
            logits = torch.full_like(logits, float("-inf")).index_copy(
                0, torch.tensor(allowed), logits[allowed]
            )
        tokens.append(int(logits.argmax()))
    runner.truncate(0)
    return tokens


def test_pure_parts():
    assert heal_split([1, 2, 3], ["", "a", "b", "  "], {"  "}) == ([1, 2], "  ")
    assert heal_split([1, 2, 3], ["", "a", "b", "  "], {" "}) == ([1, 2, 3], "")  # nothing extends "  "
    assert heal_split([3], ["", "a", "b", "  "], {"  "}) == ([3], "")  # keep one token of context
    assert remaining_heal("abc", "ab") == "c"
    table = TokenTable.from_texts(["<s>", " ", "  ", "   x", "x"], special=frozenset({0}))
    assert table.allowed("  ") == [1, 2, 3]
    assert table.allowed("  ", no_blank_after=True) == [1, 2]  # not "   x": a third space
    assert table.split([4, 2]) == ([4], "  ")


def test_the_plain_constrained_choice_is_the_argmax_over_allowed_tokens(tiny_target):
    engine = engine_for(tiny_target)
    for context, heal in healed_prompts(engine, 6, seed=1):
        generation = engine.complete(Request(context=context, max_new_tokens=6, draft="none", heal=heal))
        expected = constrained_reference(engine, context, heal, len(generation.tokens))
        assert generation.tokens == expected
        assert engine.decode(generation.tokens).startswith(heal)
        assert generation.text == engine.decode(generation.tokens)[len(heal) :]


@pytest.mark.parametrize("k", [1, 4, 15])
@pytest.mark.parametrize("method", ["ngram", "model", "hybrid"])
def test_speculative_healing_equals_plain_healing(tiny_target, tiny_near_draft, method, k):
    engine = engine_for(tiny_target, tiny_near_draft, k=k)
    accepted_any = rejected_any = constraint_mattered = False
    for i, (context, heal) in enumerate(healed_prompts(engine, 8, seed=k)):
        expected = plain(engine, context, heal, 24)
        free = plain(engine, context, "", 24)
        constraint_mattered |= free[:1] != expected[:1]
        # drafts from the constrained run, and from the unconstrained one (which break the constraint)
        document = expected if i % 2 else free
        engine.corpus.set_document("doc", context[-4:] + document)
        generation = engine.complete(Request(context=context, max_new_tokens=24, draft=method, heal=heal))
        assert generation.tokens == expected, f"{method} k={k} diverged on {heal!r}"
        accepted_any |= generation.stats.accepted > 0
        rejected_any |= generation.stats.accepted < generation.stats.drafted
    assert accepted_any and rejected_any
    assert constraint_mattered, "healing should change the first token of some prompt"


class DisallowedDrafter:
    """Proposes the unconstrained choice: tokens the healing constraint forbids."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, context, k, sampler=None) -> Draft:
        return Draft(tokens=self.tokens[:k], probs=None, source="ngram")


def test_drafts_that_break_the_constraint_are_rejected(tiny_target, monkeypatch):
    engine = engine_for(tiny_target, k=6)
    for context, heal in healed_prompts(engine, 4, seed=5):
        expected = plain(engine, context, heal, 12)
        bad = [t for t in range(tiny_target.vocab_size) if t not in engine.token_table.allowed(heal, True)][
            :6
        ]
        monkeypatch.setattr(engine, "drafter_for", lambda method, bad=bad: DisallowedDrafter(bad))
        generation = engine.complete(Request(context=context, max_new_tokens=12, draft="ngram", heal=heal))
        assert generation.tokens == expected
        monkeypatch.undo()


def test_the_healed_text_is_not_inserted_twice(tiny_target):
    engine = engine_for(tiny_target)
    prefix = "def f(self):\n        "
    cursor = Cursor(prefix, "return 1\n", "m.py", "python")
    prompt = build_prompt(engine, cursor, CompletionOptions())
    assert prompt.heal and prefix.endswith(prompt.heal)
    assert engine.decode(prompt.context) + prompt.heal == prefix
    result = complete(engine, cursor, CompletionOptions(draft="none", max_new_tokens=10, syntax=False))
    tokens_text = engine.decode(result.tokens)
    assert tokens_text.startswith(prompt.heal) and result.raw_text == tokens_text[len(prompt.heal) :]


def test_the_kv_cache_is_reused_while_the_user_types(tiny_target):
    engine = engine_for(tiny_target)
    options = CompletionOptions(draft="ngram", max_new_tokens=4, syntax=False)
    base = SOURCE[:1500]
    complete(engine, Cursor(base + "    resul"), options)
    typed = complete(engine, Cursor(base + "    result"), options)
    assert typed.stats.prefill_tokens <= 4
    assert complete(engine, Cursor(base + "    result ="), options).stats.prefill_tokens <= 4


def sentencepiece_like_tokenizer():
    """A Metaspace tokenizer (SentencePiece style, as CodeLlama and Mistral use)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False)
    core.train_from_iterator([SOURCE], trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>")


def test_healing_stays_off_where_decoding_is_not_concatenation(tiny_tokenizer):
    assert TokenTable.from_tokenizer(tiny_tokenizer, len(tiny_tokenizer)).healable
    spm = sentencepiece_like_tokenizer()
    table = TokenTable.from_tokenizer(spm, len(spm))
    assert not table.healable
    tokens = spm.encode("    x = fo", add_special_tokens=False)
    assert table.split(tokens) == (tokens, "")
