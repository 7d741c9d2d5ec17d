"""The documents a client has open, kept from what the client sent (never read from disk).

Positions follow LSP: a line ends at \\n, \\r\\n or \\r; a character offset counts code units of the
negotiated position encoding ("utf-16" unless the client chose another). A character past the end
of its line means the line's end (as the LSP specification says); a line past the end of the
document is an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# TextChange and index_of_units live in edits.py (the lower layer); callers may import them from here
from lsp_server.edits import TextChange, edit_lines, index_of_units, split_lines

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")  # two UTF-16 code units each
_SURROGATE = re.compile("[\ud800-\udfff]")  # lone surrogates from JSON escapes: not text
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f]")


class DocumentError(Exception):
    """A request named a document or position the server cannot use; the message says why."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused  # the document exists but was refused (too large, binary)


@dataclass(slots=True)
class OpenDocument:
    uri: str
    text: str
    version: int
    language_id: str
    size: int  # UTF-8 bytes of text


@dataclass(frozen=True, slots=True)
class CursorContext:
    """The text around the cursor, split where the completion goes."""

    prefix: str  # everything before the cursor
    suffix: str  # everything after it
    line_prefix: str  # the cursor's line up to the cursor


# -- pure functions -------------------------------------------------------------------------------


def clean_text(text: str) -> str:
    """Lone surrogates (which JSON allows and UTF-8 cannot hold) become U+FFFD, one code unit each."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


def looks_binary(text: str, sample: int = 8192) -> bool:
    """NUL anywhere, or many control characters early on: not source code.

    >>> looks_binary("def f():\\n\\treturn 1\\n"), looks_binary("PK\\x03\\x04\\x00\\x00")
    (False, True)
    """
    if "\x00" in text:
        return True
    head = text[:sample]
    return len(head) > 0 and len(_CONTROL.findall(head)) > len(head) // 10


def line_starts(text: str) -> list[int]:
    """Offset where each line begins; the last line may be empty.

    >>> line_starts("ab\\r\\ncd\\ne")
    [0, 4, 7]
    """
    return [0, *(m.end() for m in _LINE_BREAK.finditer(text))]


def line_end(text: str, starts: list[int], line: int) -> int:
    """Offset of the end of a line's content (before its line break)."""
    if line + 1 >= len(starts):
        return len(text)
    end = starts[line + 1]
    if text[end - 1] == "\n":
        end -= 1
        if end > starts[line] and text[end - 1] == "\r":
            end -= 1
    elif text[end - 1] == "\r":
        end -= 1
    return end


def units_of(text: str, encoding: str) -> int:
    """Code units of `text` in a position encoding."""
    if encoding == "utf-8":
        return utf8_size(text)
    if encoding == "utf-32":
        return len(text)
    return len(text) + len(_ASTRAL.findall(text))


def offset_at(
    text: str, line: int, character: int, encoding: str = "utf-16", clamp_line: bool = False
) -> int:
    """Offset in `text` of an LSP position. A line past the end raises, or with clamp_line means the end.

    >>> offset_at("ab\\ncd", 1, 1), offset_at("ab\\ncd", 0, 99)
    (4, 2)
    """
    starts = line_starts(text)
    if line < 0 or character < 0:
        raise DocumentError(f"position {line}:{character} has a negative line or character")
    if line >= len(starts):
        if clamp_line:
            return len(text)
        raise DocumentError(
            f"position {line}:{character} is outside the document, which has {len(starts)} line(s) (0-based)"
        )
    start, end = starts[line], line_end(text, starts, line)
    return start + index_of_units(text[start:end], character, encoding)


def apply_change(text: str, change: TextChange, encoding: str = "utf-16") -> str:
    """The text after one content change; a range past the end is clamped to the end (as editors do)."""
    if change.range is None:
        return change.text
    (start_line, start_char), (end_line, end_char) = change.range
    start = offset_at(text, start_line, start_char, encoding, clamp_line=True)
    end = offset_at(text, end_line, end_char, encoding, clamp_line=True)
    start, end = min(start, end), max(start, end)
    return text[:start] + change.text + text[end:]


def cursor_context(text: str, line: int, character: int, encoding: str = "utf-16") -> CursorContext:
    offset = offset_at(text, line, character, encoding)
    line_start = line_starts(text)[line]
    return CursorContext(prefix=text[:offset], suffix=text[offset:], line_prefix=text[line_start:offset])


def refusal(uri: str, text: str, size: int, max_bytes: int) -> str | None:
    """Why a document's text cannot be used for completions, or None when it can."""
    if size > max_bytes:
        return (
            f"{uri} is {size / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB limit (--max-document-kb): "
            "no completions in it, and it does not feed the n-gram corpus"
        )
    if looks_binary(text):
        return f"{uri} looks binary (NUL or control characters): no completions in it"
    return None


# -- one client's open documents ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    """What one client may hold; a message over a limit is refused (and the refusal counted)."""

    max_document_bytes: int  # one document's text
    max_total_bytes: int  # all its documents: text, URIs and the refusals kept for refused ones
    max_documents: int = 1000  # open documents, refused ones included
    max_changes: int = 1000  # content changes in one didChange


class DocumentStore:
    """The open documents of one client. Refused documents keep only the reason, not their text.

    `on_limit(name)` is called whenever a limit refuses something ("document_bytes", "total_bytes",
    "documents", "changes"); the session counts these.
    """

    def __init__(
        self,
        limits: DocumentLimits,
        encoding: str = "utf-16",
        on_limit: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.limits = limits
        self.encoding = encoding
        self._on_limit = on_limit
        self._open: dict[str, OpenDocument] = {}
        self._refused: dict[str, tuple[str, str]] = {}  # uri -> (reason, language id)
        self.total_bytes = 0  # kept as documents come and go: never re-summed
        # The lines of the document changed last (one: typing happens in one document at a time),
        # so the next didChange there skips splitting the whole text again.
        self._lines: tuple[str, list[str]] | None = None

    def __contains__(self, uri: str) -> bool:
        return uri in self._open or uri in self._refused

    def __len__(self) -> int:
        return len(self._open)

    def is_refused(self, uri: str) -> bool:
        return uri in self._refused

    @property
    def uris(self) -> list[str]:
        return [*self._open, *self._refused]

    def open(self, uri: str, text: str, version: int, language_id: str) -> str | None:
        """Add a document; returns why it was refused, or None."""
        self.close(uri)
        return self._store(uri, clean_text(text), version, language_id)

    def change(self, uri: str, version: int, changes: list[TextChange]) -> str | None:
        """Apply content changes in order; returns why the document is now refused, or None."""
        if len(changes) > self.limits.max_changes:
            language_id = self._open[uri].language_id if uri in self._open else ""
            self.close(uri)
            self._on_limit("changes")
            return self.refuse(
                uri,
                f"{uri}: one didChange carried {len(changes)} changes, over the limit of "
                f"{self.limits.max_changes}: no completions in it until its whole text is sent",
                language_id,
            )
        if uri in self._refused:
            whole = [c for c in changes if c.range is None]
            if whole:  # a full replacement lets a refused document back in
                _, language_id = self._refused[uri]
                self.close(uri)
                return self._store(uri, clean_text(whole[-1].text), version, language_id)
            return None
        doc = self._open.get(uri)
        if doc is None:
            raise DocumentError(f"{uri} is not open: didChange before didOpen")
        cleaned = [TextChange(clean_text(c.text), c.range) for c in changes]
        cached = self._lines is not None and self._lines[0] == uri
        try:
            lines = edit_lines(self._lines[1] if cached else split_lines(doc.text), cleaned, self.encoding)
        except BaseException:
            self._lines = None  # edited in place, part way: no longer the document's lines
            raise
        self.close(uri)
        refused = self._store(uri, "".join(lines), version, doc.language_id)
        self._lines = (uri, lines) if refused is None else None
        return refused

    def close(self, uri: str) -> None:
        if self._lines is not None and self._lines[0] == uri:
            self._lines = None
        doc = self._open.pop(uri, None)
        if doc is not None:
            self.total_bytes -= _held(uri, doc.size)
        refused = self._refused.pop(uri, None)
        if refused is not None:
            self.total_bytes -= _held(uri, len(refused[0]))

    def get(self, uri: str) -> OpenDocument:
        doc = self._open.get(uri)
        if doc is not None:
            return doc
        if uri in self._refused:
            raise DocumentError(self._refused[uri][0], refused=True)
        raise DocumentError(
            f"{uri} is not open: send textDocument/didOpen first (the server uses only the text clients send)"
        )

    def refuse(self, uri: str, reason: str, language_id: str = "") -> str:
        """Keep `reason` as the answer for `uri` (when it fits: a flood of refusals must not grow
        without bound either); returns the reason."""
        self.close(uri)
        cost = _held(uri, len(reason))
        if len(self) + len(self._refused) < self.limits.max_documents:
            if self.total_bytes + cost <= self.limits.max_total_bytes:
                self._refused[uri] = (reason, language_id)
                self.total_bytes += cost
        return reason

    def _store(self, uri: str, text: str, version: int, language_id: str) -> str | None:
        size = utf8_size(text)
        reason = refusal(uri, text, size, self.limits.max_document_bytes)
        if reason is not None and size > self.limits.max_document_bytes:
            self._on_limit("document_bytes")
        if reason is None and len(self._open) + len(self._refused) >= self.limits.max_documents:
            self._on_limit("documents")
            return (  # not kept at all: keeping the refusal would itself take a slot
                f"{uri} was not opened: this client has {self.limits.max_documents} documents open "
                "(the limit); close some documents"
            )
        if reason is None and self.total_bytes + _held(uri, size) > self.limits.max_total_bytes:
            self._on_limit("total_bytes")
            reason = (
                f"{uri} does not fit: this client's open documents would exceed "
                f"{self.limits.max_total_bytes / 1e6:.0f} MB; close some documents"
            )
        if reason is not None:
            return self.refuse(uri, reason, language_id)
        self._open[uri] = OpenDocument(uri, text, version, language_id, size)
        self.total_bytes += _held(uri, size)
        return None


def _held(uri: str, size: int) -> int:
    """Bytes one entry holds against the client's total: its text (or refusal) and its URI."""
    return size + utf8_size(uri)
