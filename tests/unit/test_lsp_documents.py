"""Document sync: LSP positions (UTF-16 by default), incremental changes, caps."""

import pytest

from lsp_server.documents import (
    DocumentError,
    DocumentLimits,
    DocumentStore,
    TextChange,
    apply_change,
    cursor_context,
    index_of_units,
    line_starts,
    looks_binary,
    offset_at,
    units_of,
)


def test_line_starts_know_every_lsp_line_break():
    assert line_starts("a\nb\r\nc\rd") == [0, 2, 5, 7]
    assert line_starts("") == [0]
    assert line_starts("x\n") == [0, 2]  # the empty last line exists


def test_units_count_the_negotiated_encoding():
    emoji = "\U0001f600"
    assert units_of(f"a{emoji}", "utf-16") == 3
    assert units_of(f"a{emoji}", "utf-8") == 5
    assert units_of(f"a{emoji}", "utf-32") == 2
    assert index_of_units(f"{emoji}x", 2, "utf-16") == 1  # after the emoji
    assert index_of_units(f"{emoji}x", 1, "utf-16") == 0  # inside it: snaps back to its start
    assert index_of_units("é!", 2, "utf-8") == 1


def test_offset_at_clamps_the_character_but_not_the_line():
    text = "ab\ncd\n"
    assert offset_at(text, 1, 1) == 4
    assert offset_at(text, 0, 99) == 2  # the LSP rule: past the line end means the line end
    assert offset_at(text, 2, 0) == 6
    with pytest.raises(DocumentError, match="outside the document"):
        offset_at(text, 3, 0)
    with pytest.raises(DocumentError, match="negative"):
        offset_at(text, -1, 0)


def test_apply_change_edits_ranges_and_replaces_whole_text():
    text = "hello world\n"
    assert apply_change(text, TextChange("there", ((0, 6), (0, 11)))) == "hello there\n"
    assert apply_change(text, TextChange("!", ((5, 0), (9, 0)))) == "hello world\n!"  # past the end: appended
    assert apply_change(text, TextChange("new")) == "new"
    assert apply_change("a\r\nb", TextChange("X", ((1, 0), (1, 1)))) == "a\r\nX"


def test_cursor_context_splits_at_the_cursor():
    cursor = cursor_context("def f():\n    return 1\n", 1, 4)
    assert cursor.prefix == "def f():\n    "
    assert cursor.suffix == "return 1\n"
    assert cursor.line_prefix == "    "


def test_binary_detection():
    assert looks_binary("a\x00b")
    assert looks_binary("\x01\x02\x03\x04 abc")
    assert not looks_binary("tab\tand\nnewline\r\nform\x0cfeed")


def test_store_refuses_huge_and_binary_documents_and_lets_a_full_replacement_back_in():
    store = DocumentStore(DocumentLimits(max_document_bytes=100, max_total_bytes=1000))
    assert "limit" in store.open("file:///big", "x" * 101, 1, "python")
    assert "binary" in store.open("file:///bin", "\x00", 1, "python")
    with pytest.raises(DocumentError) as refused:
        store.get("file:///big")
    assert refused.value.refused
    assert store.change("file:///big", 2, [TextChange("small")]) is None
    assert store.get("file:///big").text == "small"
    assert store.get("file:///big").language_id == "python"


def test_store_bounds_one_clients_total():
    limit_hits = []
    store = DocumentStore(
        DocumentLimits(max_document_bytes=100, max_total_bytes=150), on_limit=limit_hits.append
    )
    assert store.open("file:///a", "a" * 100, 1, "python") is None
    assert store.total_bytes == 100 + len("file:///a")  # the URI counts too
    assert "close some documents" in store.open("file:///b", "b" * 100, 1, "python")
    assert limit_hits == ["total_bytes"]
    store.close("file:///a")
    store.close("file:///b")
    assert store.total_bytes == 0


def test_long_uris_count_against_the_total():
    store = DocumentStore(DocumentLimits(max_document_bytes=100, max_total_bytes=10_000))
    uris = [f"file:///{i}/" + "u" * 4000 for i in range(3)]
    assert store.open(uris[0], "", 1, "python") is None
    assert store.open(uris[1], "", 1, "python") is None
    assert "close some documents" in store.open(uris[2], "", 1, "python")
    assert store.total_bytes <= 10_000


def test_the_number_of_documents_is_bounded_refusals_included():
    limit_hits = []
    store = DocumentStore(DocumentLimits(100, 10_000, max_documents=3), on_limit=limit_hits.append)
    assert store.open("file:///a", "a", 1, "python") is None
    assert "binary" in store.open("file:///b", "\x00", 1, "python")  # refused, but it holds a slot
    assert store.open("file:///c", "c", 1, "python") is None
    assert "3 documents open" in store.open("file:///d", "d", 1, "python")
    assert "file:///d" not in store  # not even its refusal is kept
    assert limit_hits == ["documents"]
    store.close("file:///a")
    assert store.open("file:///d", "d", 1, "python") is None


def test_too_many_changes_in_one_message_refuse_the_document_until_it_is_sent_whole():
    limit_hits = []
    store = DocumentStore(DocumentLimits(100, 10_000, max_changes=2), on_limit=limit_hits.append)
    store.open("file:///a", "abc", 1, "python")
    edits = [TextChange("x", ((0, 0), (0, 0)))] * 3
    assert "3 changes" in store.change("file:///a", 2, edits)
    assert limit_hits == ["changes"]
    with pytest.raises(DocumentError) as refused:
        store.get("file:///a")
    assert refused.value.refused
    assert store.change("file:///a", 3, [TextChange("whole")]) is None
    assert store.get("file:///a").text == "whole"


def test_store_applies_changes_in_order_and_rejects_unknown_documents():
    store = DocumentStore(DocumentLimits(1000, 1000))
    store.open("file:///a", "abc", 1, "python")
    store.change("file:///a", 2, [TextChange("X", ((0, 1), (0, 1))), TextChange("Y", ((0, 0), (0, 1)))])
    assert store.get("file:///a").text == "YXbc"
    with pytest.raises(DocumentError, match="not open"):
        store.change("file:///nope", 1, [TextChange("x", ((0, 0), (0, 0)))])
    with pytest.raises(DocumentError, match="not open"):
        store.get("file:///nope")


def test_lone_surrogates_become_replacement_characters():
    store = DocumentStore(DocumentLimits(1000, 1000))
    store.open("file:///s", "a\ud800b", 1, "python")
    assert store.get("file:///s").text == "a\ufffdb"
