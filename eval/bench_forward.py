"""The exact forward's costs beside stock transformers: prefill, one decode step, a verify block.

    python -m eval.bench_forward [--context 2000] [--threads 1] [--repeats 15]

On a context of real Python (tokens of the standard library, the embedded model), it times:
- prefill of the whole context: ours (128-row blocks, then 16-row forwards) against one HF forward;
- one decode step after it: ours (the smallest row bucket the runner admits: one row on the
  row-invariant kernel, else a probed bucket of up to 16 rows) against HF's 1-row step with its KV
  cache;
- a verify block of 11 tokens (1 pending + 10 drafted): ours, one forward (11 rows on the kernel);
- a verify block of 4 tokens (the size the draft budget picks most often for the EAGLE head);
- the same 11 tokens as a token tree of 1, 2, 3 and 5 root-to-leaf chains (runner.verify_tree):
  what each extra branch of a tree costs.
Where the bf16 dot mode is on (row_invariant.py: a CPU with AVX512-BF16, by default), ours runs under
each of the row-invariant kernel's numerics the CPU has, each with its own runner and cache: float32
inputs, bf16 dot (vdpbf16ps) and, with AMX-BF16, amx; SPEC_COMPLETE_ROW_KERNEL=float32 or =avx2 keeps
float32 inputs only.
Methods alternate within each repeat; the best and the median of the repeats are printed.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time

# 11-node trees (root = the pending token) with 1, 2, 3 and 5 root-to-leaf chains
TREES = {
    1: [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    2: [-1, 0, 1, 2, 3, 4, 5, 0, 7, 8, 9],
    3: [-1, 0, 1, 2, 3, 4, 5, 0, 7, 1, 9],
    5: [-1, 0, 0, 0, 1, 2, 3, 1, 5, 4, 9],
}


def python_tokens(tokenizer, count: int) -> list[int]:
    import argparse as argparse_module
    import json.decoder
    import textwrap

    text = "".join(inspect.getsource(m) for m in (argparse_module, textwrap, json.decoder))
    tokens = tokenizer.encode(text, add_special_tokens=False)
    if len(tokens) < count + 16:
        raise SystemExit(f"only {len(tokens)} tokens of source; ask for a shorter --context")
    return tokens[: count + 16]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=2000, help="context tokens (default 2000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 (both sides use it)")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from completion_engine.models import load_model, resolve_source
    from completion_engine.runner import DecoderRunner

    torch.set_num_threads(args.threads)
    model = load_model("smollm2-135m", dtype=args.dtype, progress=False)
    dtype = model.weights.embed.dtype
    hf = AutoModelForCausalLM.from_pretrained(resolve_source("smollm2-135m", False), dtype=dtype)
    hf.eval()
    ids = python_tokens(model.tokenizer, args.context)
    context, n = ids[: args.context], args.context
    from completion_engine import row_invariant

    modes: dict[str, str | None] = {"": None}  # name suffix -> numerics (None: the process's own)
    if row_invariant.usable(dtype, torch.device("cpu")) and row_invariant.bf16_dot():
        # every numerics this CPU has (SPEC_COMPLETE_ROW_KERNEL=float32: one)
        modes = {}
        for name in row_invariant.NUMERICS:
            with row_invariant.numerics_mode(name) as got:
                if got == name:
                    modes[f" ({name})"] = name

    runners = {}
    for suffix, name in modes.items():
        with row_invariant.numerics_mode(name):
            runners[suffix] = DecoderRunner(model.weights, exact=True, capacity=n + 64)
    times: dict[str, list[float]] = {}

    def timed(name: str, fn, numerics: str | None = None) -> None:
        with row_invariant.numerics_mode(numerics):
            started = time.perf_counter()
            fn()
            times.setdefault(name, []).append(time.perf_counter() - started)

    with torch.inference_mode():
        for _ in range(max(args.repeats // 5, 1)):  # prefills are slow: fewer repeats
            for suffix, runner in runners.items():
                timed(
                    "prefill: ours" + suffix,
                    lambda r=runner: (r.truncate(0), r.prefill(context)),
                    modes[suffix],
                )
            timed("prefill: HF", lambda: hf(torch.tensor([context]), use_cache=True))
        cache = hf(torch.tensor([context]), use_cache=True).past_key_values
        for suffix, runner in runners.items():
            with row_invariant.numerics_mode(modes[suffix]):
                runner.truncate(0)
                runner.prefill(context)
        for _ in range(args.repeats):
            timed(
                "decode step: HF",
                lambda: (hf(torch.tensor([[ids[n]]]), past_key_values=cache, use_cache=True), cache.crop(-1)),
            )
            for suffix, runner in runners.items():
                numerics = modes[suffix]
                timed(
                    "decode step: ours" + suffix,
                    lambda r=runner: (r.extend([ids[n]], all_logits=True), r.truncate(n)),
                    numerics,
                )
                for rows in (4, 11):
                    timed(
                        f"verify {rows}: ours" + suffix,
                        lambda r=runner, rows=rows: (
                            r.extend(ids[n : n + rows], all_logits=True),
                            r.truncate(n),
                        ),
                        numerics,
                    )
                for leaves, parents in TREES.items():
                    timed(
                        f"tree 11, {leaves} leaves" + suffix,
                        lambda r=runner, p=parents: r.verify_tree(ids[n : n + 11], p),
                        numerics,
                    )
    print(f"context {n} tokens, {dtype}, {args.threads} thread(s), {torch.get_num_threads()} in torch")
    for name, samples in times.items():
        best, median = min(samples), statistics.median(samples)
        extra = f"  ({n / best:.0f} tokens/s)" if name.startswith("prefill") else ""
        print(f"{name:20s} best {best * 1e3:8.1f} ms  median {median * 1e3:8.1f} ms{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
