"""Two engine replicas on a local Ray instance behind one WebSocket front end, with the tiny model.

One server (front end + Ray + 2 replicas) serves the whole module: starting it costs about 20 s
here. The tests run in file order and each uses fresh clients and documents; the replica-killing
test goes last. Nothing sleeps: each wait is for a response, with a timeout (waits on replica-side
figures re-ask for the stats until they show, bounded by a deadline).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import urllib.error
import urllib.request

import pytest
import pytest_asyncio

from lsp_server.client import LspClient
from tests.servers import TINY_REPLICAS, ws_server

pytest.importorskip("ray.serve")
# the Ray waits below (a 300 s start, 120 s answers and replacements) exceed the suite-wide 300 s
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

TOKEN = "replica-token-0123456789"
REPLICAS = [
    *TINY_REPLICAS, "--token", TOKEN,
    "--replicas", "2",
    "--row-cost", "0",  # n-gram drafts keep their size on any host: the ngram metric must appear
]  # fmt: skip
SHORT = {"syntax": False, "maxNewTokens": 16, "draft": "ngram", "temperature": 0}
LONG = {"syntax": False, "maxNewTokens": 4000, "draft": "none"}  # seconds of work: long enough to cancel
SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
CANCELLED, SERVER_CANCELLED, INTERNAL_ERROR = -32800, -32802, -32603


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    # terminating the front end shuts Serve and its local Ray instance down: allow it a minute
    async with ws_server(*REPLICAS, start_timeout=300, stop_timeout=60, exits_cleanly=True) as url:
        yield url


async def connect(url: str, options: dict = SHORT) -> LspClient:
    client = await LspClient.websocket(url, TOKEN)
    await client.initialize(options)
    return client


def unique_uri(name: str) -> str:
    return f"file:///replicas/{name}-{random.randrange(1 << 30)}.py"


def change_after_cursor(client: LspClient, uri: str, version: int) -> None:
    """Edit SOURCE's last line, so that the next request at (1, 12) is a new state: the suggestion
    cache would otherwise answer a repeated request without the model."""
    client.edit(uri, version, 5, 16, " ")


def by_name(stats: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in stats["replicas"]}


def grew(before: dict, after: dict, field: str = "requests") -> dict[str, int]:
    """Per replica, how much `field` grew between two stats answers."""
    old, new = by_name(before), by_name(after)
    return {name: new[name][field] - old[name][field] for name in new}


async def stats_until(client: LspClient, holds, timeout: float = 60) -> dict:
    """Ask for the stats until holds(stats); each ask awaits an answer, the deadline bounds them all."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        stats = await client.stats()
        if holds(stats):
            return stats
        assert asyncio.get_running_loop().time() < deadline, f"stats never showed it: {stats['replicas']}"


async def test_a_session_sticks_to_one_replica_and_a_second_session_goes_to_the_other(server):
    first, second = await connect(server), await connect(server)
    try:
        start = await first.stats()
        assert len(start["replicas"]) == 2 and all(entry["healthy"] for entry in start["replicas"])
        uri_a, uri_b = unique_uri("a"), unique_uri("b")
        first.open(uri_a, SOURCE)
        for version in range(2, 5):
            change_after_cursor(first, uri_a, version)
            assert (await first.inline(uri_a, 1, 12))["result"]["items"]
        after_a = await first.stats()
        assert sorted(grew(start, after_a).values()) == [0, 3], "all three requests on one replica"
        (home_a,) = [name for name, count in grew(start, after_a).items() if count == 3]

        second.open(uri_b, SOURCE)
        for version in range(2, 5):
            change_after_cursor(second, uri_b, version)
            assert (await second.inline(uri_b, 1, 12))["result"]["items"]
        after_b = await second.stats()
        moved = grew(after_a, after_b)
        assert moved[home_a] == 0 and sum(moved.values()) == 3, "the second session is on the other replica"
        assert [entry["sessions"] for entry in after_b["replicas"]] == [1, 1]
        assert after_b["requests"] - start["requests"] == 6  # totals add up over the replicas
        assert all(entry["ttft_p50_s"] is not None for entry in after_b["replicas"])
    finally:
        await first.kill()
        await second.kill()


async def test_cancel_request_reaches_the_replica(server):
    client = await connect(server, LONG)
    try:
        uri = unique_uri("cancel")
        client.open(uri, SOURCE)
        before = await client.stats()
        token = f"cancel-{random.randrange(1 << 30)}"
        msg_id = client.inline_nowait(uri, 1, 12, partial=token)
        await client.wait_for(lambda: len(client.progress.get(token, [])) >= 1, timeout=60)
        client.cancel(msg_id)
        assert (await client.response(msg_id))["error"]["code"] == CANCELLED
        # the replica's own answer for the cancelled run: stopped early, counted on that replica
        after = await stats_until(client, lambda stats: sum(grew(before, stats, "cancelled").values()) == 1)
        run = after["recent"][-1]
        assert run["stop_reason"] == "cancelled" and run["tokens"] < 4000
    finally:
        await client.kill()


async def test_a_newer_request_supersedes_the_running_one_on_its_replica(server):
    client = await connect(server, LONG)
    try:
        uri = unique_uri("supersede")
        client.open(uri, SOURCE)
        token = f"old-{random.randrange(1 << 30)}"
        old = client.inline_nowait(uri, 1, 12, partial=token)
        await client.wait_for(lambda: len(client.progress.get(token, [])) >= 1, timeout=60)
        client.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": SHORT}})
        new = client.inline_nowait(uri, 1, 12)
        old_response = await client.response(old)
        assert old_response["error"]["code"] == SERVER_CANCELLED
        assert "superseded" in old_response["error"]["message"]
        assert (await client.response(new))["result"]["items"]
    finally:
        await client.kill()


def scrape(url: str, token: str | None) -> tuple[int, str]:
    """GET /metrics on the front end's port (plain HTTP, as Prometheus does)."""
    request = urllib.request.Request(url.replace("ws://", "http://") + "/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


async def test_metrics_endpoint_reports_per_replica_in_prometheus_format(server):
    client = await connect(server)
    try:
        uri = unique_uri("metrics")
        client.open(uri, SOURCE)
        assert (await client.inline(uri, 1, 12))["result"]["items"]
        names = list(by_name(await client.stats()))
    finally:
        await client.kill()
    status, text = await asyncio.to_thread(scrape, server, TOKEN)
    assert status == 200
    for replica in names:
        assert f'spec_complete_replica_up{{replica="{replica}"}} 1.0' in text
        assert f'spec_complete_queue_length{{replica="{replica}"}}' in text
    completed = r'spec_complete_requests_total\{outcome="completed",replica="[^"]+"\} [1-9]'
    assert re.search(completed, text)
    assert "spec_complete_ttft_seconds_bucket{" in text
    assert "spec_complete_tokens_per_second_bucket{" in text
    assert re.search(r'spec_complete_accepted_tokens_total\{replica="[^"]+",source="ngram"\}', text)
    assert (await asyncio.to_thread(scrape, server, None))[0] == 401  # behind the token like the rest


async def test_killing_a_replica_mid_stream_loses_no_request(server):
    """SIGKILL the replica serving a long stream: every request is answered and Ray replaces it."""
    streaming, other = await connect(server, LONG), await connect(server)
    try:
        uri = unique_uri("doomed")
        streaming.open(uri, SOURCE)
        before = await streaming.stats()
        token = f"doomed-{random.randrange(1 << 30)}"
        doomed = streaming.inline_nowait(uri, 1, 12, partial=token)
        await streaming.wait_for(lambda: len(streaming.progress.get(token, [])) >= 1, timeout=60)
        stats = await stats_until(
            streaming, lambda s: any(e["queue"] == 1 and e["pid"] for e in s["replicas"])
        )
        (victim,) = [entry for entry in stats["replicas"] if entry["queue"] == 1]
        other_uri = unique_uri("bystander")
        other.open(other_uri, SOURCE)
        bystanders = [other.inline_nowait(other_uri, 1, 12) for _ in range(1)]
        os.kill(victim["pid"], signal.SIGKILL)

        answer = await streaming.response(doomed, timeout=120)
        if "error" in answer:  # allowed, when it says what happened
            assert answer["error"]["code"] == INTERNAL_ERROR and "replica" in answer["error"]["message"]
        else:
            assert answer["result"]["items"], "retried on the other replica"
        for msg_id in bystanders:
            assert "result" in await other.response(msg_id, timeout=120)

        streaming.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": SHORT}})
        for version in range(2, 5):  # later requests of the same session succeed, on the replica left
            change_after_cursor(streaming, uri, version)
            assert (await streaming.inline(uri, 1, 12, timeout=120))["result"]["items"]
        after = await streaming.stats()
        assert after["requests"] >= before["requests"] + 5
        assert after["retried"] >= 1 or "error" in answer

        # Ray Serve replaces the dead replica with a new one (a new name), which the front end learns
        # of from Serve's router. Until then the test keeps the other client busy (each wait is a
        # real request's answer).
        deadline = asyncio.get_running_loop().time() + 120
        while True:
            entries = by_name(await other.stats())
            fresh = [name for name in entries if name not in by_name(before)]
            if fresh and entries[fresh[0]]["healthy"] and entries[fresh[0]]["pid"]:
                break
            assert asyncio.get_running_loop().time() < deadline, f"never replaced: {entries}"
            assert "result" in await other.inline(other_uri, 1, 12, timeout=120)
        (replacement,) = fresh
        assert victim["name"] not in entries and len(entries) == 2  # the dead one is gone from the set
        newcomer = unique_uri("newcomer")  # the replacement has no sessions: a new one goes there
        other.open(newcomer, SOURCE)
        served = await other.stats()
        assert "result" in await other.inline(newcomer, 1, 12, timeout=120)
        assert grew(served, await other.stats())[replacement] == 1
    finally:
        await streaming.kill()
        await other.kill()
