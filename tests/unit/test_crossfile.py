"""Context from other open files: selection, the repository format, and a prompt that stays stable."""

from __future__ import annotations

from completion_engine.completion import CompletionOptions, Cursor, build_prompt, complete
from completion_engine.config import EngineConfig
from completion_engine.crossfile import select_snippets
from completion_engine.engine import CompletionEngine
from completion_engine.tiny import build_tokenizer
from tests.conftest import tiny_loaded

SHAPES = "import math\n\n\ndef circle_area(radius):\n    return math.pi * radius**2\n"
UNRELATED = "import os\n\n\ndef walk_tree(root):\n    return list(os.walk(root))\n"
# eight whole lines before the cursor's line: the neighbourhood (whole steps of 8 lines) covers them
PREFIX = (
    "def report(radius):\n    area = circle_area(radius)\n"
    + "".join(f"    # {i}\n" for i in range(6))
    + "    "
)


def engine_with_separator() -> CompletionEngine:
    tokenizer = build_tokenizer(extra_special=("<file_sep>",))
    return CompletionEngine(EngineConfig(target="test", max_context=512), tiny_loaded(tokenizer, seed=1))


def test_the_related_file_is_chosen():
    chosen = select_snippets(PREFIX, [("shapes.py", SHAPES), ("tree.py", UNRELATED)], 1000)
    assert [s.path for s in chosen] == ["shapes.py"]


def test_snippets_come_first_in_the_repository_format():
    engine = engine_with_separator()
    cursor = Cursor(PREFIX, "", "report.py", "python", (("shapes.py", SHAPES), ("tree.py", UNRELATED)))
    prompt = build_prompt(engine, cursor, CompletionOptions(cross_file_tokens=200, healing=False, fim="off"))
    text = engine.tokenizer.decode(prompt.context, skip_special_tokens=False)
    assert text == f"<file_sep>shapes.py\n{SHAPES}\n<file_sep>report.py\n{PREFIX}"
    off = build_prompt(engine, cursor, CompletionOptions(healing=False, fim="off"))
    assert engine.decode(off.context) == PREFIX


def test_no_separator_token_no_snippets(tiny_target):
    engine = CompletionEngine(EngineConfig(target="test"), tiny_target)
    cursor = Cursor(PREFIX, "", "report.py", "python", (("shapes.py", SHAPES),))
    prompt = build_prompt(engine, cursor, CompletionOptions(cross_file_tokens=200, healing=False))
    assert engine.decode(prompt.context) == PREFIX


def test_typing_keeps_the_snippets_and_the_cache():
    engine = engine_with_separator()
    options = CompletionOptions(cross_file_tokens=200, max_new_tokens=2, syntax=False)
    others = (("shapes.py", SHAPES), ("tree.py", UNRELATED))
    complete(engine, Cursor(PREFIX + "ret", "", "report.py", "python", others), options)
    typed = complete(engine, Cursor(PREFIX + "retu", "", "report.py", "python", others), options)
    assert typed.stats.prefill_tokens <= 4
