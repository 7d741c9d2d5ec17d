"""Load the WebSocket server: many clients typing, asking, cancelling at once. Loopback only, bounded.

    python eval/load_ws.py                                  # 8 clients x 50 requests, tiny-random model
    python eval/load_ws.py --target smollm2-135m --max-new-tokens 16
    python eval/load_ws.py --clients 16 --requests 25 --replicas 2   # engine replicas on Ray Serve

It starts its own server on 127.0.0.1 (port 0). Each client opens two documents and, 50 times,
edits one at random, asks for an inline completion and sometimes cancels it (at once, or after the
first partial result) or supersedes it with a newer request. Every request must end with a result,
an error or a cancellation within --request-timeout seconds, else it counts as unanswered. The
server's resident memory is sampled throughout. Exit status 1 when a request went unanswered.

With --replicas N the server runs N engine replicas on a local Ray instance (`serve --replicas`);
the report adds each replica's requests, sessions and peak memory, and the front end's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from lsp_server.client import LspClient, start_ws_server, stop_process

SOURCE = '''import math


def area(radius):
    """The area of a circle."""
    return math.pi * radius ** 2


def circumference(radius):
    return 2 * math.pi * radius


class Shape:
    def __init__(self, name):
        self.name = name

    def describe(self):
        return f"{self.name} with area {self.area():.2f}"
'''
SNIPPETS = ["x", " ", "\n", "return ", "self.", "(", ")", "def f(a, b):\n    ", "# note\n", "radius", "1"]
CODE_NAMES = {-32800: "cancelled", -32802: "server_cancelled", -32803: "busy", -32602: "invalid_params"}


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # answered with a result
    all_latencies: list[float] = field(default_factory=list)
    unanswered: int = 0


def rss_kb(pid: int, field_name: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


async def client_session(url: str, number: int, args: argparse.Namespace, tally: Tally) -> None:
    rng = random.Random(args.seed + number)
    client = await LspClient.websocket(url)
    try:
        await client.initialize({"maxNewTokens": args.max_new_tokens, "syntax": rng.random() < 0.5})
        documents = {f"file:///load/{number}/{name}.py": [SOURCE, 1] for name in ("a", "b")}
        for uri, (text, _) in documents.items():
            client.open(uri, text)
        for request in range(args.requests):
            uri = rng.choice(list(documents))
            text, version = documents[uri]
            text, line, character = random_edit(client, rng, uri, text, version + 1)
            documents[uri] = [text, version + 1]
            token = f"{number}-{request}"
            started = time.perf_counter()
            msg_id = client.inline_nowait(uri, line, character, partial=token)
            action = rng.random()
            if action < args.cancel_rate / 2:
                client.cancel(msg_id)  # at once: often still queued
            elif action < args.cancel_rate:
                await wait_quietly(
                    client, lambda t=token, m=msg_id: t in client.progress or m in client.responses
                )
                client.cancel(msg_id)  # mid-stream
            elif action < args.cancel_rate + args.supersede_rate:
                superseding = client.inline_nowait(uri, line, character)
                await record(client, superseding, time.perf_counter(), args, tally)
            await record(client, msg_id, started, args, tally)
            await asyncio.sleep(
                rng.uniform(0, args.think_ms / 1000)
            )  # typing pace; not a test: sleeping is fine
    finally:
        await client.kill()


def random_edit(client: LspClient, rng: random.Random, uri: str, text: str, version: int):
    """Insert a snippet at a random line end (or delete a few characters); returns the new text and cursor."""
    lines = text.split("\n")
    line = rng.randrange(len(lines))
    if rng.random() < 0.2 and len(lines[line]) > 3:
        start = rng.randrange(len(lines[line]) - 2)
        client.edit(uri, version, line, start, "", end=(line, start + 2))
        lines[line] = lines[line][:start] + lines[line][start + 2 :]
        return "\n".join(lines), line, start
    snippet = rng.choice(SNIPPETS)
    character = len(lines[line])
    client.edit(uri, version, line, character, snippet)
    new_text = "\n".join(lines[:line] + [lines[line] + snippet] + lines[line + 1 :])
    new_lines = snippet.split("\n")
    cursor_line = line + len(new_lines) - 1
    cursor_character = (character if len(new_lines) == 1 else 0) + len(new_lines[-1])
    return new_text, cursor_line, cursor_character


async def wait_quietly(client: LspClient, condition, timeout: float = 30) -> None:
    try:
        await client.wait_for(condition, timeout)
    except (TimeoutError, ConnectionError):
        pass


async def record(client: LspClient, msg_id, started: float, args: argparse.Namespace, tally: Tally) -> None:
    try:
        response = await client.response(msg_id, args.request_timeout)
    except (TimeoutError, ConnectionError):
        tally.unanswered += 1
        tally.outcomes["unanswered"] += 1
        return
    elapsed = time.perf_counter() - started
    tally.all_latencies.append(elapsed)
    if "result" in response:
        tally.outcomes["result"] += 1
        tally.latencies.append(elapsed)
    else:
        code = response["error"]["code"]
        tally.outcomes[CODE_NAMES.get(code, f"error {code}")] += 1


async def run(args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "lsp_server", "--ws", "--port", "0", "--target", args.target]
    command += ["--queue-size", str(args.queue_size)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.replicas:
        cpus = os.cpu_count() or 1
        command += ["--replicas", str(args.replicas), "--ray-cpus", str(cpus)]
        command += ["--cpus-per-replica", str(min(1.0, cpus / args.replicas))]
    server, url = await start_ws_server(command, timeout=600)  # loopback, with this run's token
    try:
        rss_start = rss_kb(server.pid)
        samples = [rss_start]
        tally = Tally()
        started = time.perf_counter()

        async def sample_memory() -> None:
            while True:
                samples.append(rss_kb(server.pid))
                await asyncio.sleep(0.2)

        sampler = asyncio.create_task(sample_memory())
        clients = [client_session(url, n, args, tally) for n in range(args.clients)]
        try:
            await asyncio.wait_for(asyncio.gather(*clients), args.max_seconds)
        finally:
            sampler.cancel()
        wall = time.perf_counter() - started
        stats_client = await LspClient.websocket(url)  # aggregate counters are the same for every client
        await stats_client.initialize()
        stats = await stats_client.stats()
        await stats_client.kill()
        peak = rss_kb(server.pid, "VmHWM")
    finally:
        await stop_process(server, timeout=120)  # with --replicas, the server takes Ray down first
    answered = len(tally.latencies)
    return {
        "target": args.target,
        "clients": args.clients,
        "requests_per_client": args.requests,
        "wall_s": round(wall, 1),
        "outcomes": dict(tally.outcomes),
        "sent": sum(tally.outcomes.values()),
        "unanswered": tally.unanswered,
        "latency_result_p50_s": quantile(tally.latencies, 0.5),
        "latency_result_p95_s": quantile(tally.latencies, 0.95),
        "latency_all_p50_s": quantile(tally.all_latencies, 0.5),
        "latency_all_p95_s": quantile(tally.all_latencies, 0.95),
        "rss_start_mb": round(rss_start / 1024, 1),
        "rss_end_mb": round(samples[-1] / 1024, 1),
        "rss_peak_mb": round(peak / 1024, 1),
        "completions_per_s": round(answered / wall, 2),
        "server": {
            k: stats[k] for k in ("requests", "cancelled", "busy", "tokens", "ttft_p50_s", "ttft_p95_s")
        },
        "replicas": [
            {
                "name": entry["name"],
                "requests": entry["requests"],
                "sessions": entry["sessions"],
                "tokens_per_s": entry["tokens_per_s"],
                "ttft_p50_s": entry["ttft_p50_s"],
                "peak_rss_mb": round(entry["max_rss_kb"] / 1024, 1) if entry.get("max_rss_kb") else None,
            }
            for entry in stats.get("replicas", [])
        ],
        "retried": stats.get("retried"),
    }


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 4)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1], 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="tiny-random")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50, help="per client")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--cancel-rate", type=float, default=0.2)
    parser.add_argument("--supersede-rate", type=float, default=0.1)
    parser.add_argument("--think-ms", type=float, default=30, help="the most a client waits between requests")
    parser.add_argument("--queue-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--request-timeout", type=float, default=120)
    parser.add_argument("--max-seconds", type=float, default=900, help="the whole run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--replicas", type=int, default=0, help="engine replicas on Ray Serve (default 0: one process)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 64 or not 1 <= args.requests <= 1000 or not 0 <= args.replicas <= 16:
        parser.error("keep the load bounded: 1-64 clients, 1-1000 requests each, 0-16 replicas")
    report = asyncio.run(run(args))
    print(json.dumps(report, indent=2))
    return 1 if report["unanswered"] else 0


if __name__ == "__main__":
    sys.exit(main())
