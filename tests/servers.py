"""The servers the end-to-end tests start: the tiny model over WebSocket or stdio, stopped cleanly.

Each test module names its flags, token and client options; these context managers hold the one
way to start a server, wait for it to announce itself, connect over either transport, and stop it.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from lsp_server.client import LspClient, start_ws_server, stop_process

TINY_SERVER = [sys.executable, "-m", "lsp_server", "--target", "tiny-random", "--threads", "1"]
# tiny replicas on a local Ray instance of 2 CPUs (room for two replicas and Serve's controller)
TINY_REPLICAS = [
    "--queue-size",
    "8",
    "--max-new-tokens",
    "16",
    "--ray-cpus",
    "2",
    "--cpus-per-replica",
    "0.5",
]


@asynccontextmanager
async def ws_server(
    *flags: str,
    start_timeout: float = 180,
    stop_timeout: float = 10,
    env: dict[str, str] | None = None,
    exits_cleanly: bool = False,
) -> AsyncIterator[str]:
    """A WebSocket server on a free loopback port; yields the URL it announced (with any token it made).

    exits_cleanly: it must exit 0 when terminated (the replicas' front end does, having taken Ray down).
    """
    command = [*TINY_SERVER, *flags, "--ws", "--port", "0"]
    process, url = await start_ws_server(command, start_timeout, env)
    try:
        yield url
    finally:
        await stop_process(process, stop_timeout)
    if exits_cleanly:
        assert process.returncode == 0, f"the server exited {process.returncode} when terminated"


@asynccontextmanager
async def stdio_session(*flags: str, options: dict) -> AsyncIterator[LspClient]:
    """A stdio server with one initialized connection; it must exit 0 after shutdown and exit."""
    client = await LspClient.stdio(*TINY_SERVER, *flags, "--stdio")
    await client.initialize(options)
    try:
        yield client
    finally:
        await client.close()
    assert client.returncode == 0, "the stdio server should exit 0 after shutdown + exit"


@asynccontextmanager
async def either_client(
    transport: str, stdio: LspClient, url: str, token: str, options: dict
) -> AsyncIterator[LspClient]:
    """The module's stdio connection with its settings reset to `options`, or a fresh WebSocket one."""
    if transport == "stdio":
        stdio.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": options}})
        yield stdio
        return
    connection = await LspClient.websocket(url, token)
    await connection.initialize(options)
    try:
        yield connection
    finally:
        await connection.kill()
