"""The language server end to end, over stdio and WebSocket, with the tiny random model.

One server process per transport serves the whole module (a start costs seconds on this machine);
WebSocket tests open a fresh connection each, stdio tests share one connection and reset its
settings. Nothing sleeps: every wait is for a response or notification, with a timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import random

import pytest

from completion_engine.types import ORIGINS
from lsp_server.client import LspClient
from tests.servers import TINY_SERVER

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "e2e-token-0123456789"
SERVER = TINY_SERVER
FLAGS = ["--queue-size", "4", "--max-document-kb", "64", "--max-new-tokens", "16"]
OPTIONS = SHORT = {"syntax": False, "maxNewTokens": 16, "draft": "ngram", "temperature": 0}
LONG = {"syntax": False, "maxNewTokens": 4000, "draft": "none"}  # seconds of work: long enough to cancel
SOURCE = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\nclass Point:\n    x = 1\n"
)

RESULT_CODES = {"cancelled": -32800, "server_cancelled": -32802, "failed": -32803, "invalid_params": -32602}


async def connect_ws(url: str, options: dict | None = None) -> LspClient:
    connection = await LspClient.websocket(url, TOKEN)
    await connection.initialize(options or SHORT)
    return connection


def configure(client: LspClient, options: dict) -> None:
    client.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": options}})


def unique_uri(name: str) -> str:
    return f"file:///e2e/{name}-{random.randrange(1 << 30)}.py"


def error_code(response: dict) -> int | None:
    return response.get("error", {}).get("code")


async def first_partial(client: LspClient, token: str) -> None:
    await client.wait_for(lambda: len(client.progress.get(token, [])) >= 1, timeout=60)


# -- the basics ---------------------------------------------------------------------------------------


async def test_initialize_advertises_inline_completion_and_incremental_sync(ws_url):
    connection = await LspClient.websocket(ws_url, TOKEN)
    try:
        capabilities = (await connection.initialize(SHORT))["capabilities"]
    finally:
        await connection.kill()
    assert "inlineCompletionProvider" in capabilities
    assert "completionProvider" in capabilities
    assert capabilities["textDocumentSync"]["change"] == 2  # incremental


async def test_inline_and_completion_answer_the_same_text(client):
    uri = unique_uri("same")
    client.open(uri, SOURCE)
    inline = (await client.inline(uri, 1, 12))["result"]  # after "    return a"
    text = inline["items"][0]["insertText"]
    assert text
    completion = await client.result(
        "textDocument/completion", {"textDocument": {"uri": uri}, "position": {"line": 1, "character": 12}}
    )
    (item,) = completion["items"]
    assert item["textEdit"]["newText"] == "a" + text  # the word before the cursor ("a") plus the completion
    assert item["textEdit"]["range"]["start"] == {"line": 1, "character": 11}


async def test_incremental_edits_reach_the_server(client):
    uri = unique_uri("edits")
    client.open(uri, "x = 1\n")
    client.edit(uri, 2, 0, 5, "\n\U0001f600 = 2\nfoo_ba")  # after "x = 1"
    client.edit(uri, 3, 2, 6, "r")  # line 2: "foo_ba" -> "foo_bar"
    client.edit(uri, 4, 1, 2, "Zed")  # after the emoji, which is 2 UTF-16 code units: "\U0001f600Zed = 2"
    client.edit(uri, 5, 0, 0, "", end=(0, 4))  # line 0: "x = 1" -> "1"
    for line, character, word, start in ((1, 5, "Zed", 2), (2, 7, "foo_bar", 0), (0, 1, "1", 0)):
        completion = await client.result(
            "textDocument/completion",
            {"textDocument": {"uri": uri}, "position": {"line": line, "character": character}},
        )
        (item,) = completion["items"]
        assert item["textEdit"]["newText"].startswith(word)
        assert item["textEdit"]["range"]["start"] == {"line": line, "character": start}


async def test_streamed_partials_arrive_in_order_and_end_with_the_final_result(client):
    configure(client, {**SHORT, "maxNewTokens": 48, "draft": "none"})
    uri = unique_uri("stream")
    client.open(uri, SOURCE)
    token = f"stream-{random.randrange(1 << 30)}"
    msg_id = client.inline_nowait(uri, 9, 9, partial=token)
    response = await client.response(msg_id)
    partials = client.progress[token]
    assert len(partials) >= 2, "48 tokens one per step should stream in several partial results"
    texts = [p["items"][0]["insertText"] for p in partials]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))
    # the final item also carries the accept command: the suggestion gets its id once it is finished
    final = response["result"]["items"][0]
    assert {key: final[key] for key in ("insertText", "range")} == partials[-1]["items"][0]
    assert final["command"]["command"] == "specComplete.didAcceptCompletion"


async def test_a_one_character_edit_reuses_the_cached_prefix(client):
    uri = unique_uri("prefix")
    text = SOURCE * 20
    warmed_before = (await client.stats())["warm_tokens"]
    client.open(uri, text)
    last_line = text.count("\n")
    await client.inline(uri, last_line, 0)
    stats = await client.stats()
    cold = stats["recent"][-1]
    client.edit(uri, 2, last_line, 0, "#")
    await client.inline(uri, last_line, 1)
    warm = (await client.stats())["recent"][-1]
    # the prefix was computed here: by the request, or by the open's warm-up if it started first
    assert cold["prefill_tokens"] + stats["warm_tokens"] - warmed_before > 100
    assert warm["prefill_tokens"] <= 3, f"one new character should prefill a token or two, not {warm}"


async def test_stats_carry_the_names_the_extension_reads(client):
    uri = unique_uri("stats")
    client.open(uri, SOURCE)
    await client.inline(uri, 1, 4)
    stats = await client.stats()
    for key in (
        "requests",
        "cancelled",
        "tokens",
        "target_forwards",
        "ttft_p50_s",
        "ttft_p95_s",
        "tokens_per_s",
    ):
        assert key in stats
    assert set(stats["acceptance"]) >= {"ngram", "model"}
    assert set(stats["by_origin"]) <= set(ORIGINS)
    assert stats["requests"] >= 1 and stats["tokens"] >= 1


# -- cancellation ---------------------------------------------------------------------------------------


async def test_cancel_request_stops_generation(client):
    configure(client, LONG)
    uri = unique_uri("cancel")
    client.open(uri, SOURCE)
    before = await client.stats()
    token = f"cancel-{random.randrange(1 << 30)}"
    msg_id = client.inline_nowait(uri, 1, 4, partial=token)
    await first_partial(client, token)
    client.cancel(msg_id)
    response = await client.response(msg_id, timeout=30)
    assert error_code(response) == RESULT_CODES["cancelled"]
    configure(client, SHORT)
    await client.inline(uri, 1, 5)  # one worker, in order: this answer comes after the cancelled run ended
    after = await client.stats()
    assert after["cancelled"] == before["cancelled"] + 1
    runs = [r for r in after["recent"] if r["uri"] == uri]
    assert runs[0]["stop_reason"] == "cancelled" and runs[0]["tokens"] < 4000


async def test_a_new_request_supersedes_the_older_one(client):
    configure(client, LONG)
    uri = unique_uri("supersede")
    client.open(uri, SOURCE)
    token = f"old-{random.randrange(1 << 30)}"
    old = client.inline_nowait(uri, 1, 4, partial=token)
    await first_partial(client, token)
    configure(client, SHORT)
    new = client.inline_nowait(uri, 1, 5)
    old_response, new_response = await client.response(old), await client.response(new)
    assert error_code(old_response) == RESULT_CODES["server_cancelled"]
    assert "superseded" in old_response["error"]["message"]
    assert "result" in new_response


async def test_closing_a_document_cancels_its_request(client):
    configure(client, LONG)
    uri = unique_uri("close")
    client.open(uri, SOURCE)
    token = f"close-{random.randrange(1 << 30)}"
    msg_id = client.inline_nowait(uri, 1, 4, partial=token)
    await first_partial(client, token)
    client.close_document(uri)
    response = await client.response(msg_id, timeout=30)
    assert error_code(response) == RESULT_CODES["server_cancelled"]
    assert "closed" in response["error"]["message"]


async def test_overload_is_answered_busy_and_the_server_recovers(client):
    configure(client, LONG)
    uris = [unique_uri(f"busy{i}") for i in range(8)]
    for uri in uris:
        client.open(uri, SOURCE)
    ids = [client.inline_nowait(uri, 1, 4) for uri in uris]  # 1 running + 4 queued; the rest are refused
    await client.wait_for(lambda: sum(1 for i in ids if i in client.responses) >= 3, timeout=30)
    refused = [client.responses[i] for i in ids if i in client.responses]
    assert all(error_code(r) == RESULT_CODES["failed"] and "busy" in r["error"]["message"] for r in refused)
    for msg_id in ids:
        client.cancel(msg_id)
    await client.wait_for(lambda: all(i in client.responses for i in ids), timeout=30)
    configure(client, SHORT)
    assert "result" in await client.inline(uris[0], 1, 4)


# -- bad input ------------------------------------------------------------------------------------------


async def test_unknown_uri_is_a_clear_error(client):
    response = await client.inline("file:///never/opened.py", 0, 0)
    assert error_code(response) == RESULT_CODES["invalid_params"]
    assert "not open" in response["error"]["message"]


async def test_position_outside_the_document_is_a_clear_error(client):
    uri = unique_uri("outside")
    client.open(uri, "a = 1\n")
    response = await client.inline(uri, 99, 0)
    assert error_code(response) == RESULT_CODES["invalid_params"]
    assert "outside the document" in response["error"]["message"]
    huge = await client.inline(uri, 2**40, 2**40)
    assert error_code(huge) == RESULT_CODES["invalid_params"]
    assert "result" in await client.inline(uri, 0, 500), "a character past the line end means the line end"


async def test_huge_and_binary_documents_are_refused_and_said_so(client):
    big, binary = unique_uri("big"), unique_uri("binary")
    shown = len(client.messages())
    client.open(big, "x = 1\n" * 20_000)  # 120 KB, over the 64 KB limit of this server
    client.open(binary, "PK\x03\x04\x00\x00\x00binary")
    await client.wait_for(lambda: len(client.messages()) >= shown + 2)
    warnings = " ".join(m["message"] for m in client.messages()[shown:])
    assert "limit" in warnings and "binary" in warnings
    for uri in (big, binary):
        response = await client.inline(uri, 0, 0)
        assert error_code(response) == RESULT_CODES["failed"]


async def test_malformed_params_get_errors_and_the_server_stays_up(client):
    bad = [
        {"textDocument": {"uri": 5}, "position": {"line": 0, "character": 0}, "context": {"triggerKind": 1}},
        {"textDocument": {"uri": "file:///a.py"}, "position": {"line": -1, "character": 0}},
        {"position": "here"},
        [1, 2, 3],
        None,
    ]
    ids = [client.request_nowait("textDocument/inlineCompletion", params) for params in bad]
    for msg_id in ids:
        assert error_code(await client.response(msg_id)) == RESULT_CODES["invalid_params"]
    uri = unique_uri("after-malformed")
    client.open(uri, SOURCE)
    assert "result" in await client.inline(uri, 1, 4)


def hostile_messages(rng: random.Random, count: int) -> list[tuple[str, int | str | None]]:
    """(body, id the server must answer or None): broken JSON, wrong types, huge numbers, unknown methods."""
    methods = [
        "textDocument/inlineCompletion",
        "textDocument/completion",
        "textDocument/didOpen",
        "textDocument/didChange",
        "textDocument/didClose",
        "specComplete/stats",
        "workspace/didChangeConfiguration",
        "initialize",
        "$/cancelRequest",
        "no/suchMethod",
        "$/secret",
        "",
    ]
    values = [
        None,
        True,
        -1,
        0,
        2**63,
        10**40,
        1.5,
        "",
        "x" * 1000,
        [],
        {},
        {"uri": 1},
        [[[[[]]]]],
        "\ud800",
        {"line": 2**53, "character": -5},
    ]
    messages: list[tuple[str, int | str | None]] = []
    for n in range(count):
        kind = n % 6
        msg_id: int | str = rng.choice([n + 1_000_000, f"fuzz-{n}", 2**62 + n])
        if kind == 0:  # broken JSON
            body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": rng.choice(methods), "params": {}})
            messages.append((body[: rng.randrange(1, len(body) - 1)], None))
        elif kind == 1:  # not an object, or not JSON-RPC 2.0
            messages.append(
                (rng.choice(['"str"', "42", "null", "[]", '{"jsonrpc": "1.0"}', "{}", "[{}]"]), None)
            )
        elif kind == 2:  # requests with wrong types everywhere
            params = {
                "textDocument": rng.choice(values),
                "position": rng.choice(values),
                "context": rng.choice(values),
            }
            body = json.dumps(
                {"jsonrpc": "2.0", "id": msg_id, "method": rng.choice(methods), "params": params}
            )
            messages.append((body, msg_id))
        elif kind == 3:  # notifications with junk params
            body = json.dumps({"jsonrpc": "2.0", "method": rng.choice(methods), "params": rng.choice(values)})
            messages.append((body, None))
        elif kind == 4:  # bad ids and methods
            body = json.dumps({"jsonrpc": "2.0", "id": rng.choice([1.5, True, [], {}]), "method": "x"})
            messages.append((body, None))
        else:  # unknown methods and valid-looking requests on documents that do not exist
            method = rng.choice(["no/suchMethod", "textDocument/hover", "textDocument/inlineCompletion"])
            params = {
                "textDocument": {"uri": f"file:///fuzz/{n}.py"},
                "position": {"line": rng.choice([0, 2**31, 10**20]), "character": 0},
                "context": {"triggerKind": 1},
            }
            body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})
            messages.append((body, msg_id))
    return messages


async def test_fuzz_every_request_is_answered_and_completions_still_work(client):
    rng = random.Random(1234)
    messages = hostile_messages(rng, 1200)
    for body, _ in messages:
        client.send_raw(body)
    expected = {msg_id for _, msg_id in messages if msg_id is not None}
    assert len(expected) >= 400
    await client.wait_for(lambda: expected <= client.responses.keys(), timeout=90)
    assert all("error" in client.responses[i] or "result" in client.responses[i] for i in expected)
    assert client.null_id_errors, "broken JSON is answered with a parse error (id null)"
    uri = unique_uri("after-fuzz")
    client.open(uri, SOURCE)
    response = await client.inline(uri, 1, 4)
    assert "result" in response and response["result"]["items"]


async def test_lifecycle_out_of_order(ws_url):
    connection = await LspClient.websocket(ws_url, TOKEN)
    try:
        early = await connection.request("specComplete/stats")
        assert error_code(early) == -32002  # not initialized
        connection.open("file:///early.py", "x = 1\n")  # dropped: before initialize
        connection.notify("exit")  # exit without shutdown ends this connection (and only this one)
        await connection.wait_for(lambda: connection.closed, timeout=30)
    finally:
        await connection.kill()
    connection = await LspClient.websocket(ws_url, TOKEN)
    try:
        await connection.initialize(SHORT)
        again = await connection.request("initialize", {"capabilities": {}})
        assert error_code(again) == -32600
        connection.edit("file:///never.py", 2, 0, 0, "x")  # didChange before didOpen: said so, not fatal
        await connection.wait_for(lambda: any("not open" in m["message"] for m in connection.messages()))
        assert "result" in await connection.request("shutdown")
        after = await connection.request("specComplete/stats")
        assert error_code(after) == -32600 and "shutdown" in after["error"]["message"]
        connection.notify("exit")
        await connection.wait_for(lambda: connection.closed, timeout=30)
    finally:
        await connection.kill()


async def test_a_stdio_client_vanishing_mid_stream_ends_its_server_cleanly():
    client = await LspClient.stdio(*SERVER, "--stdio", stderr=asyncio.subprocess.PIPE)
    try:
        await client.initialize(LONG)
        uri = unique_uri("vanish")
        client.open(uri, SOURCE)
        client.inline_nowait(uri, 1, 4, partial="vanish")
        await first_partial(client, "vanish")
        client._process.stdin.close()  # the editor is gone: end of input mid-stream
        await asyncio.wait_for(client._process.wait(), 30)
        stderr = (await client._process.stderr.read()).decode()
        assert client.returncode == 1  # no shutdown came first
        assert "Traceback" not in stderr and "Fatal" not in stderr, stderr
    finally:
        await client.kill()


# -- WebSocket only: many clients, tokens, dying clients --------------------------------------------------


async def test_concurrent_clients_are_all_served(ws_url):
    clients = [await connect_ws(ws_url) for _ in range(4)]
    try:
        uris = [unique_uri(f"multi{i}") for i in range(len(clients))]
        for connection, uri in zip(clients, uris, strict=True):
            connection.open(uri, SOURCE)
        responses = await asyncio.gather(*(c.inline(u, 1, 4) for c, u in zip(clients, uris, strict=True)))
        assert all("result" in r for r in responses)
    finally:
        for connection in clients:
            await connection.kill()


async def test_a_client_killed_mid_stream_frees_the_worker(ws_url):
    survivor = await connect_ws(ws_url)
    before = await survivor.stats()
    dying = await connect_ws(ws_url, LONG)
    uri = unique_uri("dying")
    dying.open(uri, SOURCE)
    token = "dying"
    dying.inline_nowait(uri, 1, 4, partial=token)
    await first_partial(dying, token)
    await dying.kill()
    try:
        other = unique_uri("survivor")
        survivor.open(other, SOURCE)
        assert "result" in await survivor.inline(other, 1, 4, timeout=30)
        after = await survivor.stats()
        assert after["cancelled"] == before["cancelled"] + 1  # the dying client's run, stopped
        assert [r["uri"] for r in after["recent"]] == [other]  # only this client's own requests
    finally:
        await survivor.kill()


async def test_websocket_needs_the_token(ws_url):
    from websockets.exceptions import InvalidStatus

    for token in (None, "wrong-token-000"):
        with pytest.raises(InvalidStatus) as refused:
            await LspClient.websocket(ws_url, token)
        assert refused.value.response.status_code == 401
        assert b"token" in refused.value.response.body
    bearer = await LspClient.websocket(ws_url, TOKEN, bearer=True)
    try:
        await bearer.initialize(SHORT)
    finally:
        await bearer.kill()


@pytest.mark.parametrize(
    "flags, reason",
    [(["--host", "0.0.0.0"], "not a loopback"), (["--host", "0.0.0.0", "--allow-remote"], "without a token")],
)
async def test_binding_beyond_loopback_needs_a_flag_and_a_token(flags, reason):
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COMPLETE_TOKEN"}
    process = await asyncio.create_subprocess_exec(
        *SERVER, "--ws", "--port", "0", *flags, stderr=asyncio.subprocess.PIPE, env=env
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert reason in stderr.decode()


async def test_cross_file_and_fim_options_reach_the_completion_path(ws_url):
    """Other open documents travel with the request when crossFileTokens is on (the tiny model has no
    file separator token, so the prompt stays the same: the answer must not change)."""
    plain = await connect_ws(ws_url, SHORT)
    with_files = await connect_ws(ws_url, {**SHORT, "crossFileTokens": 256, "fim": "auto"})
    try:
        texts = []
        for connection in (plain, with_files):
            uri, other = unique_uri("cursor"), unique_uri("other")
            connection.open(other, SOURCE)
            connection.open(uri, SOURCE)
            texts.append((await connection.inline(uri, 1, 12))["result"]["items"][0]["insertText"])
        assert texts[0] == texts[1]
    finally:
        await plain.kill()
        await with_files.kill()
