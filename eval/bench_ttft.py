"""Time to first token through the language server: cold, after a one-character edit, after opening a file.

    python eval/bench_ttft.py                      # the embedded model (smollm2-135m), stdio
    python eval/bench_ttft.py --target tiny-random --repeats 3

1. For each context size, each repeat opens a fresh document (a unique first line, so nothing of it
   is in the engine's KV cache) and at once asks for an inline completion at its end: the cold
   request (sent before the server's background warm-up starts). Then it types one character at
   the cursor and asks again: the engine reuses the cached prefix and prefills only the changed tail.
2. Opening a file: 4 related files and then the main file (fresh, ~3k tokens) are opened, the client
   waits `--idle` seconds (the user reading; the server warms up in the background), then asks for
   a completion at a line about 2k tokens in. Idle 0 measures the server without a warm-up's help.

TTFT is measured by the client, from sending the request to the first partial result ($/progress),
and by the server (stats ttft_s, prefill_tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import sys
import time

from lsp_server.client import LspClient


def python_source(chars: int) -> str:
    """Real Python code from the standard library, cut at a line end near `chars` characters."""
    import argparse as argparse_module
    import json.decoder
    import textwrap

    text = "".join(inspect.getsource(m) for m in (textwrap, json.decoder, argparse_module))
    cut = text.rfind("\n", 0, chars)
    return text[: cut + 1]


def related_sources() -> dict[str, str]:
    """Four other standard-library files, opened beside the main one (as an editor's other tabs)."""
    import json.encoder
    import json.scanner
    import shlex
    import string

    return {m.__name__: inspect.getsource(m) for m in (json.encoder, json.scanner, shlex, string)}


async def one_request(
    client: LspClient, uri: str, line: int, character: int, token: str
) -> tuple[float, dict]:
    """(client-side TTFT in seconds, the server's stats for the request)."""
    started = time.perf_counter()
    msg_id = client.inline_nowait(uri, line, character, partial=token)
    await client.wait_for(lambda: token in client.progress or msg_id in client.responses, timeout=300)
    ttft = time.perf_counter() - started
    response = await client.response(msg_id, timeout=300)
    if "error" in response:
        raise RuntimeError(f"request failed: {response['error']}")
    stats = (await client.stats())["recent"][-1]
    return ttft, stats


async def bench(args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "lsp_server", "--stdio", "--target", args.target]
    if args.threads:
        command += ["--threads", str(args.threads)]
    client = await LspClient.stdio(*command)
    results: dict = {"target": args.target, "sizes": []}
    try:
        await client.initialize({"maxNewTokens": args.max_new_tokens, "syntax": False})
        warmup = "file:///bench/warmup.py"
        client.open(warmup, python_source(2000))
        await one_request(client, warmup, 10, 0, "warmup")
        for chars in args.chars:
            rows = {"cold": [], "edit": []}
            for repeat in range(args.repeats):
                uri = f"file:///bench/{chars}-{repeat}.py"
                text = f"# bench {chars} {repeat} {time.time()}\n" + python_source(chars)
                client.open(uri, text)
                line = text.count("\n")  # the empty last line: the cursor at the end of the document
                rows["cold"].append(await one_request(client, uri, line, 0, f"cold-{chars}-{repeat}"))
                client.edit(uri, 2, line, 0, "d")  # one character typed at the cursor
                rows["edit"].append(await one_request(client, uri, line, 1, f"edit-{chars}-{repeat}"))
                client.close_document(uri)
            results["sizes"].append(summarise(chars, rows))
        results["open"] = [await after_open(client, idle, args.repeats) for idle in args.idle]
    finally:
        await client.close()
    return results


async def after_open(client: LspClient, idle: float, repeats: int) -> dict:
    """The first completion in a file just opened (with 4 related files) after `idle` seconds."""
    samples = []
    for repeat in range(repeats):
        tag = f"open-{idle}-{repeat}-{time.time()}"
        uris = []
        for name, text in related_sources().items():
            uris.append(f"file:///bench/{tag}/{name}.py")
            client.open(uris[-1], f"# {tag}\n{text}")
        text = f"# {tag}\n" + python_source(12000)
        uris.append(f"file:///bench/{tag}/main.py")
        client.open(uris[-1], text)
        await asyncio.sleep(idle)  # the user reads; a benchmark may wait, tests never do
        line = text[:8000].count("\n")  # a line start about 2k tokens in
        samples.append(await one_request(client, uris[-1], line, 0, tag))
        for uri in uris:
            client.close_document(uri)
    return {
        "idle_s": idle,
        "client_ttft_s": round(statistics.median(t for t, _ in samples), 4),
        "client_ttft_s_all": [round(t, 3) for t, _ in samples],
        "server_ttft_s": round(statistics.median(s["ttft_s"] for _, s in samples), 4),
        "prefill_tokens": int(statistics.median(s["prefill_tokens"] for _, s in samples)),
    }


def summarise(chars: int, rows: dict) -> dict:
    summary = {"chars": chars}
    for kind, samples in rows.items():
        summary[kind] = {
            "client_ttft_s": round(statistics.median(t for t, _ in samples), 4),
            "server_ttft_s": round(statistics.median(s["ttft_s"] for _, s in samples), 4),
            "prefill_tokens": int(statistics.median(s["prefill_tokens"] for _, s in samples)),
        }
    return summary


def print_table(results: dict) -> None:
    print(f"TTFT through the language server, model {results['target']} (medians)")
    print(
        f"{'context':>9} | {'cold: prefill':>13} {'client':>8} {'server':>8} | {'1-char edit: prefill':>20} "
        f"{'client':>8} {'server':>8} | speed-up"
    )
    for row in results["sizes"]:
        cold, edit = row["cold"], row["edit"]
        speedup = cold["client_ttft_s"] / edit["client_ttft_s"] if edit["client_ttft_s"] else float("inf")
        print(
            f"{row['chars']:>8}c | {cold['prefill_tokens']:>13} {cold['client_ttft_s']:>7.3f}s "
            f"{cold['server_ttft_s']:>7.3f}s | {edit['prefill_tokens']:>20} {edit['client_ttft_s']:>7.3f}s "
            f"{edit['server_ttft_s']:>7.3f}s | {speedup:.1f}x"
        )
    print("First completion after opening a ~3k-token file (cursor ~2k tokens in) with 4 related files:")
    for row in results.get("open", []):
        print(
            f"  idle {row['idle_s']:>4.1f}s: client TTFT {row['client_ttft_s']:.3f}s "
            f"(all: {row['client_ttft_s_all']}), server {row['server_ttft_s']:.3f}s, "
            f"prefill {row['prefill_tokens']} tokens"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--chars", type=int, nargs="+", default=[1000, 4000, 12000], help="context sizes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="passed to the server (--threads)")
    parser.add_argument(
        "--idle", type=float, nargs="+", default=[0.0, 5.0], help="seconds between opening a file and asking"
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    results = asyncio.run(bench(args))
    print_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
