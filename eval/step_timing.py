"""Timings shared by the kernel benchmarks (bench_panels, bench_glue): one repeat on one runner."""

from __future__ import annotations

import argparse
import statistics
import time


def kernel_bench_args(description: str, repeats: int, argv: list[str] | None) -> argparse.Namespace:
    """The options every kernel benchmark takes: --context, --threads, --repeats."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--context", type=int, default=2000, help="context tokens (default 2000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=repeats)
    return parser.parse_args(argv)


def embedded_float32(context_len: int, threads: int):
    """The embedded model in float32 on `threads` torch threads, and `context_len` tokens of real
    Python; exits where the row-invariant kernel cannot run."""
    import torch

    torch.set_num_threads(threads)

    from completion_engine import row_invariant
    from completion_engine.models import load_model
    from eval.bench_forward import python_tokens

    model = load_model("smollm2-135m", dtype="float32", progress=False)
    if not row_invariant.usable(torch.float32, torch.device("cpu")):
        raise SystemExit("the row-invariant kernel is not available on this machine")
    return model, python_tokens(model.tokenizer, context_len)[:context_len]


def time_repeat(runner, context: list[int], label: str, times: dict[str, list[float]], prefill: bool):
    """Time on `runner` (a DecoderRunner): a whole prefill of `context` when `prefill`, then after the
    context a decode step (mean of 5) and a verify block of 11 tokens; add them to times[kind, label].

    Returns the prefill's logits (None without a prefill); the runner's cache is left at the context.
    """
    logits = None
    if prefill:
        runner.truncate(0)
        started = time.perf_counter()
        logits, _ = runner.prefill(context)
        times.setdefault(f"prefill, {label}", []).append(time.perf_counter() - started)
    runner.truncate(len(context))
    started = time.perf_counter()
    for token in context[:5]:
        runner.extend([token])
    times.setdefault(f"decode step, {label}", []).append((time.perf_counter() - started) / 5)
    runner.truncate(len(context))
    started = time.perf_counter()
    runner.extend(context[:11], all_logits=True)
    times.setdefault(f"verify 11, {label}", []).append(time.perf_counter() - started)
    runner.truncate(len(context))
    return logits


def print_times(times: dict[str, list[float]]) -> None:
    width = max(map(len, times)) + 2
    for label, values in times.items():
        best, median = min(values) * 1e3, statistics.median(values) * 1e3
        print(f"{label:{width}} best {best:9.1f} ms  median {median:9.1f} ms")
