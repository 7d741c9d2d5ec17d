"""Hostile clients against the real server (tiny random model, loopback only), over stdio and WebSocket.

Every case asserts the answer the abuse gets, then that a well-formed request afterwards is still
served. One server per transport serves the module; the stdio server sees every stdio case in turn,
so a case that desynchronised its stream would fail the cases after it too. Nothing sleeps: every
wait is for a response, a notification or a process, with a timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import pytest
import pytest_asyncio
from websockets.exceptions import InvalidStatus

from lsp_server.client import LspClient
from tests.servers import TINY_SERVER, ws_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "hostile-token-0123456789"
SERVER = TINY_SERVER
MAX_DOCUMENTS = 40
FLAGS = [
    "--queue-size", "4",
    "--max-new-tokens", "8",
    "--max-document-kb", "2048",
    "--max-documents", str(MAX_DOCUMENTS),
    "--max-clients", "4",
]  # fmt: skip
OPTIONS = {"syntax": False, "maxNewTokens": 8, "draft": "ngram", "temperature": 0}
SOURCE = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x = 1\n"
CODES = {
    "parse": -32700,
    "invalid_request": -32600,
    "not_found": -32601,
    "invalid_params": -32602,
    "server_cancelled": -32802,
    "failed": -32803,
}


@pytest_asyncio.fixture(loop_scope="module")
async def hostile(client):
    """A connected, initialized client over either transport (stdio: the module's one connection)."""
    yield client


async def connect(url: str, **kwargs) -> LspClient:
    connection = await LspClient.websocket(url, TOKEN, **kwargs)
    await connection.initialize(OPTIONS)
    return connection


def unique_uri(name: str) -> str:
    return f"file:///hostile/{name}-{random.randrange(1 << 30)}.py"


def error_code(response: dict) -> int | None:
    return response.get("error", {}).get("code")


async def assert_served(client: LspClient) -> None:
    """A well-formed open and completion still work on this connection."""
    uri = unique_uri("served")
    client.open(uri, SOURCE)
    response = await client.inline(uri, 1, 4, timeout=60)
    assert "result" in response, response
    client.close_document(uri)


async def new_null_id_errors(client: LspClient, before: int, count: int = 1) -> list[dict]:
    await client.wait_for(lambda: len(client.null_id_errors) >= before + count, timeout=30)
    return client.null_id_errors[before:]


async def new_messages(client: LspClient, before: int, count: int = 1) -> list[str]:
    await client.wait_for(lambda: len(client.messages()) >= before + count, timeout=30)
    return [m["message"] for m in client.messages()[before:]]


# -- malformed messages (both transports) --------------------------------------------------------------


async def test_broken_json_and_deep_nesting_get_parse_errors(hostile):
    before = len(hostile.null_id_errors)
    hostile.send_raw("{not json")
    hostile.send_raw("[" * 100_000 + "]" * 100_000)
    errors = await new_null_id_errors(hostile, before, 2)
    assert [e["error"]["code"] for e in errors] == [CODES["parse"]] * 2
    await assert_served(hostile)


@pytest.mark.parametrize(
    "position",
    [
        {"line": 1.5, "character": 0},
        {"line": True, "character": 0},
        {"line": 0, "character": "3"},
        {"line": -1, "character": 0},
        {"line": 2**40, "character": 0},
        {"line": 0},
    ],
)
async def test_non_integer_and_out_of_range_positions_are_invalid_params(hostile, position):
    uri = unique_uri("positions")
    hostile.open(uri, SOURCE)
    params = {"textDocument": {"uri": uri}, "position": position, "context": {"triggerKind": 2}}
    response = await hostile.request("textDocument/inlineCompletion", params)
    assert error_code(response) == CODES["invalid_params"], response
    assert "position" in response["error"]["message"]
    await assert_served(hostile)


async def test_a_line_past_the_end_is_a_clear_error(hostile):
    uri = unique_uri("past-end")
    hostile.open(uri, SOURCE)
    response = await hostile.inline(uri, 999, 0)
    assert error_code(response) == CODES["invalid_params"]
    assert "outside the document" in response["error"]["message"]
    await assert_served(hostile)


async def test_a_flood_is_answered_busy_or_superseded(hostile):
    uri = unique_uri("flood")
    hostile.open(uri, SOURCE)
    ids = [hostile.inline_nowait(uri, 1, 4) for _ in range(1000)]
    await hostile.wait_for(lambda: all(i in hostile.responses for i in ids), timeout=300)
    outcomes = {
        "result" if "result" in hostile.responses[i] else error_code(hostile.responses[i]) for i in ids
    }
    assert outcomes <= {"result", CODES["failed"], CODES["server_cancelled"]}, outcomes
    assert "result" in hostile.responses[ids[-1]]  # the newest request of the flood is the one served
    hostile.close_document(uri)
    await assert_served(hostile)


# -- per-client limits (both transports) ---------------------------------------------------------------


def big_document(lines: int = 30_000) -> str:
    return "".join(f"value_{i} = compute({i}, 'padding text')\n" for i in range(lines))  # ~1.1 MB


def range_edits(count: int, step: int) -> list[dict]:
    return [
        {
            "range": {"start": {"line": i * step, "character": 0}, "end": {"line": i * step, "character": 5}},
            "text": "VALUE",
        }
        for i in range(count)
    ]


async def test_a_hundred_edits_to_a_megabyte_do_not_stall_other_requests(hostile, ws_url):
    uri = unique_uri("big")
    text = big_document()
    assert len(text) > 1_000_000
    hostile.open(uri, text)
    await hostile.stats()  # the open has been handled
    observer = await connect(ws_url)
    try:
        hostile.notify(
            "textDocument/didChange",
            {"textDocument": {"uri": uri, "version": 2}, "contentChanges": range_edits(100, 250)},
        )
        started = time.perf_counter()
        await observer.stats()
        waited = time.perf_counter() - started
        assert waited < 2.0, f"another client's request waited {waited:.2f} s behind 100 edits"
        stats = await hostile.stats()
        assert stats["client"]["limits"] == {}
        response = await hostile.inline(uri, 250, 5)  # in the edited document, on an edited line
        assert "result" in response, response
    finally:
        await observer.kill()
        hostile.close_document(uri)
    await assert_served(hostile)


async def test_too_many_changes_in_one_message_are_refused_and_said_so(hostile):
    uri = unique_uri("many-changes")
    hostile.open(uri, SOURCE)
    before = len(hostile.messages())
    hostile.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": uri, "version": 2}, "contentChanges": range_edits(1001, 0)},
    )
    (message,) = await new_messages(hostile, before)
    assert "1001 changes" in message and "limit" in message
    refused = await hostile.inline(uri, 0, 1)
    assert error_code(refused) == CODES["failed"] and "1001 changes" in refused["error"]["message"]
    assert (await hostile.stats())["client"]["limits"].get("changes", 0) >= 1
    hostile.notify(
        "textDocument/didChange",
        {"textDocument": {"uri": uri, "version": 3}, "contentChanges": [{"text": SOURCE}]},
    )
    assert "result" in await hostile.inline(uri, 1, 4)  # the whole text lets it back in
    hostile.close_document(uri)
    await assert_served(hostile)


async def test_open_documents_are_bounded_and_long_uris_count(hostile):
    already_open = (await hostile.stats())["client"]["documents"]
    before_messages = len(hostile.messages())
    uris = [f"file:///hostile/{i}/{'u' * 4096}.py" for i in range(MAX_DOCUMENTS * 5)]
    for uri in uris:
        hostile.open(uri, "")
    stats = await hostile.stats()  # answered after every didOpen above was handled
    assert stats["client"]["documents"] == MAX_DOCUMENTS
    assert stats["client"]["bytes"] >= (MAX_DOCUMENTS - already_open) * 4096  # the URIs count
    full = [m for m in hostile.messages()[before_messages:] if "documents open" in m["message"]]
    assert len(full) == 1  # told once, not once per refused document
    assert stats["limits"]["documents"] >= len(uris) - MAX_DOCUMENTS
    for uri in uris:
        hostile.close_document(uri)
    assert (await hostile.stats())["client"]["documents"] == already_open
    await assert_served(hostile)


async def test_notebooks_are_not_kept(hostile):
    cells = [{"kind": 2, "document": f"vscode-notebook-cell:/nb.ipynb#{i}"} for i in range(5)]
    text_documents = [
        {"uri": c["document"], "languageId": "python", "version": 1, "text": "x" * 1_000_000} for c in cells
    ]
    notebook = {"uri": "file:///nb.ipynb", "notebookType": "jupyter-notebook", "version": 1, "cells": cells}
    before = (await hostile.stats())["client"]["bytes"]
    hostile.notify(
        "notebookDocument/didOpen", {"notebookDocument": notebook, "cellTextDocuments": text_documents}
    )
    assert (await hostile.stats())["client"]["bytes"] == before
    response = await hostile.request("notebookDocument/didOpen", {})
    assert error_code(response) == CODES["not_found"]
    await assert_served(hostile)


# -- stdio framing ------------------------------------------------------------------------------------

GOOD_STATS = b'{"jsonrpc": "2.0", "id": "%s", "method": "specComplete/stats"}'


def framed(body: bytes, length: bytes | None = None) -> bytes:
    return (
        b"Content-Length: " + (length if length is not None else str(len(body)).encode()) + b"\r\n\r\n" + body
    )


@pytest.mark.parametrize(
    "bad, lost_next",
    [
        (framed(b'{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}', b"-5"), False),
        (framed(b'{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}', b"five"), False),
        (b'Content-Type: application/json\r\n\r\n{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}', False),
        (framed(b'{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}', b"10"), False),  # shorter
        (framed(b'{"jsonrpc": "2.0", "id": 1, "method": "shutdown"}', b"60"), True),  # longer
        (framed(b""), False),  # empty: a parse error of its own
    ],
    ids=["negative", "non-numeric", "absent", "shorter", "longer", "empty"],
)
async def test_a_bad_frame_gets_an_error_and_the_stream_recovers(stdio_client, bad, lost_next):
    client = stdio_client
    before = len(client.null_id_errors)
    client.write_bytes(bad)
    tag = f"after-{random.randrange(1 << 30)}"
    client.write_bytes(framed(GOOD_STATS % f"{tag}-1".encode()))
    client.write_bytes(framed(GOOD_STATS % f"{tag}-2".encode()))
    second = await client.response(f"{tag}-2", timeout=30)
    assert "result" in second
    assert (f"{tag}-1" in client.responses) != lost_next  # a too-long frame ran into the next one
    errors = client.null_id_errors[before:]
    assert errors and all(e["error"]["code"] == CODES["parse"] for e in errors), errors
    await assert_served(client)


async def test_an_oversized_request_gets_an_error_with_its_id(stdio_client):
    padding = "x" * (9 * 1024 * 1024)
    msg_id = f"huge-{random.randrange(1 << 30)}"
    stdio_client.send(
        {"jsonrpc": "2.0", "id": msg_id, "method": "specComplete/stats", "params": {"p": padding}}
    )
    response = await stdio_client.response(msg_id, timeout=60)
    assert error_code(response) == CODES["invalid_request"]
    assert "over the" in response["error"]["message"]
    await assert_served(stdio_client)


async def test_a_dropped_did_open_is_reported_and_completions_there_say_why(stdio_client):
    uri = unique_uri("fifty-mb")
    before = len(stdio_client.messages())
    stdio_client.open(uri, "x = 1\n" * (50 * 1024 * 1024 // 6))
    (message,) = await new_messages(stdio_client, before)
    assert uri in message and "dropped" in message and "over the" in message
    response = await stdio_client.inline(uri, 0, 1)
    assert error_code(response) == CODES["failed"]
    assert "dropped" in response["error"]["message"] and "not open" not in response["error"]["message"]
    stdio_client.close_document(uri)
    await assert_served(stdio_client)


# -- WebSocket: frames, connections, tokens, origins, other clients -------------------------------------


async def test_an_oversized_websocket_message_closes_only_that_connection(ws_url):
    victim = await connect(ws_url)
    try:
        victim.send_raw("x" * (9 * 1024 * 1024))
        await victim.wait_for(lambda: victim.closed, timeout=60)
    except ConnectionError:
        pass
    finally:
        await victim.kill()
    survivor = await connect(ws_url)
    try:
        await assert_served(survivor)
    finally:
        await survivor.kill()


async def test_the_connection_cap_refuses_one_more_and_frees_a_slot_on_close(ws_url):
    connections = [await connect(ws_url) for _ in range(4)]
    try:
        with pytest.raises(InvalidStatus) as refused:
            await LspClient.websocket(ws_url, TOKEN)
        assert refused.value.response.status_code == 503
        assert b"busy" in refused.value.response.body
        await connections.pop().kill()
        # the slot is free once the server has noticed the close: its client count says when
        await asyncio.wait_for(clients_below(connections[0], 4), 30)
        served = await connect(ws_url)
        connections.append(served)
        await assert_served(served)
    finally:
        for connection in connections:
            await connection.kill()


async def clients_below(observer: LspClient, limit: int) -> None:
    while (await observer.stats())["clients"] >= limit:
        pass  # each stats round trip lets the server handle the close


async def test_wrong_tokens_are_refused(ws_url):
    for token in (None, "", "wrong-token-000", TOKEN[:-1], TOKEN + "x"):
        with pytest.raises(InvalidStatus) as refused:
            await LspClient.websocket(ws_url, token)
        assert refused.value.response.status_code == 401
    connection = await connect(ws_url)
    try:
        await assert_served(connection)
    finally:
        await connection.kill()


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:8080"])
async def test_a_browser_page_cannot_connect(ws_url, origin):
    with pytest.raises(InvalidStatus) as refused:
        await LspClient.websocket(ws_url, TOKEN, origin=origin)
    assert refused.value.response.status_code == 403
    assert b"origin" in refused.value.response.body
    editor = await connect(ws_url, origin="vscode-file://vscode-app")  # VS Code's own origin
    try:
        await assert_served(editor)
    finally:
        await editor.kill()


async def test_a_loopback_server_makes_its_own_token_and_lets_listed_origins_in():
    async with ws_server(*FLAGS, "--allow-origin", "https://ide.example.com") as url:
        assert "?token=" in url  # no --token given: one was generated and printed, ready to paste
        bare = url.split("/?")[0]
        with pytest.raises(InvalidStatus) as refused:
            await LspClient.websocket(bare)
        assert refused.value.response.status_code == 401
        listed = await LspClient.websocket(url, origin="https://ide.example.com")
        try:
            await listed.initialize(OPTIONS)
            await assert_served(listed)
        finally:
            await listed.kill()
        with pytest.raises(InvalidStatus) as other:
            await LspClient.websocket(url, origin="https://other.example.com")
        assert other.value.response.status_code == 403


async def test_no_token_must_be_asked_for_and_stays_on_loopback():
    async with ws_server(*FLAGS, "--no-token") as url:
        assert "?token=" not in url
        client = await LspClient.websocket(url)
        try:
            await client.initialize(OPTIONS)
            await assert_served(client)
        finally:
            await client.kill()
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPLETE_TOKEN"}
    refused = await asyncio.create_subprocess_exec(
        *SERVER, "--ws", "--port", "0", "--host", "0.0.0.0", "--allow-remote", "--no-token",
        stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(refused.communicate(), 60)
    assert refused.returncode == 2 and b"loopback only" in stderr


async def test_stats_show_a_client_only_its_own_documents(ws_url):
    owner, other = await connect(ws_url), await connect(ws_url)
    try:
        secret = "file:///home/someone/payroll.py"
        owner.open(secret, SOURCE)
        assert "result" in await owner.inline(secret, 1, 4)
        mine = unique_uri("mine")
        other.open(mine, SOURCE)
        assert "result" in await other.inline(mine, 1, 4)
        seen = await other.stats()
        assert "payroll" not in json.dumps(seen)
        assert [r["uri"] for r in seen["recent"]] == [mine]
        assert seen["client"]["documents"] == 1
        assert seen["requests"] >= 2  # the aggregate counters still count everyone
        assert [r["uri"] for r in (await owner.stats())["recent"]] == [secret]
    finally:
        await owner.kill()
        await other.kill()


async def test_a_dropped_client_mid_message_leaves_the_others_served(ws_url):
    dying = await connect(ws_url)
    dying.send_raw('{"jsonrpc": "2.0", "id": 1, "method": "textDocument/inlineCompletion", "params": {')
    await dying.kill()
    survivor = await connect(ws_url)
    try:
        await assert_served(survivor)
    finally:
        await survivor.kill()
