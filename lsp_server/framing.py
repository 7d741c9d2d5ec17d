"""Content-Length framing over a byte stream (stdio), with recovery from bad frames.

A frame is a header block (`Name: value` lines, one of them `Content-Length: N`, then a blank line)
and N bytes of body. A frame the reader cannot use becomes a BadFrame, which the transport answers
with an error, and the stream is resynchronised: bytes are skipped up to the next `Content-Length:`
(wherever it starts: after a body that was longer than its header said, the next header follows
the leftover on the same line). So a client that gets one frame wrong loses that frame (and, when
its length was too long, the frame the body ran into), never the connection.

A body over the size limit is read and thrown away in pieces (memory stays bounded), but its first
and last bytes are kept to find the message's id, method and document URI: the transport can then
answer the request, or tell the client which notification was dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Protocol

HEADER_LINE = 8192  # longest header line; a longer one is not a header
PEEK_BYTES = 64 * 1024  # kept from each end of an oversized body to find its id and method
_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*\r?\n")
_LENGTH_NAME = b"content-length:"

# The leading members of a JSON object, while their values are scalars: {"jsonrpc": "2.0", "id": 7, ...
_STRING = rb'"(?:[^"\\]|\\.)*"'
_SCALAR = rb"(?:" + _STRING + rb"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null)"
_MEMBER = re.compile(rb"\s*(" + _STRING + rb")\s*:\s*(" + _SCALAR + rb")\s*([,}])")
# A scalar last member closes the top-level object: ..., "id": 7}
_LAST_MEMBER = re.compile(rb"[,{]\s*(" + _STRING + rb")\s*:\s*(" + _SCALAR + rb")\s*}\s*$")
_URI = re.compile(rb'"uri"\s*:\s*(' + _STRING + rb")")


class ByteStream(Protocol):
    def readline(self, limit: int = -1) -> bytes: ...
    def read(self, n: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame that was skipped; what could be read of it, so the client can be told."""

    reason: str
    msg_id: int | str | None = None  # the request's id, when it could be read
    method: str | None = None
    uri: str | None = None  # the first "uri" in the body (a dropped didOpen's document)


def peek_fields(head: bytes, tail: bytes) -> tuple[int | str | None, str | None, str | None]:
    """The id, method and first URI of a JSON-RPC message seen only by its first and last bytes.

    Only top-level members are read: the scalar members before the first nested value, and a
    scalar last member.

    >>> peek_fields(b'{"jsonrpc": "2.0", "id": 7, "method": "x/y", "params": {"id": 9, "te', b'xt": ""}}')
    (7, 'x/y', None)
    >>> head = b'{"method": "m", "params": {"textDocument": {"uri": "file:///a.py", "te'
    >>> peek_fields(head, b'"}}, "id": "q"}')
    ('q', 'm', 'file:///a.py')
    """
    members: dict[str, object] = {}
    if head.lstrip().startswith(b"{"):
        position = head.index(b"{") + 1
        while (match := _MEMBER.match(head, position)) is not None:
            members.setdefault(_decode(match.group(1)), _decode(match.group(2)))
            if match.group(3) == b"}":
                break
            position = match.end()
    if (last := _LAST_MEMBER.search(tail)) is not None:
        members.setdefault(_decode(last.group(1)), _decode(last.group(2)))
    msg_id = members.get("id")
    if isinstance(msg_id, bool) or not isinstance(msg_id, int | str):
        msg_id = None
    method = members.get("method")
    uri = _URI.search(head)
    return msg_id, method if isinstance(method, str) else None, _decode(uri.group(1)) if uri else None


def _decode(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


class FrameReader:
    """Reads Content-Length framed bodies from a blocking byte stream (one reader thread)."""

    def __init__(self, stream: ByteStream, max_bytes: int) -> None:
        self._stream = stream
        self.max_bytes = max_bytes
        self._lost = False  # after a bad frame: skip to the next Content-Length header
        self._pending: bytes | None = None  # a header line found while skipping

    def next(self) -> bytes | BadFrame | None:
        """The next body (possibly empty); a BadFrame for one that was skipped; None at end of input."""
        length_value: bytes | None = None
        in_header = False
        while True:
            line = self._next_line()
            if not line:
                return None
            if not line.strip():
                if in_header:
                    break
                continue  # blank lines between frames
            in_header = True
            header = _HEADER.fullmatch(line)
            if header is None:
                return self._bad(f"malformed header line {line[:60]!r}: expected `Name: value`", line)
            if header.group(1).lower() == b"content-length":
                length_value = header.group(2)
        if length_value is None:
            return self._bad("a header block without Content-Length")
        if not length_value.isdigit():  # "-5", "+5", "5.0", "", "abc"
            return self._bad(f"Content-Length must be a non-negative integer, not {length_value[:40]!r}")
        length = int(length_value)
        if length > self.max_bytes:
            return self._skip_body(length)
        body = self._stream.read(length)
        return body if len(body) == length else None

    def _next_line(self) -> bytes:
        if self._pending is not None:
            line, self._pending = self._pending, None
            return line
        if self._lost:
            self._lost = False
            return self._find_header()
        return self._stream.readline(HEADER_LINE)

    def _bad(self, reason: str, line: bytes = b"") -> BadFrame:
        """Start skipping; a header glued to the end of the bad line (after a body that ran over) is kept."""
        self._lost = True
        found = line.lower().find(_LENGTH_NAME, 1)
        if found > 0:
            self._pending, self._lost = line[found:], False
        return BadFrame(f"bad frame: {reason}; skipped to the next Content-Length header")

    def _find_header(self) -> bytes:
        """Skip bytes up to the next `Content-Length:`; return that header line (b"" at end of input)."""
        carry = b""
        while True:
            piece = self._stream.readline(HEADER_LINE)
            if not piece:
                return b""
            window = carry + piece
            found = window.lower().find(_LENGTH_NAME)
            if found >= 0:
                line = window[found:]
                if not line.endswith(b"\n"):
                    line += self._stream.readline(HEADER_LINE)
                return line
            carry = window[-(len(_LENGTH_NAME) - 1) :] if not window.endswith(b"\n") else b""

    def _skip_body(self, length: int) -> BadFrame | None:
        head = self._stream.read(min(length, PEEK_BYTES))
        if len(head) < min(length, PEEK_BYTES):
            return None
        tail, remaining = head, length - len(head)
        while remaining > 0:
            piece = self._stream.read(min(remaining, 1 << 20))
            if not piece:
                return None
            remaining -= len(piece)
            tail = (tail + piece)[-PEEK_BYTES:]
        msg_id, method, uri = peek_fields(head, tail)
        reason = (
            f"a message of {length / 1e6:.1f} MB is over the {self.max_bytes / 1e6:.1f} MB limit: "
            "it was dropped unread"
        )
        return BadFrame(reason, msg_id, method, uri)
