"""The parts of completion_engine.syntax: language detection, the bracket lexer, the window, the rules."""

from __future__ import annotations

import pytest

from completion_engine.syntax import SyntaxChecker, detect_language, truncation_points
from completion_engine.syntax.languages import FALLBACK, SPECS, grammar_for, new_parser
from completion_engine.syntax.lexer import Opener, bracket_errors, leading_closers, open_brackets, scan
from completion_engine.syntax.rules import cut_before, find_stop, join_gap, make_cursor, repeat_unit
from completion_engine.syntax.window import build_window, count_errors

# --- languages ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("language_id", "path", "expected"),
    [
        ("python", "foo.py", "python"),
        ("typescriptreact", None, "tsx"),
        ("javascriptreact", None, "javascript"),
        (None, "src/App.tsx", "tsx"),
        (None, "lib/mod.RS", "rust"),
        (None, "include/vec.h", "cpp"),
        (None, "main.c", "c"),
        ("cpp", "weird.txt", "cpp"),  # the languageId wins over the extension
        ("plaintext", "x.go", "go"),  # ... unless we do not know it
        ("lua", "init.lua", None),
        (None, None, None),
        (None, "Makefile", None),
    ],
)
def test_detect_language(language_id: str | None, path: str | None, expected: str | None) -> None:
    assert detect_language(language_id=language_id, path=path) == expected


@pytest.mark.parametrize("language", sorted(SPECS))
def test_every_language_has_a_working_grammar(language: str) -> None:
    assert grammar_for(language) is not None
    tree = new_parser(language).parse(b"x")
    assert tree.root_node is not None


# --- lexer -------------------------------------------------------------------------------------------------


def test_brackets_inside_strings_and_comments_do_not_count() -> None:
    python = SPECS["python"].lexicon
    assert open_brackets('f("(", """\n[ """, # {\n', python) == ([Opener("(", 1)], None)
    c = SPECS["c"].lexicon
    assert open_brackets("g('(', /* ( */ \"{\", ", c) == ([Opener("(", 1)], None)


def test_the_scan_reports_where_the_text_ends() -> None:
    python = SPECS["python"].lexicon
    assert open_brackets('x = """docs (', python) == ([], '"""')
    assert open_brackets("x = 1  # note (", python)[1] == "#"
    assert scan('still inside" + f(', python, mode='"').events == [(17, "(")]


def test_rust_lifetimes_are_not_quotes_but_char_literals_are() -> None:
    rust = SPECS["rust"].lexicon
    assert open_brackets("fn f<'a>(x: &'a str) -> char { '{'", rust) == ([Opener("{", 29)], None)


def test_leading_closers_of_the_suffix() -> None:
    assert leading_closers("a)\n  (b)\n}\nrest {", SPECS["javascript"].lexicon, None) == ")}"


def test_bracket_errors_compare_the_open_brackets_with_the_suffix() -> None:
    lexicon = FALLBACK.lexicon
    openers = [Opener("{", 0), Opener("(", 5)]
    assert bracket_errors(openers, "a, b", lexicon, None, ")}") == 0
    assert bracket_errors(openers, "a, [b", lexicon, None, ")}") == 3  # one too many open, two mismatched
    assert (
        bracket_errors(openers, "a))", lexicon, None, ")}") == 3
    )  # closes "{" with ")", suffix closes nothing
    assert bracket_errors(openers, 'a, "b', lexicon, None, ")}") == 1  # ends inside a string it opened
    assert bracket_errors([], "`", SPECS["javascript"].lexicon, None, "") == 1  # a template left open


# --- window ------------------------------------------------------------------------------------------------


def _big_python_file(functions: int) -> str:
    body = "    total = 0\n    for x in range(a):\n        total += x\n    return total\n"
    return "import os\n\n\n" + "".join(f"def f{i}(a):\n{body}\n\n" for i in range(functions))


def test_the_window_keeps_the_enclosing_scope_and_drops_far_statements() -> None:
    source = _big_python_file(200)
    cursor = source.index("def f100(a):\n") + len("def f100(a):\n    total = 0\n    ")
    data = source.encode()
    tree = new_parser("python").parse(data)
    window = build_window(tree, data, cursor, SPECS["python"].containers)
    text = (window.prefix + b"<|>" + window.suffix).decode()
    assert len(text) < 400 and window.removed > 0.9 * len(data)
    assert "def f100(a):\n    total = 0\n    <|>for x in range(a):" in text
    assert "def f99(a):" in text and "def f101(a):" in text and "def f50(a):" not in text
    assert count_errors(new_parser("python").parse(window.prefix + window.suffix).root_node) == 0


def test_the_window_keeps_statements_with_errors() -> None:
    source = _big_python_file(20).replace("def f3(a):", "def f3(a:")
    cursor = source.index("def f15(a):\n") + len("def f15(a):\n")
    data = source.encode()
    tree = new_parser("python").parse(data)
    window = build_window(tree, data, cursor, SPECS["python"].containers)
    assert b"def f3(a:" in window.prefix
    assert count_errors(new_parser("python").parse(window.prefix + window.suffix).root_node) == count_errors(
        tree.root_node
    )


# --- rules (pure) ------------------------------------------------------------------------------------------


def test_join_gap_keeps_only_the_whitespace_the_suffix_needs() -> None:
    blank_line_then_code = make_cursor("def f():\n    ", "\n\ndef g(): pass\n", [], "", None)
    assert join_gap("\n\n", blank_line_then_code) == ""
    code_on_the_line = make_cursor("def f():\n    ", "return 1\n", [], "", None)
    assert join_gap("\n    ", code_on_the_line) == "\n    "
    end_of_file = make_cursor("def f():\n    ", "", [], "", None)
    assert join_gap("\n\n\n", end_of_file) == "\n"


def test_cut_before_keeps_the_indentation_of_code_after_the_cursor() -> None:
    cursor = make_cursor("def f(x):\n    y = x\n    ", "return y\n", [], "", None)
    completion = "z = y + 1\n    return z\n\ndef g(): pass"
    assert completion[: cut_before(completion, completion.index("def g"), cursor)] == "z = y + 1\n    "


def test_repeat_unit_covers_enough_characters() -> None:
    assert repeat_unit(("return total",), 6, 3) == 1
    assert repeat_unit(("}", "", "}"), 6, 3) == 3
    assert repeat_unit(("}", "function g() {"), 6, 3) == 2
    assert repeat_unit((), 6, 3) == 0


def _stop(
    prefix: str, suffix: str, completion: str, language: str | None = "python"
) -> tuple[str, str] | None:
    """(kept text, reason) with a judge that never sees errors: the rules alone."""
    spec = SPECS.get(language or "", FALLBACK)
    openers, mode = open_brackets(prefix, spec.lexicon)
    stop = find_stop(completion, make_cursor(prefix, suffix, openers, prefix, mode), spec, lambda text: 0, 0)
    return None if stop is None else (completion[: stop.at], stop.reason)


def test_dedent_ends_a_python_block() -> None:
    assert _stop("def f(x):\n    ", "\n", "y = x\n    return y\nprint(") == ("y = x\n    return y", "block")
    assert _stop("def f(x):\n    ", "\n", "y = x\n    return y\n") is None


def test_line_mode_stops_at_the_end_of_the_statement() -> None:
    assert _stop("x = ", "\nprint(x)\n", "compute(1)\ny") == ("compute(1)", "statement")
    assert _stop("x = ", "\n", "a +\n    b") is None  # the line goes on


def test_line_mode_keeps_else_branches_of_its_statement() -> None:
    completion = ":\n        return 1\n    else:\n        return 2\n    log()\n"
    assert _stop("def f(x):\n    if x", "\n", completion) == (
        ":\n        return 1\n    else:\n        return 2",
        "block",
    )


def test_second_top_level_definition_stops_with_its_decorators() -> None:
    completion = "def a():\n    pass\n\n\n@cache\ndef b():\n    pass\n"
    assert _stop("import os\n\n", "", completion) == ("def a():\n    pass\n", "definition")


def test_repeat_of_the_lines_after_the_cursor() -> None:
    suffix = "\n    return total\n"
    assert _stop("def f(a):\n    ", suffix, "total = sum(a)\n    return total\n") == (
        "total = sum(a)",
        "repeat",
    )


def test_repeat_of_the_rest_of_the_line() -> None:
    assert _stop("x = foo(", ")\n", "a, b)") == ("a, b", "repeat")
    assert _stop("x = foo(", "bar)\n", "foobar)") is None  # "bar)" starts mid-word: not a repeat


def test_unknown_language_uses_indentation_and_brackets() -> None:
    lua = "local function f(x)\n  "
    assert _stop(lua, "\nend\n", "return x + 1\nend\n", None) == ("return x + 1", "block")
    checker = SyntaxChecker("fun f(x: Int) {\n    ", "\n}\n", None)
    assert checker.finalize("return listOf(x, 1\n}\n") == "return listOf"
    assert checker.stop_at("return x + 1\n}") == len("return x + 1")


# --- truncation points -------------------------------------------------------------------------------------


def test_truncation_points_are_line_ends_closers_and_first_line_tokens() -> None:
    text = "f(a, b)\n    g(c))\n"
    points = truncation_points(text, "python")
    assert points == sorted(set(points), reverse=True)
    assert {7, 12, 15, 16, 17} <= set(points)  # line ends, content start, before both closers of line 2
    assert 14 not in points  # mid-token on line 2
    assert {1, 2, 3, 4, 6} <= set(points)  # token ends on line 1


def test_a_second_method_in_a_class_body_stops_with_its_decorators() -> None:
    prefix = "class A:\n    def f(self):\n        return 1\n\n    "
    completion = "def h(self):\n        return 2\n\n    @property\n    def i(self):\n        return 4\n"
    assert _stop(prefix, "\n", completion) == ("def h(self):\n        return 2", "definition")
    java = "int h() {\n        return 2;\n    }\n\n    @Override\n    public String toString() {\n"
    stop = SyntaxChecker("class A {\n    ", "\n}\n", "java").stop(java)  # parses: "}" alone is no repeat
    assert (java[: stop.at], stop.reason) == ("int h() {\n        return 2;\n    }", "definition")


def test_a_nested_helper_inside_a_body_does_not_stop_it() -> None:
    completion = "y = x + 1\n\n    def helper(z):\n        return z\n\n    return helper(y)\n"
    assert _stop("def f(x):\n    ", "\n", completion) is None
