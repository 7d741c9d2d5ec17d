"""Carrying JSON-RPC messages: stdio (Content-Length framing) and WebSocket (one text message each).

Each connection gets its own pygls server and ClientSession; all of them share one model worker.
A connection that ends, cleanly or not, cancels its requests and leaves the corpus.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit

from lsp_server.protocol import SpecCompleteServer
from lsp_server.server import build_server
from lsp_server.session import ClientSession, SharedState

logger = logging.getLogger(__name__)

TOO_LARGE = b""  # read_framed's answer for a message that was skipped unread
MAX_PENDING_SENDS = 4096  # messages queued to one slow WebSocket client before it is dropped
STDIN_QUEUE = 64  # messages read ahead from stdin


# -- stdio ----------------------------------------------------------------------------------------


def read_framed(stream: BinaryIO, max_bytes: int) -> bytes | None:
    """The next Content-Length framed body; None at end of input; TOO_LARGE when one was skipped.

    A body over max_bytes is read and thrown away in pieces, so memory stays bounded and the
    stream stays in step.
    """
    length: int | None = None
    while True:
        line = stream.readline(4096)
        if not line:
            return None
        if line.strip():
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    length = None
            continue
        if length is None or length < 0:
            continue  # a blank line without a usable length: wait for the next header block
        break
    if length > max_bytes:
        remaining = length
        while remaining > 0:
            piece = stream.read(min(remaining, 1 << 20))
            if not piece:
                return None
            remaining -= len(piece)
        return TOO_LARGE
    body = stream.read(length)
    return body if len(body) == length else None


class FdReader:
    """readline and read over a raw file descriptor, buffered here without io's locks.

    The stdin thread blocks in os.read; an io.BufferedReader would hold its lock meanwhile, and
    Python aborts at exit when a daemon thread holds sys.stdin's lock.
    """

    def __init__(self, fd: int, chunk: int = 1 << 16) -> None:
        self._fd = fd
        self._chunk = chunk
        self._buffer = bytearray()
        self._eof = False

    def _fill(self) -> bool:
        if self._eof:
            return False
        data = os.read(self._fd, self._chunk)
        if not data:
            self._eof = True
            return False
        self._buffer += data
        return True

    def readline(self, limit: int = -1) -> bytes:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0 and (limit < 0 or end < limit):
                return self._take(end + 1)
            if 0 <= limit <= len(self._buffer):
                return self._take(limit)
            if not self._fill():
                return self._take(len(self._buffer))

    def read(self, n: int) -> bytes:
        while len(self._buffer) < n and self._fill():
            pass
        return self._take(min(n, len(self._buffer)))

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data


class _StdoutWriter:
    """Writes framed messages to stdout; a closed pipe ends the connection instead of raising."""

    def __init__(self, stdout: BinaryIO, on_closed: Callable[[], None]) -> None:
        self._stdout = stdout
        self._on_closed = on_closed
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self._stdout.write(data)
            self._stdout.flush()
        except (OSError, ValueError):
            self.closed = True
            self._on_closed()

    def close(self) -> None:
        self.closed = True


async def serve_stdio(shared: SharedState, stdin: BinaryIO, stdout: BinaryIO) -> int:
    """Serve one client over stdin/stdout until it exits or closes stdin; returns the exit code."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def finish(code: int) -> None:
        if not done.done():
            done.set_result(code)

    session, server = _connect(shared, finish)
    server.protocol.set_writer(_StdoutWriter(stdout, lambda: finish(1)), include_headers=True)
    inbox: asyncio.Queue[bytes | None] = asyncio.Queue(STDIN_QUEUE)
    reader = threading.Thread(
        target=_read_stdin,
        args=(stdin, shared.limits.max_message_bytes, inbox, loop),
        name="stdin",
        daemon=True,
    )
    reader.start()  # a daemon thread: a read blocked at exit does not hold the process

    async def dispatch() -> None:
        while (body := await inbox.get()) is not None:
            if body is TOO_LARGE:
                logger.warning("skipped a message over %d bytes", shared.limits.max_message_bytes)
            else:
                server.protocol.handle_raw(body)
        finish(0 if server.protocol._shutdown else 1)

    dispatcher = asyncio.create_task(dispatch())
    try:
        return await done
    finally:
        dispatcher.cancel()
        session.disconnect()


def _read_stdin(
    stdin: BinaryIO, max_bytes: int, inbox: asyncio.Queue, loop: asyncio.AbstractEventLoop
) -> None:
    while True:
        body = read_framed(stdin, max_bytes)
        try:
            asyncio.run_coroutine_threadsafe(inbox.put(body), loop).result()
        except RuntimeError:  # the loop is gone
            return
        if body is None:
            return


# -- WebSocket ------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0"), is_loopback("localhost")
    (True, True, False, True)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def presented_token(path: str, authorization: str | None) -> str | None:
    """The token a client presents: `?token=T` on the URL, or an `Authorization: Bearer T` header.

    >>> presented_token("/?token=abc", None), presented_token("/", "Bearer xyz"), presented_token("/", None)
    ('abc', 'xyz', None)
    """
    query = parse_qs(urlsplit(path).query).get("token")
    if query:
        return query[0]
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


def token_matches(presented: str | None, expected: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def ws_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"ws://{shown}:{port}"


@dataclass(frozen=True, slots=True)
class WsOptions:
    host: str
    port: int
    token: str | None  # required of every client when set


class _WsTextWriter:
    """Sends each message as one WebSocket text message, in order, from one task per connection."""

    def __init__(self, websocket, on_overflow: Callable[[], None]) -> None:
        self._websocket = websocket
        self._on_overflow = on_overflow
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._task = asyncio.create_task(self._send_all())
        self.closed = False

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self._outbox.qsize() >= MAX_PENDING_SENDS:
            logger.warning("a WebSocket client is not reading its messages; dropping it")
            self.close()
            self._on_overflow()
            return
        self._outbox.put_nowait(data.decode("utf-8"))

    async def _send_all(self) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            text = await self._outbox.get()
            try:
                await self._websocket.send(text)
            except ConnectionClosed:
                self.closed = True
                return

    def close(self) -> None:
        self.closed = True
        self._task.cancel()


async def serve_ws(shared: SharedState, options: WsOptions, announce: Callable[[str], None]) -> None:
    """Serve WebSocket clients until cancelled; `announce` gets the URL once the port is bound."""
    from websockets.asyncio.server import serve

    def check(connection, request):
        if options.token is not None:
            presented = presented_token(request.path, request.headers.get("Authorization"))
            if not token_matches(presented, options.token):
                return connection.respond(
                    HTTPStatus.UNAUTHORIZED,
                    "spec-complete: this server needs a token: add ?token=T to the URL "
                    "or send the header Authorization: Bearer T\n",
                )
        metrics = getattr(shared, "metrics_text", None)  # the replicated front end (serving/) has one
        if metrics is not None and urlsplit(request.path).path == "/metrics":
            return connection.respond(HTTPStatus.OK, metrics().decode())
        if len(shared.live_clients) >= shared.limits.max_clients:
            return connection.respond(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"spec-complete: the server is busy: {len(shared.live_clients)} clients are connected "
                f"(the limit is {shared.limits.max_clients}, --max-clients)\n",
            )
        return None

    async def connection(websocket) -> None:
        await _serve_ws_client(shared, websocket)

    async with serve(
        connection,
        options.host,
        options.port,
        process_request=check,
        max_size=shared.limits.max_message_bytes,
        max_queue=4,  # incoming messages buffered per connection: memory stays bounded
    ) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        announce(ws_url(options.host, port))
        await ws_server.serve_forever()


async def _serve_ws_client(shared: SharedState, websocket) -> None:
    from websockets.exceptions import ConnectionClosed

    def close(code: int = 1000) -> None:
        asyncio.ensure_future(websocket.close())

    session, server = _connect(shared, close)
    writer = _WsTextWriter(websocket, close)
    server.protocol.set_writer(writer, include_headers=False)
    try:
        async for message in websocket:
            server.protocol.handle_raw(message)
    except ConnectionClosed:
        pass
    finally:
        session.disconnect()
        writer.close()


def _connect(shared: SharedState, on_exit: Callable[[int], None]) -> tuple[ClientSession, SpecCompleteServer]:
    session = ClientSession(shared)
    server = build_server(session)
    server.protocol.on_exit = on_exit
    return session, server


def print_line(text: str) -> None:
    print(text, file=sys.stdout, flush=True)
