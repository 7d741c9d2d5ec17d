"""Metric functions of the offline evaluation: pure functions on strings and numbers."""

import math

import pytest

from eval.metrics import (
    decode_speedup,
    edit_similarity,
    first_difference,
    first_line_exact_match,
    geometric_mean,
    levenshtein,
    median,
    pass_at_k,
    python_parses,
)


def test_first_line_exact_match_ignores_trailing_blanks_and_later_lines():
    assert first_line_exact_match("return x  \nfoo", "return x\nbar")
    assert not first_line_exact_match("return y", "return x")
    # the completion ends the line early: not a match
    assert not first_line_exact_match("return", "return x")


def test_first_line_of_a_body_completion_is_the_line_after_the_cursor_line():
    assert first_line_exact_match("\n    return x\n    y", "\n    return x\n    z")
    assert not first_line_exact_match("\n    return y", "\n    return x")


def test_first_line_exact_match_of_empty_texts():
    assert first_line_exact_match("", "")
    assert not first_line_exact_match("", "x")


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("", "", 0),
        ("abc", "", 3),
        ("kitten", "sitting", 3),  # substitute k->s, e->i, insert g
        ("flaw", "lawn", 2),
        ("same", "same", 0),
    ],
)
def test_levenshtein(a, b, distance):
    assert levenshtein(a, b) == distance
    assert levenshtein(b, a) == distance


def test_edit_similarity_bounds():
    assert edit_similarity("x = 1", "x = 1") == 1.0
    assert edit_similarity("", "") == 1.0
    assert edit_similarity("abc", "xyz") == 0.0
    assert edit_similarity("", "abc") == 0.0


def test_edit_similarity_is_one_minus_normalised_distance():
    # "kitten" -> "sitting": 3 edits over 7 characters
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)


def test_edit_similarity_ignores_trailing_whitespace():
    assert edit_similarity("return x\n", "return x") == 1.0


def test_python_parses():
    assert python_parses("def f():\n    return 1\n")
    assert not python_parses("def f(:\n")
    assert not python_parses("x = 1\0")  # a null byte is a ValueError in ast, not a SyntaxError


def test_pass_at_k():
    assert pass_at_k(1, 1, 1) == 1.0
    assert pass_at_k(1, 0, 1) == 0.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # 1 - C(8, 2) / C(10, 2) = 1 - 28 / 45
    assert pass_at_k(10, 2, 2) == pytest.approx(1 - 28 / 45)
    with pytest.raises(ValueError):
        pass_at_k(1, 1, 2)


def test_decode_speedup_is_a_time_ratio():
    assert decode_speedup(2.0, 1.0) == 2.0
    assert decode_speedup(1.0, 2.0) == 0.5
    assert decode_speedup(0.0, 1.0) is None
    assert decode_speedup(1.0, 0.0) is None


def test_geometric_mean_and_median():
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert geometric_mean([]) is None
    assert math.isclose(geometric_mean([3.0, None, 0.0]), 3.0)  # missing and zero speedups are left out
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 2, 3]) == 2.5
    assert median([]) is None


def test_first_difference():
    assert first_difference("abc", "abc") is None
    assert first_difference("abcd", "abxd") == 2
    assert first_difference("ab", "abc") == 2
    assert first_difference("", "a") == 0


@pytest.mark.parametrize("module", ["eval.metrics", "eval.runner"])
def test_the_docstring_examples_hold(module):
    import doctest
    import importlib

    failed, _ = doctest.testmod(importlib.import_module(module))
    assert failed == 0
