"""The examples in docstrings run: every module of our packages that has one."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("completion_engine", "lsp_server", "eval", "serving")


def modules_with_examples() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>>" in path.read_text(encoding="utf-8"):
                relative = path.relative_to(ROOT).with_suffix("")
                names.append(".".join(part for part in relative.parts if part != "__init__"))
    return names


def test_there_are_examples():
    assert "completion_engine.drafters" in modules_with_examples()


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
