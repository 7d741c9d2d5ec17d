"""The embedded model (SmolLM2-135M) behind the WebSocket server, with its defaults: loopback, no token.

Fetched and converted on first use (about a minute), then cached.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from lsp_server.client import LspClient, announced_url

pytestmark = [pytest.mark.embedded, pytest.mark.asyncio]

SOURCE = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def factorial(n):
    """Return n!."""
    if n < 2:
        return 1
    return '''


async def test_embedded_model_completes_python_over_websocket():
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lsp_server", "--ws", "--port", "0", "--max-new-tokens", "24",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(server.stdout.readline(), 600)).decode()
        url = announced_url(line)  # with the token generated for this run
        assert url and url.startswith("ws://127.0.0.1:"), line
        client = await LspClient.websocket(url)
        try:
            await client.initialize()
            uri = "file:///embedded/maths.py"
            client.open(uri, SOURCE)
            last = SOURCE.count("\n")
            response = await client.inline(uri, last, len("    return "), timeout=300)
            text = response["result"]["items"][0]["insertText"]
            assert "factorial" in text and "n" in text, f"an unlikely completion: {text!r}"
            assert "\n\n" not in text, "the syntax stop should end the completion at the function's end"
            client.edit(uri, 2, last, len("    return "), "n")  # one character: the cached prefix is reused
            await client.inline(uri, last, len("    return n"), timeout=300)
            recent = (await client.stats())["recent"]
            assert recent[-1]["prefill_tokens"] <= 3 < recent[-2]["prefill_tokens"]
        finally:
            await client.kill()
    finally:
        server.terminate()
        await server.wait()
