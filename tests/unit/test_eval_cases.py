"""Case selection: cursor points in a source tree, picked deterministically from a seed."""

import textwrap

import pytest

from eval.cases import BODY, STATEMENT, humaneval_cases, humaneval_program, repo_cases

SHAPES = '''\
"""Shapes."""

import math


def area(radius):
    """Area of a circle."""
    squared = radius * radius
    return math.pi * squared


class Square:
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side ** 2

    def scaled(self, factor):
        new_side = self.side * factor
        return Square(new_side)
'''

UTIL = """\
def clamp(value, low, high):
    if value < low:
        return low
    return min(value, high)


def mean(values):
    total = sum(values)
    return total / len(values)
"""


@pytest.fixture()
def package(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "shapes.py").write_text(SHAPES)
    (root / "util.py").write_text(UTIL)
    (root / "sub" / "more.py").write_text("def twice(x):\n    y = x + x\n    return y\n")
    (root / "broken.py").write_text("def broken(:\n")  # does not parse: left out
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "cached.py").write_text("x = 1\n")
    return root


def test_every_case_splits_its_file_exactly(package):
    cases = repo_cases(package, limit=20, seed=0)
    assert cases
    for case in cases:
        path = case.case_id.split(":")[0]
        assert case.prefix + case.reference + case.suffix == (package / path).read_text()
        assert case.reference.strip()


def test_selection_is_deterministic_and_seeded(package):
    first = [c.case_id for c in repo_cases(package, limit=6, seed=0)]
    assert first == [c.case_id for c in repo_cases(package, limit=6, seed=0)]
    others = [[c.case_id for c in repo_cases(package, limit=6, seed=s)] for s in range(1, 6)]
    assert any(o != first for o in others)


def test_kinds_alternate_body_and_statement(package):
    kinds = [c.kind for c in repo_cases(package, limit=4, seed=3)]
    assert kinds == [BODY, STATEMENT, BODY, STATEMENT]


def test_body_cursor_ends_the_line_before_the_body(package):
    bodies = [c for c in repo_cases(package, limit=40, seed=0) if c.kind == BODY]
    area = next(c for c in bodies if c.case_id.startswith("shapes.py:7:"))
    assert area.case_id == "shapes.py:7:27:body"  # line 7 is the docstring, 27 characters long
    assert area.prefix.endswith('"""Area of a circle."""')
    assert area.reference == "\n    squared = radius * radius\n    return math.pi * squared"
    assert area.suffix.startswith("\n\n\nclass Square:")
    assert area.min_indent == 4
    assert area.stop_mode == "body"


def test_statement_cursor_sits_between_tokens_inside_the_statement(package):
    statements = [c for c in repo_cases(package, limit=40, seed=0) if c.kind == STATEMENT]
    assert statements
    for case in statements:
        line_start = case.prefix[case.prefix.rfind("\n") + 1 :]
        assert line_start.strip()  # something of the statement is before the cursor
        assert any(ch.isalnum() for ch in case.reference)  # and something worth completing after it
        assert "\n" not in case.reference.rstrip() or case.reference.count("\n") <= 2
        assert case.stop_mode == "statement"


def test_open_documents_are_other_files_of_the_package(package):
    for case in repo_cases(package, limit=10, seed=0, open_count=2):
        path = case.case_id.split(":")[0]
        assert path not in case.open_documents
        assert len(case.open_documents) == 2
        assert "broken.py" not in case.open_documents
        assert not any("__pycache__" in d for d in case.open_documents)


def test_an_empty_tree_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        repo_cases(tmp_path, limit=3)


def test_humaneval_cases_come_from_the_package():
    cases = humaneval_cases(3)
    assert [c.case_id for c in cases] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    first = cases[0]
    assert first.prefix.endswith('"""')  # the trailing line break went to the reference
    assert first.reference.startswith("\n    for idx")
    assert first.entry_point == "has_close_elements"
    assert first.min_indent == 4
    assert "def check(candidate)" in first.tests


def test_the_canonical_solution_makes_a_passing_program():
    from eval.sandbox import run_python

    case = humaneval_cases(1)[0]
    assert run_python(humaneval_program(case, case.reference)).passed
    assert not run_python(humaneval_program(case, "\n    return None\n")).passed


def test_humaneval_program_layout():
    case = humaneval_cases(1)[0]
    program = humaneval_program(case, "\n    return True")
    assert program.startswith(case.prefix + "\n    return True\n")
    assert program.rstrip().endswith("check(has_close_elements)")
    assert textwrap.dedent(case.tests).strip() in program
