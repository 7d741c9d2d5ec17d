"""The one stop policy (CLI, server and eval): where a completion ends."""

import sys

import pytest

from completion_engine.stopping import dedent_stop, earliest, fallback_policy, scope_indent, stop_policy

DOCSTRING_PREFIX = 'def f():\n    """Doc."""'


def cut(text, at):
    return text if at is None else text[:at]


def test_dedent_stop_cuts_before_the_first_dedented_line():
    text = "\n    x = 1\n    return x\n\ndef g():\n    pass\n"
    assert cut(text, dedent_stop(text, 4)) == "\n    x = 1\n    return x\n"


def test_dedent_stop_waits_for_a_non_blank_character():
    # blank lines and a line of spaces do not decide: the body may go on
    assert dedent_stop("\n    x = 1\n\n  ", 4) is None
    assert dedent_stop("\n    x = 1\n\n    y = 2", 4) is None


def test_dedent_stop_nested_blocks_stay_inside():
    text = "\n    if x:\n        y()\n    return y\n"
    assert dedent_stop(text, 4) is None


def test_dedent_stop_the_cursor_line_does_not_count_unless_the_completion_starts_a_line():
    # the first line is the rest of the cursor's line, whatever its indentation
    assert dedent_stop("  # note\ny = 2", 4) == 8
    assert dedent_stop("def other():\n    pass", 4, at_line_start=True) == 0
    # the model leaves the function at once: nothing of the body is kept
    assert dedent_stop("\n\ndef other():", 4) == 1


@pytest.mark.parametrize(
    ("prefix", "text"),
    [
        (DOCSTRING_PREFIX, "\n    a = 1\n    if a:\n        b = 2\n\n    return b\nclass C:\n    pass\n"),
        ("def f():\n    x = compute(", "a,\n        b) + 1\n    next_statement()\nclass C:\n"),
        ("def f():\n    ", "x = 1\n    y = 2\n\nclass C:\n"),
    ],
)
def test_the_cut_does_not_depend_on_how_the_text_arrives(prefix, text):
    """Plain decoding sees the text a token at a time, speculation a block at a time: same cut."""
    for policy in (stop_policy(prefix, "", "python", "x.py", syntax=True), fallback_policy(prefix)):
        stop_at = policy.stop_at
        whole = cut(text, stop_at(text))
        for step in (1, 3, 7):
            seen = ""
            for end in range(step, len(text) + step, step):
                seen = text[:end]
                at = stop_at(seen)
                if at is not None:
                    seen = seen[:at]
                    break
            assert seen == whole


def test_without_the_syntax_module_the_fallback_stops(monkeypatch):
    monkeypatch.setitem(sys.modules, "completion_engine.syntax", None)  # import fails
    policy = stop_policy(DOCSTRING_PREFIX, "", "python", "x.py", syntax=True)
    assert policy.source == "fallback"
    assert policy.finalize("\n    return 1\n\n") == "\n    return 1"


def test_with_the_syntax_module_bodies_also_stop_by_scope():
    pytest.importorskip("completion_engine.syntax")
    policy = stop_policy("def f(x):", "\n", "python", "x.py", syntax=True)
    assert policy.source == "syntax+scope"
    text = "\n    return x\n\ndef g():\n    return 2\n"
    assert text[: policy.stop_at(text)].rstrip() == "\n    return x"


def test_syntax_off_keeps_the_raw_completion():
    policy = stop_policy("def f():\n    ", "", "python", "x.py", syntax=False)
    assert policy.stop_at is None and policy.finalize("a\n\nb ") == "a\n\nb "


def test_scope_indent_from_the_cursor():
    assert scope_indent("class C:\n    def f(self):\n        ") == (8, False)
    assert scope_indent("class C:\n    def f(self):") == (5, False)
    assert scope_indent("x = 1\n") == (0, True)


def test_earliest_takes_the_first_cut():
    assert earliest(lambda t: None, lambda t: 5, lambda t: 3)("abcdefg") == 3
    assert earliest(lambda t: None)("abc") is None


@pytest.mark.parametrize("syntax_module", [True, False])
def test_code_after_the_cursor_moves_to_its_own_line(monkeypatch, syntax_module):
    if not syntax_module:
        monkeypatch.setitem(sys.modules, "completion_engine.syntax", None)
    prefix, suffix = "def f(key):\n    if key:\n        ", "raise KeyError(key)\n    return 1\n"
    policy = stop_policy(prefix, suffix, "python", "x.py", syntax=True)
    final = policy.finalize("self.x = 1")
    assert final == "self.x = 1\n        "
    compile(prefix + final + suffix, "x.py", "exec")
    assert policy.finalize("   ") == ""
    # nothing after the cursor on its line: nothing added
    assert stop_policy(prefix, "\n", "python", "x.py", syntax=True).finalize("self.x = 1") == "self.x = 1"


def test_cpython_has_the_last_word_on_python():
    # tree-sitter accepts a nested def whose body is not indented; CPython does not
    prefix, suffix = "class C:\n    def g(self):\n        ", "return 1\n"
    policy = stop_policy(prefix, suffix, "python", "x.py", syntax=True)
    final = policy.finalize('x = 1\n        def h(self):\n        """Doc."""\n        return 2')
    compile(prefix + final + suffix, "x.py", "exec")
    assert final.startswith("x = 1\n")
