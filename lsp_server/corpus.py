"""Feeding the open documents into the engine's n-gram corpus, lazily and within a token budget.

Edits only record the latest text (the event-loop thread); the model worker tokenises what changed
just before it generates, so a burst of keystrokes costs one tokenisation, not one per keystroke.
The corpus holds at most `max_tokens` tokens: closed documents leave at once, and when the budget
is exceeded the least recently edited documents go first.

Tokenising happens before *any* client's completion, so a client that keeps editing a large
document would make every other client wait for it (1 MB: seconds per request). A document already
in the corpus is therefore re-read only once its edits have paused for `quiet_s`; until then the
corpus keeps its older text, which only makes n-gram drafts a little less apt (verification keeps
completions exact). New documents and closes are taken at once.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

QUIET_S = 2.0  # an indexed document is re-read once its edits have paused this long


class CorpusEngine(Protocol):
    """The part of CompletionEngine the feed uses (all calls happen on the model worker's thread)."""

    def encode(self, text: str) -> list[int]: ...

    def remove_document(self, doc_id: str) -> None: ...


class CorpusFeed:
    def __init__(
        self, max_tokens: int, quiet_s: float = QUIET_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_tokens = max_tokens
        self.quiet_s = quiet_s
        self._clock = clock
        self._lock = threading.Lock()
        # doc_id -> (latest text, or None to remove; when it was recorded)
        self._pending: dict[str, tuple[str | None, float]] = {}
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
            self._pending[doc_id] = (text, self._clock())

    def remove(self, doc_id: str) -> None:
        with self._lock:
            self._pending.pop(doc_id, None)
            self._pending[doc_id] = (None, self._clock())

    def sync(self, engine: CorpusEngine, set_tokens) -> None:
        """Apply recorded changes to the engine (model worker thread only).

        set_tokens(doc_id, tokens) stores a tokenised document in the engine's corpus.
        """
        now = self._clock()
        with self._lock:
            pending = {
                doc_id: text
                for doc_id, (text, recorded) in self._pending.items()
                if text is None or doc_id not in self._indexed or now - recorded >= self.quiet_s
            }
            for doc_id in pending:
                del self._pending[doc_id]
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
