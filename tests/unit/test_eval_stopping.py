"""Stop heuristics of the evaluation: where a body or a statement completion ends."""

import sys

import pytest

from eval.stopping import dedent_stop, earliest, heuristic_stopper, make_stopper, statement_end_stop


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


def test_statement_end_stop_at_the_first_line_break_outside_new_brackets():
    assert cut("1, 2)\nnext_line()", statement_end_stop("1, 2)\nnext_line()")) == "1, 2)"
    text = "foo(a,\n    b)\nx = 1"
    assert cut(text, statement_end_stop(text)) == "foo(a,\n    b)"
    assert statement_end_stop("foo(a,\n    b") is None  # still inside the completion's own bracket


def test_statement_end_stop_skips_leading_line_breaks():
    assert statement_end_stop("\nx") is None


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        ("body", "\n    a = 1\n    if a:\n        b = 2\n\n    return b\nclass C:\n    pass\n"),
        ("statement", "compute(a,\n        b) + 1\nnext_statement()\n"),
    ],
)
def test_the_cut_does_not_depend_on_how_the_text_arrives(mode, text):
    """Plain decoding sees the text a token at a time, speculation a block at a time: same cut."""
    stop_at = heuristic_stopper(mode, min_indent=4).stop_at
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


def test_make_stopper_falls_back_to_the_heuristic_without_the_syntax_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "completion_engine.syntax", None)  # import fails
    stopper = make_stopper("def f():", "", "python", "body", min_indent=4)
    assert stopper.kind == "scope"
    assert stopper.finalize("\n    return 1\n\n") == "\n    return 1"
    assert make_stopper("x = f(", "", "python", "statement").kind == "statement end"


def test_with_the_syntax_module_bodies_also_stop_by_scope():
    pytest.importorskip("completion_engine.syntax")
    stopper = make_stopper("def f(x):", "\n", "python", "body", min_indent=4)
    assert stopper.kind == "syntax+scope"
    text = "\n    return x\n\ndef g():\n    return 2\n"
    assert text[: stopper.stop_at(text)].rstrip() == "\n    return x"


def test_earliest_takes_the_first_cut():
    assert earliest(lambda t: None, lambda t: 5, lambda t: 3)("abcdefg") == 3
    assert earliest(lambda t: None)("abc") is None


def test_heuristic_stopper_rejects_an_unknown_mode():
    with pytest.raises(ValueError):
        heuristic_stopper("paragraph")
