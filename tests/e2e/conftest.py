"""The servers an e2e module shares, configured by the module: FLAGS (server flags), TOKEN, OPTIONS.

`ws_url`: one WebSocket server for the module; `stdio_client`: one stdio server and its connection
for the module; `client`: a connected client over either transport (parametrised), with OPTIONS.
"""

from __future__ import annotations

import pytest_asyncio

from tests.servers import either_client, stdio_session, ws_server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ws_url(request):
    async with ws_server(*request.module.FLAGS, "--token", request.module.TOKEN) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stdio_client(request):
    async with stdio_session(*request.module.FLAGS, options=request.module.OPTIONS) as connection:
        yield connection


@pytest_asyncio.fixture(params=["stdio", "ws"], loop_scope="module")
async def client(request, ws_url, stdio_client):
    """A connected, initialized client with the module's OPTIONS (stdio: the module's one connection)."""
    module = request.module
    async with either_client(request.param, stdio_client, ws_url, module.TOKEN, module.OPTIONS) as connection:
        yield connection
