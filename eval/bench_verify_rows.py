"""What one verify forward of n rows costs after a long context (n = 1 .. 16), embedded model, float32.

    python -m eval.bench_verify_rows [--context 2000] [--threads 1] [--repeats 3]

Times the runner's `extend` of n drafted tokens after a prefill of `context` tokens of real Python:
the cost the draft budget prices (one more row, in 1-row steps; printed for 11 rows as the ratio
`--row-cost` means). The row counts alternate within each repeat; each is the best of 4 forwards a
repeat, and the best over the repeats is printed.
"""

from __future__ import annotations

import time

ROWS = (1, 2, 3, 4, 6, 8, 11, 16)


def main(argv: list[str] | None = None) -> int:
    from eval.step_timing import kernel_bench_args

    args = kernel_bench_args(__doc__.splitlines()[0], 3, argv)

    from completion_engine.runner import DecoderRunner
    from eval.step_timing import embedded_float32

    model, tokens = embedded_float32(args.context + max(ROWS), args.threads)
    context, drafted = tokens[: args.context], tokens[args.context :]
    runner = DecoderRunner(model.weights, exact=True, capacity=args.context + 2 * max(ROWS))
    runner.prefill(context)
    best: dict[int, float] = {}
    for _ in range(args.repeats):
        for rows in ROWS:
            for _ in range(4):
                started = time.perf_counter()
                runner.extend(drafted[:rows], all_logits=True)
                best[rows] = min(best.get(rows, float("inf")), time.perf_counter() - started)
                runner.truncate(len(context))
    setting = f"{args.threads} thread(s), best of {args.repeats} x 4"
    print(f"one verify forward after {args.context} tokens, {setting}:")
    print(" ".join(f"{rows} rows {best[rows] * 1e3:.1f} ms;" for rows in ROWS))
    print(f"one more row costs {(best[11] / best[1] - 1) / 10:.3f} of a 1-row step (11 rows against 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
