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
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit

from lsprotocol import types

from lsp_server.framing import BadFrame, FrameReader
from lsp_server.protocol import INVALID_REQUEST, PARSE_ERROR, SpecCompleteServer
from lsp_server.server import build_server
from lsp_server.session import ClientSession, SharedState

logger = logging.getLogger(__name__)

MAX_PENDING_SENDS = 4096  # messages queued to one slow WebSocket client before it is dropped
STDIN_QUEUE = 64  # messages read ahead from stdin


# -- stdio ----------------------------------------------------------------------------------------


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
    inbox: asyncio.Queue[bytes | BadFrame | None] = asyncio.Queue(STDIN_QUEUE)
    reader = threading.Thread(
        target=_read_stdin,
        args=(FrameReader(stdin, shared.limits.max_message_bytes), inbox, loop),
        name="stdin",
        daemon=True,
    )
    reader.start()  # a daemon thread: a read blocked at exit does not hold the process

    async def dispatch() -> None:
        while (body := await inbox.get()) is not None:
            if isinstance(body, BadFrame):
                answer_bad_frame(server, session, body)
            else:
                server.protocol.handle_raw(body)
        finish(0 if server.protocol._shutdown else 1)

    dispatcher = asyncio.create_task(dispatch())
    try:
        return await done
    finally:
        dispatcher.cancel()
        session.disconnect()


def _read_stdin(frames: FrameReader, inbox: asyncio.Queue, loop: asyncio.AbstractEventLoop) -> None:
    while True:
        body = frames.next()
        try:
            asyncio.run_coroutine_threadsafe(inbox.put(body), loop).result()
        except RuntimeError:  # the loop is gone
            return
        if body is None:
            return


def answer_bad_frame(server: SpecCompleteServer, session: ClientSession, frame: BadFrame) -> None:
    """Tell the client about a frame that was skipped: an error response to a request (with its id
    when it could be read), a message for a notification; a dropped didOpen or didChange leaves its
    document refused, so completions there say why instead of "not open"."""
    logger.warning("%s", frame.reason)
    if frame.msg_id is not None:
        server.protocol.reply_error(
            frame.msg_id, INVALID_REQUEST, f"{frame.method or 'request'}: {frame.reason}"
        )
        return
    if frame.method is None:
        server.protocol.reply_error(None, PARSE_ERROR, frame.reason)
        return
    dropped = f"{frame.method} was dropped: {frame.reason}"
    if frame.uri is not None and frame.method in ("textDocument/didOpen", "textDocument/didChange"):
        session.refuse(frame.uri, f"{frame.uri}: {dropped}")
        dropped = f"{frame.uri}: {dropped}; no completions in it until it is opened again"
    server.window_show_message(
        types.ShowMessageParams(type=types.MessageType.Error, message=f"spec-complete: {dropped}")
    )


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


EDITOR_ORIGINS = ("vscode-file://vscode-app",)  # VS Code's desktop app; its extension host sends none


def origin_allowed(origin: str | None, allowed: tuple[str, ...] = ()) -> bool:
    """May a handshake with this Origin header connect? Browsers always send one, and any web page
    the user has open may try ws://127.0.0.1: only editors' origins and those passed with
    --allow-origin get in. Editors and command-line clients send no Origin at all.

    >>> origin_allowed(None), origin_allowed("vscode-file://vscode-app")
    (True, True)
    >>> origin_allowed("https://evil.example"), origin_allowed("null")
    (False, False)
    >>> origin_allowed("https://ide.example.com", ("https://ide.example.com",))
    True
    """
    if origin is None:
        return True
    return origin.strip().rstrip("/").lower() in {o.rstrip("/").lower() for o in (*EDITOR_ORIGINS, *allowed)}


def ws_url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"ws://{shown}:{port}"


@dataclass(frozen=True, slots=True)
class WsOptions:
    host: str
    port: int
    token: str | None  # required of every client when set
    allowed_origins: tuple[str, ...] = ()  # browser origins let in besides editors' (--allow-origin)


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
        origin = request.headers.get("Origin")
        if not origin_allowed(origin, options.allowed_origins):
            logger.warning("refused a WebSocket handshake from origin %.100r", origin)
            return connection.respond(
                HTTPStatus.FORBIDDEN,
                f"spec-complete: connections from the origin {origin[:100]!r} are refused: a web page may "
                "not drive this server. Start it with --allow-origin ORIGIN to let that origin in\n",
            )
        if options.token is not None:
            presented = presented_token(request.path, request.headers.get("Authorization"))
            if not token_matches(presented, options.token):
                return connection.respond(
                    HTTPStatus.UNAUTHORIZED,
                    "spec-complete: this server needs a token: add ?token=T to the URL "
                    "or send the header Authorization: Bearer T (when the server made up its own, it "
                    "printed the URL with it at start: spec-complete: listening on ws://...?token=T)\n",
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
        _stop_on_signals(ws_server.close)
        announce(ws_url(options.host, port))
        await ws_server.serve_forever()


def _stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM and SIGINT close the server between two events of the loop, so the caller's cleanup
    (the worker, and Ray for the replicas) runs in order; a KeyboardInterrupt raised wherever the main
    thread happened to be could leave a library's lock held and the process hanging."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)


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
