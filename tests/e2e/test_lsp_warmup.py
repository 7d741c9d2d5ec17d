"""Warm before asked: the server prefills while the user reads or types, so the next completion at the
edit finds its KV prefix ready (tiny random model, stdio). Nothing sleeps: each wait asks for stats."""

from __future__ import annotations

import asyncio
import sys

import pytest

from lsp_server.client import LspClient

pytestmark = pytest.mark.asyncio

SERVER = [sys.executable, "-m", "lsp_server", "--target", "tiny-random", "--threads", "1", "--stdio"]
OPTIONS = {"syntax": False, "maxNewTokens": 4, "draft": "ngram", "temperature": 0}
SOURCE = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x = 1\n    y = 2\n\n" * 12


async def warmups_reach(client: LspClient, count: int, timeout: float = 60) -> dict:
    """Ask for stats until `count` warm-ups have finished (each ask awaits the server's answer)."""

    async def until() -> dict:
        while True:
            stats = await client.stats()
            if stats["warmups"] >= count:
                return stats

    return await asyncio.wait_for(until(), timeout)


async def test_open_then_type_each_completion_finds_its_prefix_prefilled():
    client = await LspClient.stdio(*SERVER)
    try:
        await client.initialize(OPTIONS)
        uri = "file:///warm/points.py"
        client.open(uri, SOURCE)
        stats = await warmups_reach(client, 1)
        assert stats["warm_tokens"] > 100 and stats["warmups_cancelled"] == 0
        last_line = SOURCE.count("\n")
        await client.inline(uri, last_line, 0)
        opened = (await client.stats())["recent"][-1]
        assert opened["prefill_tokens"] == 0, "the whole file was prefilled before the request"

        client.edit(uri, 2, last_line, 0, "cl")  # the user types; the server warms up at the new cursor
        await warmups_reach(client, 2)
        await client.inline(uri, last_line, 2)
        typed = (await client.stats())["recent"][-1]
        assert typed["prefill_tokens"] == 0, "the typed text was prefilled before the request"
    finally:
        await client.close()
