"""Many edits in one didChange: the line-based path gives exactly what one edit at a time gives."""

import random

import pytest

from lsp_server.documents import apply_change
from lsp_server.edits import TextChange, apply_changes, split_lines


def one_at_a_time(text: str, changes: list[TextChange], encoding: str = "utf-16") -> str:
    for change in changes:
        text = apply_change(text, change, encoding)
    return text


def test_split_lines_keeps_every_line_break():
    assert split_lines("") == [""]
    assert split_lines("a\nb") == ["a\n", "b"]
    assert split_lines("a\r\n\r\n") == ["a\r\n", "\r\n", ""]


@pytest.mark.parametrize(
    "text, changes, expected",
    [
        ("ab\ncd", [TextChange("X", ((1, 1), (1, 1)))], "ab\ncXd"),
        ("ab\ncd", [TextChange("", ((0, 1), (1, 1)))], "ad"),  # joins two lines
        ("ab\ncd", [TextChange("1\n2\n", ((0, 2), (0, 2)))], "ab1\n2\n\ncd"),  # splits one
        ("a\rX\nb", [TextChange("", ((1, 0), (1, 1)))], "a\r\nb"),  # "\r" meets "\n": one break now
        ("a\r\nb", [TextChange("", ((0, 1), (0, 1))), TextChange("Y", ((1, 0), (1, 1)))], "a\r\nY"),
        ("abc", [TextChange("Z", ((9, 0), (9, 9)))], "abcZ"),  # past the end: appended
        ("abc", [TextChange("Z", ((0, 2), (0, 1)))], "aZc"),  # reversed range
        ("abc", [TextChange("new"), TextChange("!", ((0, 3), (0, 3)))], "new!"),
    ],
)
def test_worked_examples(text, changes, expected):
    assert apply_changes(text, changes) == expected == one_at_a_time(text, changes)


@pytest.mark.parametrize("seed", range(30))
def test_random_edit_sequences_match_one_at_a_time(seed):
    rng = random.Random(seed)
    alphabet = ["a", "b", " ", "\n", "\r", "\r\n", "\U0001f600", "é", "\x0c", "\u2028"]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
    changes = []
    for _ in range(rng.randrange(1, 20)):
        if rng.random() < 0.05:
            changes.append(TextChange("".join(rng.choice(alphabet) for _ in range(rng.randrange(5)))))
            continue
        start = (rng.randrange(12), rng.randrange(8))
        end = (rng.randrange(12), rng.randrange(8))
        inserted = "".join(rng.choice(alphabet) for _ in range(rng.randrange(4)))
        changes.append(TextChange(inserted, (start, end)))
    for encoding in ("utf-16", "utf-8", "utf-32"):
        assert apply_changes(text, changes, encoding) == one_at_a_time(text, changes, encoding)


def test_split_lines_ignores_the_breaks_lsp_does_not_know():
    assert split_lines("a\x0cb\u2028c\nd") == ["a\x0cb\u2028c\n", "d"]
    assert split_lines("a\x85\r") == ["a\x85\r", ""]


def test_the_store_keeps_the_lines_of_the_document_being_typed_in_step():
    from lsp_server.documents import DocumentLimits, DocumentStore

    rng = random.Random(7)
    store = DocumentStore(DocumentLimits(10_000, 100_000))
    texts = {"file:///a": "one\ntwo\r\nthree\n", "file:///b": "x\ry\n"}
    for uri, text in texts.items():
        store.open(uri, text, 1, "python")
    for version in range(2, 60):
        uri = rng.choice(list(texts))  # switching documents drops the kept lines; coming back re-splits
        changes = [
            TextChange(
                rng.choice(["", "z", "\n", "\r", "é\r\n"]), ((rng.randrange(5), rng.randrange(6)),) * 2
            )
            for _ in range(rng.randrange(1, 4))
        ]
        assert store.change(uri, version, changes) is None
        texts[uri] = one_at_a_time(texts[uri], changes)
        assert store.get(uri).text == texts[uri]
