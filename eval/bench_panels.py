"""bf16 against float32 weight panels on the row-invariant kernel: the same bits, fewer bytes.

    python -m eval.bench_panels [--context 2000] [--threads 1] [--repeats 7]

The embedded model's weights are bf16 values, so row_invariant.pack keeps them in bf16 panels. This
packs the same weights both ways, prefills the same context of real Python in each runner, then
alternates the two within each repeat: a decode step (mean of 5) and a verify block of 11 tokens;
and a whole prefill in the first and the last repeat. It checks that both give the same logits,
bit for bit, after the prefill and for the verify block.
"""

from __future__ import annotations

import functools


def main(argv: list[str] | None = None) -> int:
    from eval.step_timing import kernel_bench_args

    args = kernel_bench_args(__doc__.splitlines()[0], 7, argv)

    import torch

    from completion_engine import row_invariant
    from completion_engine.runner import DecoderRunner, decoder_linears
    from eval.step_timing import embedded_float32, print_times, time_repeat

    model, context = embedded_float32(args.context, args.threads)
    runners = {}
    original = row_invariant.pack
    for name, bf16 in (("bf16 panels", None), ("float32 panels", False)):
        model.weights.packed.clear()  # pack afresh, the chosen way
        row_invariant.pack = functools.partial(original, bf16=bf16)
        try:
            decoder_linears(model.weights, True)
        finally:
            row_invariant.pack = original
        runners[name] = DecoderRunner(model.weights, exact=True, capacity=args.context + 64)
        model.weights.packed.clear()
    kinds = {runner.linears[0].qkv.panels.dtype for runner in runners.values()}
    print(f"context {args.context} tokens, {args.threads} thread(s); panel dtypes {sorted(map(str, kinds))}")

    times: dict[str, list[float]] = {}
    prefilled: dict[str, torch.Tensor] = {}
    for repeat in range(args.repeats):
        for name, runner in runners.items():
            logits = time_repeat(runner, context, name, times, prefill=repeat in (0, args.repeats - 1))
            if logits is not None:
                prefilled[name] = logits
    print_times(times)
    logits = []
    for runner in runners.values():
        runner.truncate(len(context))
        logits.append(runner.extend(context[:11], all_logits=True))
    same = torch.equal(*logits) and torch.equal(*prefilled.values())
    print("same logits bit for bit (prefill, verify 11):", same)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
