"""Feeding the open documents into the engine's n-gram corpus, lazily and within a token budget.

Edits only record the latest text (the event-loop thread); the model worker tokenises what changed
just before it generates, so a burst of keystrokes costs one tokenisation, not one per keystroke.
The corpus holds at most `max_tokens` tokens: closed documents leave at once, and when the budget
is exceeded the least recently edited documents go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol


class CorpusEngine(Protocol):
    """The part of CompletionEngine the feed uses (all calls happen on the model worker's thread)."""

    def encode(self, text: str) -> list[int]: ...

    def remove_document(self, doc_id: str) -> None: ...


class CorpusFeed:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._pending: dict[str, str | None] = {}  # doc_id -> latest text, or None to remove
        self._indexed: OrderedDict[str, int] = OrderedDict()  # doc_id -> tokens, least recent first

    @property
    def total_tokens(self) -> int:
        return sum(self._indexed.values())

    @property
    def documents(self) -> int:
        return len(self._indexed)

    def update(self, doc_id: str, text: str) -> None:
        """Record a document's latest text (any thread)."""
        with self._lock:
            self._pending.pop(doc_id, None)
            self._pending[doc_id] = text

    def remove(self, doc_id: str) -> None:
        with self._lock:
            self._pending.pop(doc_id, None)
            self._pending[doc_id] = None

    def sync(self, engine: CorpusEngine, set_tokens) -> None:
        """Apply recorded changes to the engine (model worker thread only).

        set_tokens(doc_id, tokens) stores a tokenised document in the engine's corpus.
        """
        with self._lock:
            pending, self._pending = self._pending, {}
        for doc_id, text in pending.items():
            self._indexed.pop(doc_id, None)
            if text is None:
                engine.remove_document(doc_id)
                continue
            tokens = engine.encode(text)
            if len(tokens) > self.max_tokens:
                engine.remove_document(doc_id)
                continue
            set_tokens(doc_id, tokens)
            self._indexed[doc_id] = len(tokens)
        total = self.total_tokens
        while total > self.max_tokens and self._indexed:
            oldest, count = self._indexed.popitem(last=False)
            engine.remove_document(oldest)
            total -= count
