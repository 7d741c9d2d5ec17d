"""Autoscaling replicas (min 1, max 2) with the tiny model: the routing follows Ray Serve's replica set.

Nothing drives the scale by hand: Ray Serve's own autoscaler scales on the requests outstanding at
the front end's handle (target 1 per replica, no up- or down-scale delay, and its metrics pushed
every 0.5 s instead of 10 s, through Ray Serve's environment variables). The test makes the load
(long completions on three sessions) and waits, by asking for the stats, until the front end's
routing shows the second replica; then lets the load go and waits for the scale-down (Serve averages
over a 30 s window, so that takes up to about half a minute). Every request sent is answered.
Nothing sleeps: each wait is for an answer, bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import pytest_asyncio

from lsp_server.client import LspClient
from tests.servers import TINY_REPLICAS, ws_server

pytest.importorskip("ray.serve")
# the Ray waits below (a 300 s start, scale-up and -down deadlines) exceed the suite-wide 300 s
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

TOKEN = "autoscale-token-0123456789"
BOUNDS = [
    *TINY_REPLICAS, "--token", TOKEN,
    "--min-replicas", "1", "--max-replicas", "2", "--target-ongoing-requests", "1",
    "--upscale-delay-s", "0", "--downscale-delay-s", "0",
]  # fmt: skip
RAY_SERVE_PROMPT_METRICS = {
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
}
SHORT = {"syntax": False, "maxNewTokens": 16, "draft": "ngram", "temperature": 0}
LONG = {"syntax": False, "maxNewTokens": 4000, "draft": "none"}  # seconds of work each
SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
CANCELLED, SERVER_CANCELLED = -32800, -32802


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with ws_server(
        *BOUNDS, start_timeout=300, stop_timeout=60, exits_cleanly=True, env=RAY_SERVE_PROMPT_METRICS
    ) as url:
        yield url


async def connect(url: str, options: dict) -> LspClient:
    client = await LspClient.websocket(url, TOKEN)
    await client.initialize(options)
    return client


def names(stats: dict) -> list[str]:
    return [entry["name"] for entry in stats["replicas"]]


class Load:
    """Long completions kept running on several sessions: each answered one is sent again."""

    def __init__(self, clients: list[LspClient]) -> None:
        self.clients = clients
        self.uris = [f"file:///autoscale/load-{random.randrange(1 << 30)}.py" for _ in clients]
        self.pending: dict[int, int] = {}  # client index -> request id
        self.answers: list[dict] = []
        for client, uri in zip(clients, self.uris, strict=True):
            client.open(uri, SOURCE)

    def keep_up(self) -> None:
        for index, client in enumerate(self.clients):
            msg_id = self.pending.get(index)
            if msg_id is not None and msg_id in client.responses:
                self.answers.append(client.responses[msg_id])
                msg_id = None
            if msg_id is None:
                self.pending[index] = client.inline_nowait(self.uris[index], 1, 12)

    async def stop(self) -> None:
        """Cancel what runs; every request must still be answered (a result or a cancellation)."""
        for index, msg_id in self.pending.items():
            client = self.clients[index]
            client.cancel(msg_id)
            self.answers.append(await client.response(msg_id, timeout=120))
        self.pending.clear()


async def test_the_routing_follows_the_replicas_as_ray_serve_scales_up_and_down(server):
    observer = await connect(server, SHORT)
    loaders = [await connect(server, LONG) for _ in range(3)]
    try:
        start = await observer.stats()
        assert len(start["replicas"]) == 1, "min 1: it starts with one replica"
        (first,) = names(start)

        load = Load(loaders)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 150
        while True:  # the load keeps 3 requests outstanding on the one replica: Serve adds the second
            load.keep_up()
            stats = await observer.stats()
            if len(stats["replicas"]) == 2 and all(entry["healthy"] for entry in stats["replicas"]):
                break
            assert loop.time() < deadline, f"never scaled up: {stats['replicas']}"
        (second,) = [name for name in names(stats) if name != first]

        uri = f"file:///autoscale/new-{random.randrange(1 << 30)}.py"
        observer.open(uri, SOURCE)  # a new session goes to the new, idle replica
        before = {entry["name"]: entry["requests"] for entry in stats["replicas"]}
        assert (await observer.inline(uri, 1, 12, timeout=120))["result"]["items"]
        after = {entry["name"]: entry["requests"] for entry in (await observer.stats())["replicas"]}
        assert after[second] - before[second] == 1

        await load.stop()
        deadline = loop.time() + 150
        served = 0
        while True:  # no load: Serve takes a replica away; the sessions on it move and are served
            for client, session in zip(loaders, load.uris, strict=True):
                client.notify("workspace/didChangeConfiguration", {"settings": {"specComplete": SHORT}})
                assert (await client.inline(session, 1, 12, timeout=120))["result"]["items"]
                served += 1
            stats = await observer.stats()
            if len(stats["replicas"]) == 1:
                break
            assert loop.time() < deadline, f"never scaled down: {stats['replicas']}"
        for client, session in zip(loaders, load.uris, strict=True):  # wherever they were, served now
            assert (await client.inline(session, 1, 12, timeout=120))["result"]["items"]
        assert (await observer.inline(uri, 1, 12, timeout=120))["result"]["items"]

        for answer in load.answers:  # nothing lost: a completion, or the cancellation the test asked for
            assert "result" in answer or answer["error"]["code"] in (CANCELLED, SERVER_CANCELLED), answer
        assert (await observer.stats())["errors"] == 0
    finally:
        for client in (observer, *loaders):
            await client.kill()
