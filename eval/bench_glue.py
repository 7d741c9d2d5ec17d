"""The layer's small steps as kernel calls against the same steps as torch ops, in one process.

    python -m eval.bench_glue [--context 2000] [--threads 1] [--repeats 5]

On the row-invariant kernel's path the runner normalises, applies the rotary embedding and the SiLU
gate with row_invariant.rms_norm / rotary / silu_mul (three calls a layer). This swaps in the torch
ops the other paths use (some 25 a layer; their bits differ, so only speed is compared) and
alternates the two within each repeat: a decode step (mean of 5) and a verify block of 11 tokens
after a context of real Python; and a whole prefill in the first and the last repeat.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from eval.step_timing import kernel_bench_args

    args = kernel_bench_args(__doc__.splitlines()[0], 5, argv)

    import torch.nn.functional as F

    from completion_engine import row_invariant
    from completion_engine.runner import DecoderRunner, rms_norm, rotate_half
    from eval.step_timing import embedded_float32, print_times, time_repeat

    def torch_rotary(qkv, heads, kv_heads, cos, sin):
        rows, d = qkv.shape[0], cos.shape[1]
        q = qkv[:, : heads * d].view(rows, heads, d)
        k = qkv[:, heads * d : (heads + kv_heads) * d].view(rows, kv_heads, d)
        return q * cos[:, None] + rotate_half(q) * sin[:, None], k * cos[:, None] + rotate_half(k) * sin[
            :, None
        ]

    def torch_silu_mul(gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    steps = {
        "kernel calls": (row_invariant.rms_norm, row_invariant.rotary, row_invariant.silu_mul),
        "torch ops": (rms_norm, torch_rotary, torch_silu_mul),
    }
    model, context = embedded_float32(args.context, args.threads)
    runner = DecoderRunner(model.weights, exact=True, capacity=args.context + 64)
    print(f"context {args.context} tokens, {args.threads} thread(s)")
    times: dict[str, list[float]] = {}
    try:
        for repeat in range(args.repeats):
            for name, (norm, rotary, silu_mul) in steps.items():
                row_invariant.rms_norm, row_invariant.rotary, row_invariant.silu_mul = norm, rotary, silu_mul
                time_repeat(runner, context, name, times, prefill=repeat in (0, args.repeats - 1))
    finally:
        row_invariant.rms_norm, row_invariant.rotary, row_invariant.silu_mul = steps["kernel calls"]
    print_times(times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
