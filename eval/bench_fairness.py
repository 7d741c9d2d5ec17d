"""Fairness: one client's large edits must not stall another client's requests.

    python eval/bench_fairness.py                     # tiny-random model, 10 s under load
    python eval/bench_fairness.py --seconds 30 --edits 100 --document-kb 1024

It starts its own WebSocket server on 127.0.0.1 (port 0, with the token the server prints). An
"editor" client opens a document of about --document-kb KB and sends didChange messages of --edits
range edits each, back to back (after each, one stats round trip: the editor runs at the server's
pace instead of piling messages up in buffers). Meanwhile an "observer" client, with a small
document of its own, sends requests one after another: a specComplete/stats and an inline
completion in turn. The observer's latencies are measured first with the server quiet, then under
the editor's load; the output is JSON with p50/p95/max per request kind and phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from lsp_server.client import LspClient, announced_url
from lsp_server.stats import percentile

OBSERVED_SOURCE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"


def big_document(kilobytes: int) -> str:
    line = "value_{:06d} = compute({:06d}, 'some padding text')\n"
    count = kilobytes * 1024 // len(line.format(0, 0))
    return "".join(line.format(i, i) for i in range(count))


def edit_message(uri: str, version: int, lines: int, edits: int) -> dict:
    """`edits` range edits spread over the document, each replacing 6 characters with 6 others."""
    step = max(1, lines // edits)
    changes = [
        {
            "range": {
                "start": {"line": (i * step + version) % lines, "character": 6},
                "end": {"line": (i * step + version) % lines, "character": 12},
            },
            "text": f"{version % 1_000_000:06d}",
        }
        for i in range(edits)
    ]
    return {"textDocument": {"uri": uri, "version": version}, "contentChanges": changes}


async def observe(client: LspClient, uri: str, until: float) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {"stats": [], "inline": []}
    while time.perf_counter() < until:
        started = time.perf_counter()
        await client.result("specComplete/stats")
        latencies["stats"].append(time.perf_counter() - started)
        started = time.perf_counter()
        response = await client.inline(uri, 1, 4)
        if "error" in response:
            raise RuntimeError(f"the observer's completion failed: {response['error']}")
        latencies["inline"].append(time.perf_counter() - started)
    return latencies


async def edit(client: LspClient, uri: str, lines: int, edits: int, stop: asyncio.Event) -> int:
    version = 1
    while not stop.is_set():
        version += 1
        client.notify("textDocument/didChange", edit_message(uri, version, lines, edits))
        await client.result("specComplete/stats")
    return version - 1


def summary(latencies: list[float]) -> dict:
    return {
        "requests": len(latencies),
        "p50_ms": round(1000 * percentile(latencies, 0.5), 1),
        "p95_ms": round(1000 * percentile(latencies, 0.95), 1),
        "max_ms": round(1000 * max(latencies), 1),
    }


async def bench(args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "lsp_server", "--ws", "--port", "0", "--target", args.target]
    command += ["--max-document-kb", str(2 * args.document_kb), "--max-new-tokens", str(args.max_new_tokens)]
    command += ["--threads", str(args.threads)]
    server = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(server.stdout.readline(), 600)).decode()
        url = announced_url(line)
        if url is None:
            raise RuntimeError(f"the server did not announce its URL: {line!r}")
        options = {"maxNewTokens": args.max_new_tokens, "syntax": False, "draft": "ngram"}
        observer, editor = await LspClient.websocket(url), await LspClient.websocket(url)
        await observer.initialize(options)
        await editor.initialize(options)
        observed = "file:///bench/observer.py"
        observer.open(observed, OBSERVED_SOURCE)
        await observer.inline(observed, 1, 4)  # warm-up
        quiet = await observe(observer, observed, time.perf_counter() + args.seconds / 2)

        text = big_document(args.document_kb)
        edited = "file:///bench/large.py"
        editor.open(edited, text)
        await editor.result("specComplete/stats")
        stop = asyncio.Event()
        editing = asyncio.create_task(edit(editor, edited, text.count("\n"), args.edits, stop))
        started = time.perf_counter()
        loaded = await observe(observer, observed, started + args.seconds)
        stop.set()
        messages = await editing
        elapsed = time.perf_counter() - started
        refused = [m["message"] for m in editor.messages()]
        await observer.kill()
        await editor.kill()
    finally:
        server.terminate()
        await server.wait()
    return {
        "target": args.target,
        "document_bytes": len(text.encode()),
        "edits_per_message": args.edits,
        "edit_messages": messages,
        "edit_messages_per_s": round(messages / elapsed, 1),
        "editor_warnings": refused,
        "quiet": {kind: summary(values) for kind, values in quiet.items()},
        "under_edits": {kind: summary(values) for kind, values in loaded.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="tiny-random")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="observed under load (and half as long quiet)"
    )
    parser.add_argument("--edits", type=int, default=100, help="range edits per didChange")
    parser.add_argument("--document-kb", type=int, default=1024, help="size of the edited document")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    result = asyncio.run(bench(args))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
