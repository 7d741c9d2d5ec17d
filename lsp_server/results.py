"""LSP answers built from a completion's text: pure functions, one per request kind."""

from __future__ import annotations

import re

from lsprotocol import types

from lsp_server.documents import units_of

_WORD_TAIL = re.compile(r"[A-Za-z0-9_]*$")
LABEL_CHARS = 80
# The command an item carries: the editor runs it when the user accepts the item whole (as Copilot's
# items do), so the server hears of the accept. Its arguments: [suggestion id, code units typed through].
ACCEPT_COMMAND = "specComplete.didAcceptCompletion"


def accept_command(suggestion: str, skipped: int) -> types.Command | None:
    if not suggestion:
        return None
    return types.Command(
        title="spec-complete: accepted", command=ACCEPT_COMMAND, arguments=[suggestion, skipped]
    )


def suggestion_ref(arguments: object) -> tuple[str, int]:
    """(suggestion id, code units typed through) from an accept command's arguments.

    >>> suggestion_ref(["s3", 2])
    ('s3', 2)
    >>> suggestion_ref(["s3"])
    Traceback (most recent call last):
    ...
    ValueError: arguments must be [suggestion id, code units typed through (an integer >= 0)], not ['s3']
    """
    if (
        not isinstance(arguments, list | tuple)
        or len(arguments) != 2
        or not isinstance(arguments[0], str)
        or isinstance(arguments[1], bool)
        or not isinstance(arguments[1], int)
        or arguments[1] < 0
    ):
        raise ValueError(
            "arguments must be [suggestion id, code units typed through (an integer >= 0)], "
            f"not {arguments!r:.80}"
        )
    return arguments[0], arguments[1]


def reported_item(params: object) -> tuple[str, int]:
    """The suggestion a didShowCompletion / didPartiallyAcceptCompletion names: `item` is an inline
    completion item this server answered, whose command carries the suggestion's id."""
    item = params.get("item") if isinstance(params, dict) else None
    command = item.get("command") if isinstance(item, dict) else None
    if not isinstance(command, dict) or command.get("command") != ACCEPT_COMMAND:
        raise ValueError(
            "params.item must be an inline completion item from this server "
            f"(its command is {ACCEPT_COMMAND}), not {item!r:.80}"
        )
    return suggestion_ref(command.get("arguments"))


def accepted_length(params: dict) -> int:
    """didPartiallyAcceptCompletion's acceptedLength: code units of the item accepted, from its start.

    >>> accepted_length({"acceptedLength": 4})
    4
    """
    value = params.get("acceptedLength")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"acceptedLength must be an integer >= 0, not {value!r:.40}")
    return value


def word_before(line_prefix: str) -> str:
    """The identifier characters just before the cursor, which a completion item replaces.

    >>> word_before("    self.na")
    'na'
    """
    match = _WORD_TAIL.search(line_prefix)
    return match.group(0) if match else ""


def inline_result(
    text: str, position: types.Position, command: types.Command | None = None
) -> types.InlineCompletionList:
    """textDocument/inlineCompletion: one item inserting the text at the cursor (none for empty text)."""
    items = (
        [types.InlineCompletionItem(insert_text=text, range=types.Range(position, position), command=command)]
        if text
        else []
    )
    return types.InlineCompletionList(items=items)


def completion_result(
    text: str,
    line_prefix: str,
    position: types.Position,
    encoding: str,
    command: types.Command | None = None,
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
        command=command,
    )
    return types.CompletionList(is_incomplete=True, items=[item])
