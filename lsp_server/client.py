"""A small LSP client on pygls's JSON-RPC machinery, speaking raw JSON: for tests, load and benchmarks.

It keeps messages as plain dicts (no lsprotocol types), so it can send what a typed client cannot:
partialResultToken on inline completion, malformed params, broken JSON. Every response, every
notification and every error (including those with a null id) is recorded; `wait_for` awaits a
condition on them with a timeout instead of sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pygls.client import JsonRPCClient
from pygls.protocol import JsonRPCProtocol, default_converter

_ANNOUNCED_URL = re.compile(r"ws://[\w.\[\]:]+:\d+(?:/\?token=[\w-]+)?")


def announced_url(line: str) -> str | None:
    """The URL from `spec-complete serve --ws`'s first line, with the run's token when it printed one.

    >>> announced_url("spec-complete: listening on ws://127.0.0.1:8765/?token=a-b_c (model m, draft d)")
    'ws://127.0.0.1:8765/?token=a-b_c'
    """
    found = _ANNOUNCED_URL.search(line)
    return found.group(0) if found else None


class _RecordingProtocol(JsonRPCProtocol):
    """pygls's framing and transport, with messages kept as the JSON the server sent."""

    client: LspClient

    def structure_message(self, data: dict) -> dict:
        return data

    def handle_message(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        if "method" in message and "id" in message:  # window/workDoneProgress/create and the like: accept
            self._send_data({"jsonrpc": "2.0", "id": message["id"], "result": None})
        elif "method" in message:
            self.client._on_notification(message["method"], message.get("params"))
        elif "id" in message:
            self.client._on_response(message)


class _WsTextWriter:
    """One text message per JSON-RPC message, sent in order (as the VS Code extension does)."""

    def __init__(self, websocket) -> None:
        self._websocket = websocket
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._task = asyncio.create_task(self._send_all())

    def write(self, data: bytes) -> None:
        self._outbox.put_nowait(data.decode("utf-8"))

    async def _send_all(self) -> None:
        from websockets.exceptions import ConnectionClosed

        while True:
            text = await self._outbox.get()
            try:
                await self._websocket.send(text)
            except ConnectionClosed:
                return

    def close(self) -> None:
        self._task.cancel()


class LspClient:
    def __init__(self) -> None:
        self._rpc = JsonRPCClient(protocol_cls=_RecordingProtocol, converter_factory=default_converter)
        self.protocol: _RecordingProtocol = self._rpc.protocol
        self.protocol.client = self
        self.responses: dict[Any, dict] = {}
        self.null_id_errors: list[dict] = []
        self.notifications: list[tuple[str, Any]] = []
        self.progress: dict[Any, list[Any]] = {}
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1)
        self._process: asyncio.subprocess.Process | None = None
        self._websocket = None
        self._tasks: list[asyncio.Task] = []
        self.closed = False

    # -- connecting -----------------------------------------------------------------------------

    @classmethod
    async def stdio(cls, *command: str, stderr=None) -> LspClient:
        """Start `command` and talk to it over its stdin/stdout; its stderr goes to ours (or `stderr`)."""
        client = cls()
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr if stderr is not None else sys.stderr,
        )
        client._process = process
        client.protocol.set_writer(process.stdin, include_headers=True)
        from pygls.io_ import run_async

        client._tasks.append(
            asyncio.create_task(
                run_async(stop_event=client._rpc._stop_event, reader=process.stdout, protocol=client.protocol)
            )
        )
        client._tasks.append(asyncio.create_task(client._watch_process()))
        return client

    @classmethod
    async def websocket(
        cls, url: str, token: str | None = None, bearer: bool = False, origin: str | None = None
    ) -> LspClient:
        """Connect to a WebSocket server; a token goes in the query (or, with bearer, in a header).

        `origin` sends an Origin header, as a browser would.
        """
        from websockets.asyncio.client import connect

        headers = {}
        if token is not None:
            if bearer:
                headers["Authorization"] = f"Bearer {token}"
            else:
                url = f"{url.rstrip('/')}/?token={token}"
        client = cls()
        client._websocket = await connect(url, additional_headers=headers, max_size=None, origin=origin)
        client.protocol.set_writer(_WsTextWriter(client._websocket), include_headers=False)
        client._tasks.append(asyncio.create_task(client._read_ws()))
        return client

    async def _read_ws(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self._websocket:
                self.protocol.handle_message(json.loads(message))
        except ConnectionClosed:
            pass
        finally:
            await self._closed()

    async def _watch_process(self) -> None:
        await self._process.wait()
        await self._closed()

    async def _closed(self) -> None:
        self.closed = True
        async with self._changed:
            self._changed.notify_all()

    # -- sending --------------------------------------------------------------------------------

    def send_raw(self, body: str | bytes) -> None:
        """Send one message body as is (framed with Content-Length over stdio)."""
        data = body.encode("utf-8") if isinstance(body, str) else body
        if self._process is not None:
            data = f"Content-Length: {len(data)}\r\n\r\n".encode() + data
        self.protocol.writer.write(data)

    def write_bytes(self, data: bytes) -> None:
        """Write bytes to a stdio server exactly as given: no framing added (to send broken frames)."""
        assert self._process is not None, "write_bytes is for stdio connections"
        self.protocol.writer.write(data)

    def send(self, message: dict) -> None:
        self.send_raw(json.dumps(message))

    def notify(self, method: str, params: Any = None) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request_nowait(self, method: str, params: Any = None, msg_id: int | str | None = None) -> int | str:
        msg_id = next(self._ids) if msg_id is None else msg_id
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
        return msg_id

    async def request(self, method: str, params: Any = None, timeout: float = 60) -> dict:
        """The response message: a dict with "result" or "error"."""
        return await self.response(self.request_nowait(method, params), timeout)

    async def result(self, method: str, params: Any = None, timeout: float = 60) -> Any:
        response = await self.request(method, params, timeout)
        if "error" in response:
            raise RuntimeError(f"{method} failed: {response['error']}")
        return response["result"]

    def cancel(self, msg_id: int | str) -> None:
        self.notify("$/cancelRequest", {"id": msg_id})

    # -- receiving ------------------------------------------------------------------------------

    def _on_response(self, message: dict) -> None:
        if message["id"] is None:
            self.null_id_errors.append(message)
        else:
            self.responses[message["id"]] = message
        asyncio.ensure_future(self._notify_waiters())

    def _on_notification(self, method: str, params: Any) -> None:
        self.notifications.append((method, params))
        if method == "$/progress" and isinstance(params, dict):
            self.progress.setdefault(params.get("token"), []).append(params.get("value"))
        asyncio.ensure_future(self._notify_waiters())

    async def _notify_waiters(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 60) -> None:
        """Wait until condition() holds; TimeoutError after `timeout` s, ConnectionError if the link ends."""

        async def until() -> None:
            async with self._changed:
                while not condition():
                    if self.closed:
                        raise ConnectionError("the connection closed before the condition held")
                    await self._changed.wait()

        await asyncio.wait_for(until(), timeout)

    async def response(self, msg_id: int | str, timeout: float = 60) -> dict:
        await self.wait_for(lambda: msg_id in self.responses, timeout)
        return self.responses[msg_id]

    def messages(self, method: str = "window/showMessage") -> list[Any]:
        return [params for name, params in self.notifications if name == method]

    # -- LSP conveniences -----------------------------------------------------------------------

    async def initialize(self, options: dict | None = None, timeout: float = 120) -> dict:
        params = {"processId": None, "rootUri": None, "capabilities": {}, "initializationOptions": options}
        result = await self.result("initialize", params, timeout)
        self.notify("initialized", {})
        return result

    def open(self, uri: str, text: str, language_id: str = "python", version: int = 1) -> None:
        self.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": language_id, "version": version, "text": text}},
        )

    def edit(
        self, uri: str, version: int, line: int, character: int, text: str, end: tuple[int, int] | None = None
    ):
        """Replace the range from (line, character) to `end` (default: the same point) with text."""
        end_line, end_character = end or (line, character)
        change = {
            "range": {
                "start": {"line": line, "character": character},
                "end": {"line": end_line, "character": end_character},
            },
            "text": text,
        }
        self.notify(
            "textDocument/didChange",
            {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]},
        )

    def close_document(self, uri: str) -> None:
        self.notify("textDocument/didClose", {"textDocument": {"uri": uri}})

    def inline_nowait(
        self,
        uri: str,
        line: int,
        character: int,
        partial: int | str | None = None,
        msg_id: int | str | None = None,
    ) -> int | str:
        params: dict[str, Any] = {
            "textDocument": {"uri": uri},
            "position": {"line": line, "character": character},
            "context": {"triggerKind": 2},
        }
        if partial is not None:
            params["partialResultToken"] = partial
        return self.request_nowait("textDocument/inlineCompletion", params, msg_id)

    async def inline(self, uri: str, line: int, character: int, timeout: float = 60) -> dict:
        return await self.response(self.inline_nowait(uri, line, character), timeout)

    async def stats(self) -> dict:
        return await self.result("specComplete/stats")

    async def close(self, timeout: float = 20) -> None:
        """Shut down politely (stdio: shutdown + exit, then the process must end); always cleans up."""
        try:
            if self._process is not None and self._process.returncode is None and not self.closed:
                await asyncio.wait_for(self.request("shutdown"), timeout)
                self.notify("exit")
                await asyncio.wait_for(self._process.wait(), timeout)
        except (TimeoutError, ConnectionError, OSError):
            pass
        finally:
            await self.kill()

    async def kill(self) -> None:
        """Drop the connection at once, without a closing handshake (a client dying mid-stream)."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        if self._websocket is not None:
            self._websocket.transport.abort()
        self._rpc._stop_event.set()
        for task in self._tasks:
            task.cancel()
        writer = self.protocol.writer
        if isinstance(writer, _WsTextWriter):
            writer.close()
        self.closed = True

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None


async def start_ws_server(
    command: Sequence[str], timeout: float = 180, env: dict[str, str] | None = None
) -> tuple[asyncio.subprocess.Process, str]:
    """Start a `serve --ws` command in a process group of its own; returns it and the URL it announced.

    Its own group, so that stop_process can take down what it started too (Ray's processes). `env`
    adds to this process's environment.
    """
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, **env} if env else None,
    )
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), timeout)).decode()
    except BaseException:
        await stop_process(process)
        raise
    url = announced_url(line)
    if url is None:
        await stop_process(process)
        raise RuntimeError(f"the server did not announce its URL: {line!r}")
    return process, url


async def stop_process(process: asyncio.subprocess.Process, timeout: float = 10) -> None:
    """Terminate a server process started for a test or a benchmark; kill it (and its group) if it hangs."""
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            if os.getpgid(process.pid) == process.pid:  # it leads its own group (start_ws_server)
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
            await process.wait()
