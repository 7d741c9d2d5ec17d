"""LSP answers built from a completion's text: pure functions, one per request kind."""

from __future__ import annotations

import re

from lsprotocol import types

from lsp_server.documents import units_of

_WORD_TAIL = re.compile(r"[A-Za-z0-9_]*$")
LABEL_CHARS = 80


def word_before(line_prefix: str) -> str:
    """The identifier characters just before the cursor, which a completion item replaces.

    >>> word_before("    self.na")
    'na'
    """
    match = _WORD_TAIL.search(line_prefix)
    return match.group(0) if match else ""


def inline_result(text: str, position: types.Position) -> types.InlineCompletionList:
    """textDocument/inlineCompletion: one item inserting the text at the cursor (none for empty text)."""
    items = (
        [types.InlineCompletionItem(insert_text=text, range=types.Range(position, position))] if text else []
    )
    return types.InlineCompletionList(items=items)


def completion_result(
    text: str, line_prefix: str, position: types.Position, encoding: str
) -> types.CompletionList:
    """textDocument/completion: one item with the same text, for clients without inline completion.

    The item replaces the word before the cursor with that word plus the completion, so clients
    that filter items by the typed word keep it.
    """
    if not text:
        return types.CompletionList(is_incomplete=True, items=[])
    word = word_before(line_prefix)
    start = types.Position(position.line, position.character - units_of(word, encoding))
    new_text = word + text
    label = new_text.strip().split("\n")[0][:LABEL_CHARS] or new_text[:LABEL_CHARS]
    item = types.CompletionItem(
        label=label,
        kind=types.CompletionItemKind.Text,
        detail="spec-complete",
        filter_text=new_text,
        sort_text="0",
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=types.Range(start, position), new_text=new_text),
    )
    return types.CompletionList(is_incomplete=True, items=[item])
