"""In the editor: typing through a suggestion, the next one prefetched on accept, and what the editor
reports about suggestions (tiny random model over stdio). Nothing sleeps: every wait asks the server."""

from __future__ import annotations

import asyncio
import random
import sys

import pytest
import pytest_asyncio

from lsp_server.client import LspClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = [sys.executable, "-m", "lsp_server", "--target", "tiny-random", "--threads", "1", "--stdio"]
OPTIONS = {"syntax": False, "maxNewTokens": 12, "draft": "ngram", "temperature": 0, "lines": "multi"}
SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    ret"
END = (5, 7)  # the end of SOURCE
ACCEPT = "specComplete.didAcceptCompletion"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    client = await LspClient.stdio(*SERVER)
    await client.initialize(OPTIONS)
    yield client
    await client.close()


@pytest_asyncio.fixture(loop_scope="module")
async def client(server):
    server.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": OPTIONS}})
    return server


def unique_uri(name: str) -> str:
    return f"file:///suggestions/{name}-{random.randrange(1 << 30)}.py"


def after(position: tuple[int, int], inserted: str) -> tuple[int, int]:
    """The cursor after typing `inserted` at `position` (ASCII text: one code unit per character)."""
    line, character = position
    if "\n" not in inserted:
        return line, character + len(inserted)
    return line + inserted.count("\n"), len(inserted.rsplit("\n", 1)[1])


def item_of(response: dict) -> dict:
    items = response["result"]["items"]
    assert len(items) == 1, f"expected one item: {response}"
    return items[0]


async def stats_when(client: LspClient, condition, timeout: float = 60) -> dict:
    """Ask for stats until `condition(stats)` holds (each ask awaits the server's answer)."""

    async def until() -> dict:
        while True:
            stats = await client.stats()
            if condition(stats):
                return stats

    return await asyncio.wait_for(until(), timeout)


MODEL_WORK = ("requests", "tokens", "target_forwards", "prefill_tokens")


def model_work(stats: dict) -> dict:
    return {name: stats[name] for name in MODEL_WORK}


async def test_typing_through_a_suggestion_is_answered_from_the_cache_with_the_same_text(client):
    uri = unique_uri("typing")
    client.open(uri, SOURCE)
    first = item_of(await client.inline(uri, *END))
    text = first["insertText"]
    assert len(text) >= 3
    before = await client.stats()
    client.notify("textDocument/didShowCompletion", {"item": first})

    client.edit(uri, 2, *END, text[:2])  # the user types the suggestion's first two characters
    typed = item_of(await client.inline(uri, *after(END, text[:2])))
    assert typed["insertText"] == text[2:]
    assert typed["command"] == {**first["command"], "arguments": [first["command"]["arguments"][0], 2]}

    client.edit(uri, 3, *END, "", end=after(END, text[:2]))  # undo: back to the known state
    undone = item_of(await client.inline(uri, *END))
    assert undone["insertText"] == text

    now = await client.stats()
    assert model_work(now) == model_work(before), "no model call for either answer"
    assert now["cache_hits"] == before["cache_hits"] + 2
    assert [entry["kind"] for entry in now["recent"][-2:]] == ["cache", "cache"]
    assert now["suggestions"]["shown"] == before["suggestions"]["shown"] + 1


async def test_typing_other_text_asks_the_model(client):
    uri = unique_uri("other")
    client.open(uri, SOURCE)
    text = item_of(await client.inline(uri, *END))["insertText"]
    before = await client.stats()
    other = "Z" if not text.startswith("Z") else "Y"
    client.edit(uri, 2, *END, other)
    await client.inline(uri, *after(END, other))
    now = await client.stats()
    assert now["requests"] == before["requests"] + 1 and now["cache_hits"] == before["cache_hits"]


@pytest.mark.parametrize("edit_first", [True, False], ids=["edit-then-accept", "accept-then-edit"])
async def test_accepting_prefetches_the_next_completion_which_is_then_ready(client, edit_first):
    uri = unique_uri("prefetch")
    client.open(uri, SOURCE)
    item = item_of(await client.inline(uri, *END))
    text = item["insertText"]
    before = await client.stats()
    accept = {"command": ACCEPT, "arguments": item["command"]["arguments"]}
    if edit_first:  # VS Code applies the edit, then runs the item's command
        client.edit(uri, 2, *END, text)
        assert "result" in await client.request("workspace/executeCommand", accept)
    else:
        assert "result" in await client.request("workspace/executeCommand", accept)
        client.edit(uri, 2, *END, text)

    ready = await stats_when(client, lambda s: any(e["kind"] == "prefetch" for e in s["recent"][-3:]))
    prefetch = next(e for e in reversed(ready["recent"]) if e["kind"] == "prefetch")
    assert ready["prefetches"] == before["prefetches"] + 1
    assert ready["requests"] == before["requests"], "a prefetch is not a request"
    assert ready["suggestions"]["accepted"] == before["suggestions"]["accepted"] + 1

    cursor = after(END, text)
    answer = item_of(await client.inline(uri, *cursor))
    now = await client.stats()
    assert model_work(now) == model_work(ready), "the prefetched completion answered the request"
    served = now["recent"][-1]
    assert served["kind"] == "cache"
    # served from the cache (model_work above): sooner than the model made it, a margin many times one
    # decode step's ~1 ms, which a busy host's stalls could exceed
    assert served["ttft_s"] < prefetch["wall_s"], (served, prefetch)

    # a prefetch is a real completion: the same text a request there gets from the model
    fresh = unique_uri("fresh")
    client.open(fresh, SOURCE + text)
    assert item_of(await client.inline(fresh, *cursor))["insertText"] == answer["insertText"]


async def test_another_edit_cancels_the_prefetch(client):
    uri = unique_uri("cancel")
    client.open(uri, SOURCE)
    item = item_of(await client.inline(uri, *END))
    text = item["insertText"]
    client.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": {"maxNewTokens": 4000}}})
    before = await client.stats()
    client.edit(uri, 2, *END, text)
    await client.request(
        "workspace/executeCommand", {"command": ACCEPT, "arguments": item["command"]["arguments"]}
    )
    await stats_when(client, lambda s: s["prefetches"] == before["prefetches"] + 1)
    client.edit(uri, 3, 0, 0, "# an edit elsewhere\n")
    now = await stats_when(client, lambda s: s["prefetches_cancelled"] == before["prefetches_cancelled"] + 1)
    assert now["cancelled"] == before["cancelled"], "a cancelled prefetch is not a cancelled request"


async def test_partial_accepts_count_characters_and_the_rest_comes_from_the_cache(client):
    uri = unique_uri("partial")
    client.open(uri, SOURCE)
    item = item_of(await client.inline(uri, *END))
    text = item["insertText"]
    before = await client.stats()
    client.notify("textDocument/didShowCompletion", {"item": item})
    client.edit(uri, 2, *END, text[:3])
    client.notify("textDocument/didPartiallyAcceptCompletion", {"item": item, "acceptedLength": 3})
    rest = item_of(await client.inline(uri, *after(END, text[:3])))
    assert rest["insertText"] == text[3:]
    now = await client.stats()
    assert model_work(now) == model_work(before) and now["prefetches"] == before["prefetches"]
    suggestions, earlier = now["suggestions"], before["suggestions"]
    assert suggestions["partially_accepted"] == earlier["partially_accepted"] + 1
    assert suggestions["partially_accepted_chars"] == earlier["partially_accepted_chars"] + 3
    by_language = suggestions["by_language"]["python"]
    assert by_language["shown"] >= 1 and by_language["accept_rate"] == pytest.approx(
        by_language["accepted"] / by_language["shown"], abs=1e-4
    )
    assert "ngram" in suggestions["by_draft"]


async def test_typing_through_a_streaming_completion_waits_for_it_instead_of_cancelling_it(client):
    uri = unique_uri("streaming")
    client.open(uri, SOURCE)
    client.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": {"maxNewTokens": 400}}})
    before = await client.stats()
    first = client.inline_nowait(uri, *END, partial="stream-1")
    await client.wait_for(
        lambda: any(
            v["items"] and len(v["items"][0]["insertText"]) >= 2 for v in client.progress.get("stream-1", [])
        )
    )
    shown = next(v["items"][0]["insertText"] for v in client.progress["stream-1"] if v["items"])
    client.edit(uri, 2, *END, shown[:1])  # type the first character of what is on screen
    client.cancel(first)  # as an editor does when the user types on
    second = await client.inline(uri, *after(END, shown[:1]), timeout=120)
    now = await client.stats()
    assert now["requests"] == before["requests"] + 1, "one model call answered both"
    assert now["cancelled"] == before["cancelled"]
    assert (await client.response(first))["error"]["code"] == -32800
    assert item_of(second)["insertText"].startswith(shown[1:])


async def test_lines_and_languages_options_shape_what_is_asked(client):
    client.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": {"lines": "single"}}})
    uri = unique_uri("single")
    client.open(uri, SOURCE)
    single = await client.inline(uri, *END)
    assert all("\n" not in item["insertText"] for item in single["result"]["items"])

    client.notify(
        "workspace/didChangeConfiguration", {"settings": {"specComplete": {"languages": {"python": False}}}}
    )
    off = unique_uri("off")
    client.open(off, SOURCE)
    before = await client.stats()
    assert (await client.inline(off, *END))["result"]["items"] == []
    assert (await client.stats())["requests"] == before["requests"], "no model call in a disabled language"
    client.notify(
        "workspace/didChangeConfiguration", {"settings": {"specComplete": {"languages": {"*": True}}}}
    )

    client.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": {"lines": "sometimes"}}})
    await client.wait_for(lambda: any("lines must be one of" in m["message"] for m in client.messages()))


@pytest.mark.parametrize(
    ("method", "params", "says"),
    [
        ("textDocument/didShowCompletion", None, "params.item must be"),
        ("textDocument/didShowCompletion", {"item": {"insertText": "x"}}, "params.item must be"),
        ("textDocument/didPartiallyAcceptCompletion", {"item": "ITEM"}, "acceptedLength must be"),
        (
            "textDocument/didPartiallyAcceptCompletion",
            {"item": "ITEM", "acceptedLength": -1},
            "acceptedLength",
        ),
        ("textDocument/didPartiallyAcceptCompletion", {"item": "ITEM", "acceptedLength": 10**6}, "is longer"),
    ],
)
async def test_bad_reports_get_a_clear_message_and_the_server_keeps_serving(client, method, params, says):
    uri = unique_uri("bad")
    client.open(uri, SOURCE)
    item = item_of(await client.inline(uri, *END))
    if isinstance(params, dict) and params.get("item") == "ITEM":
        params = {**params, "item": item}
    seen = len(client.messages())
    client.notify(method, params)
    await client.wait_for(lambda: any(says in m["message"] for m in client.messages()[seen:]))
    assert (await client.inline(uri, *END))["result"]["items"], "the server still answers"


async def test_a_bad_accept_command_is_an_invalid_params_error(client):
    response = await client.request("workspace/executeCommand", {"command": ACCEPT, "arguments": [7, "x"]})
    assert response["error"]["code"] == -32602 and "suggestion id" in response["error"]["message"]
    unknown = await client.request(
        "workspace/executeCommand", {"command": ACCEPT, "arguments": ["s999999", 0]}
    )
    assert unknown["result"] is None  # an id dropped from the cache: nothing to count
