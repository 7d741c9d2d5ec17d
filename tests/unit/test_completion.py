"""The one completion path: cursor -> prompt -> request -> stop policy -> text, for CLI, server and eval."""

from __future__ import annotations

import subprocess
import sys

import pytest

from completion_engine.completion import CompletionOptions, Cursor, build_prompt, complete
from completion_engine.config import EngineConfig
from completion_engine.engine import CompletionEngine

SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    "


@pytest.fixture
def engine(tiny_target):
    return CompletionEngine(EngineConfig(target="test", max_context=256), tiny_target)


def test_the_server_side_modules_do_not_import_torch():
    code = (
        "import sys, lsp_server.worker, lsp_server.session, lsp_server.cli, completion_engine.completion;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_draft_method_is_refused():
    with pytest.raises(ValueError, match="unknown draft method 'magic'"):
        CompletionOptions(draft="magic")


def test_build_prompt_is_the_requests_context(engine):
    cursor = Cursor(SOURCE, "", "m.py", "python")
    options = CompletionOptions(draft="none", max_new_tokens=8, syntax=False)
    prompt = build_prompt(engine, cursor, options)
    result = complete(engine, cursor, options)
    # the request reused the whole prompt from the cache the warm-up-like first call left
    warm = complete(engine, cursor, options, prompt=prompt)
    assert warm.stats.prefill_tokens == 0  # its last logits included
    assert warm.tokens == result.tokens


def test_every_method_gives_the_plain_text(engine):
    cursor = Cursor(SOURCE, "\n", "m.py", "python")
    engine.set_document("other.py", SOURCE * 3)
    texts = {
        method: complete(engine, cursor, CompletionOptions(draft=method, max_new_tokens=24)).text
        for method in ("none", "ngram")
    }
    assert texts["ngram"] == texts["none"]


def test_on_text_sees_the_growing_visible_completion(engine):
    seen: list[str] = []
    result = complete(
        engine,
        Cursor(SOURCE),
        CompletionOptions(draft="none", max_new_tokens=12, syntax=False),
        on_text=seen.append,
    )
    assert seen and seen[-1] == result.raw_text
    assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:], strict=False))
