"""The row-invariant kernel's weight panels: bf16 in AMX tile order, bf16, float32.

    python -m eval.bench_panels [--context 2000] [--threads 1] [--repeats 7]

The embedded model's weights are bf16 values, so row_invariant.pack keeps them in bf16 panels, laid
out in AMX tile order where the numerics are "amx" (not re-laid at every product). This packs the
same weights each way (AMX order only where the numerics are "amx"), prefills the same context of
real Python in each runner, then alternates them within each repeat: a decode step (mean of 5) and a
verify block of 11 tokens; and a whole prefill in the first and the last repeat. It checks which
give the same logits, bit for bit, after the prefill and for the verify block: every layout in the
float32 numerics; in the bf16 dot and amx numerics the bf16 layouts with each other (float32 panels
keep the float32 chains there, other bits).
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
    layouts = {"bf16 panels": {"bf16": None, "amx_order": False}, "float32 panels": {"bf16": False}}
    if row_invariant.numerics() == "amx":
        layouts = {"bf16 panels, AMX order": {"bf16": None, "amx_order": True}, **layouts}
    runners = {}
    original = row_invariant.pack
    for name, choice in layouts.items():
        model.weights.packed.clear()  # pack afresh, the chosen way
        row_invariant.pack = functools.partial(_packed_as, original, choice)
        try:
            decoder_linears(model.weights, True)
        finally:
            row_invariant.pack = original
        runners[name] = DecoderRunner(model.weights, exact=True, capacity=args.context + 64)
        model.weights.packed.clear()
    kinds = {
        f"{runner.linears[0].qkv.panels.dtype} {tuple(runner.linears[0].qkv.panels.shape)}"
        for runner in runners.values()
    }
    print(f"context {args.context} tokens, {args.threads} thread(s); qkv panels {sorted(kinds)}")

    times: dict[str, list[float]] = {}
    prefilled: dict[str, torch.Tensor] = {}
    for repeat in range(args.repeats):
        for name, runner in runners.items():
            logits = time_repeat(runner, context, name, times, prefill=repeat in (0, args.repeats - 1))
            if logits is not None:
                prefilled[name] = logits
    print_times(times)
    verified = {}
    for name, runner in runners.items():
        runner.truncate(len(context))
        verified[name] = runner.extend(context[:11], all_logits=True)
    first = next(iter(runners))
    for name in list(runners)[1:]:
        same = torch.equal(verified[first], verified[name]) and torch.equal(prefilled[first], prefilled[name])
        print(f"{name}: the logits of {first} bit for bit (prefill, verify 11): {same}")
    return 0


def _packed_as(original, choice: dict, weight, bias=None, bf16=None, amx_order=False):
    """row_invariant.pack with the layout `choice` in place of the caller's."""
    return original(weight, bias, **{"bf16": bf16, "amx_order": amx_order, **choice})


if __name__ == "__main__":
    raise SystemExit(main())
