"""Completions the server has answered, kept so that typing through one costs no model call.

A suggestion is one model completion at one cursor state. The editor may show it; the user may type
its first characters (typing through), accept part of it (a word, a line) or all of it. The cache
answers a request at a state it knows:

    known state   prefix "def add(a, b):"   suffix ""   completion "\\n    return a + b"
    same state (an undo or redo back to it)        -> "\\n    return a + b"
    prefix "def add(a, b):\\n    ret", same suffix  -> "urn a + b"  (7 characters typed through)

A hit is the text the model wrote for the known state, cut; it is not a new model call. States are
compared by hashes of the whole text before and after the cursor and of everything else the prompt
is built from (settings, language, path, other files): the same hashes mean the same prompt, so the
same model output, which is why the key is not a window around the cursor.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

from lsp_server.worker import CompletionInput

SUGGESTIONS_KEPT = 64  # per client: recent enough to cover undo/redo and the suggestions on screen


@dataclass(frozen=True, slots=True)
class CursorState:
    """The document around a cursor, as far as a completion there depends on it (hashes, not text)."""

    prefix_len: int
    prefix_hash: int
    suffix_len: int
    suffix_hash: int
    inputs_hash: int  # settings, language, path and other files


def state_of(prefix: str, suffix: str, inputs_hash: int = 0) -> CursorState:
    return CursorState(len(prefix), hash(prefix), len(suffix), hash(suffix), inputs_hash)


def cursor_state(request: CompletionInput) -> CursorState:
    """The state a completion request starts from (its seed aside: sampling may differ, greedy does not)."""
    inputs = hash((request.settings, request.language_id, request.path, request.other_files))
    return state_of(request.cursor.prefix, request.cursor.suffix, inputs)


def typed_since(known: CursorState, prefix: str, now: CursorState) -> str | None:
    """What was typed at `known`'s cursor to reach `now` ("" for the same state); None if `now` is
    not `known` with text inserted at its cursor. `prefix` is the text before `now`'s cursor.

    >>> known = state_of("x = ", "\\n")
    >>> typed_since(known, "x = 4", state_of("x = 4", "\\n"))
    '4'
    >>> typed_since(known, "y = 4", state_of("y = 4", "\\n")) is None
    True
    """
    if now.suffix_hash != known.suffix_hash or now.inputs_hash != known.inputs_hash:
        return None
    if now.suffix_len != known.suffix_len:
        return None
    if now.prefix_len < known.prefix_len or len(prefix) != now.prefix_len:
        return None
    if hash(prefix[: known.prefix_len]) != known.prefix_hash:
        return None
    return prefix[known.prefix_len :]


def remainder(text: str, typed: str) -> str | None:
    """The rest of a completion once `typed` was typed through it; None when it is not its start or
    nothing would be left.

    >>> remainder("return a + b", "ret"), remainder("return a + b", "x"), remainder("ab", "ab")
    ('urn a + b', None, None)
    """
    return text[len(typed) :] if text.startswith(typed) and len(typed) < len(text) else None


@dataclass(slots=True, eq=False)
class Suggestion:
    """One completion the server answered, and what the editor reported about it."""

    id: str
    uri: str
    state: CursorState
    text: str
    draft: str  # the draft method that made it
    language_id: str
    shown: bool = False
    accepted: bool = False  # wholly
    accepted_chars: int = 0  # the furthest a partial accept reached, in characters of `text`


@dataclass(frozen=True, slots=True)
class Hit:
    suggestion: Suggestion
    typed: str  # characters of its text already typed ("" for the same state)

    @property
    def text(self) -> str:
        return self.suggestion.text[len(self.typed) :]


class SuggestionCache:
    """One client's recent suggestions, least recently used first out. Used on the event loop only."""

    def __init__(self, size: int = SUGGESTIONS_KEPT) -> None:
        self._size = size
        self._entries: OrderedDict[str, Suggestion] = OrderedDict()
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, uri: str, state: CursorState, text: str, draft: str, language_id: str) -> Suggestion:
        """Keep a completion; one at the same state as an older one replaces it."""
        for old in [s for s in self._entries.values() if s.uri == uri and s.state == state]:
            del self._entries[old.id]
        suggestion = Suggestion(f"s{next(self._ids)}", uri, state, text, draft, language_id)
        self._entries[suggestion.id] = suggestion
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return suggestion

    def get(self, suggestion_id: str) -> Suggestion | None:
        return self._entries.get(suggestion_id)

    def lookup(self, uri: str, prefix: str, state: CursorState) -> Hit | None:
        """The newest suggestion that answers a request at `state`: the same state, or typed through."""
        for suggestion in reversed(self._entries.values()):
            known = suggestion.state
            if suggestion.uri != uri or not known.prefix_len <= state.prefix_len < known.prefix_len + len(
                suggestion.text
            ):
                continue
            typed = typed_since(known, prefix, state)
            if typed is not None and remainder(suggestion.text, typed) is not None:
                self._entries.move_to_end(suggestion.id)
                return Hit(suggestion, typed)
        return None

    def forget(self, uri: str) -> None:
        for suggestion_id in [s.id for s in self._entries.values() if s.uri == uri]:
            del self._entries[suggestion_id]
