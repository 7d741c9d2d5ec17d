"""The shipped drafts side by side, in one process: the distilled draft model and the EAGLE head.

    python -m eval.bench_drafts --package email --points 6 --repeats 2 --threads 2

`spec-complete bench` loads one draft per run, and on a shared host only speeds measured in the same
run compare. Here two engines load the embedded target, one with each draft; every case runs `none`,
`ngram`, and each draft alone (`model`) and in `hybrid`, the methods interleaved case by case (their
order reversed every other case). Per method: decode tok/s (each case's best repeat), speedup over
`none`, tokens per verify step, the drafts' acceptance, and how many outputs equal `none`'s.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from completion_engine.defaults import DEFAULT_TARGET, DISTILLED_NAME, EAGLE_NAME


@dataclass(frozen=True, slots=True)
class Run:
    """One case's best repeat of one method."""

    decode_s: float
    tokens: int
    steps: int  # verify steps
    drafted: int
    accepted: int
    text: str


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="email", help="a standard-library package: the cases' files")
    parser.add_argument("--points", type=int, default=6, help="completion points")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--drafts", default=f"{DISTILLED_NAME},{EAGLE_NAME}", help="drafts to compare, comma-separated"
    )
    args = parser.parse_args(argv)

    from tqdm import tqdm

    from completion_engine.completion import CompletionOptions, complete
    from completion_engine.config import EngineConfig
    from completion_engine.engine import CompletionEngine
    from eval.cases import repo_cases
    from eval.options import set_threads
    from eval.runner import case_cursor

    set_threads(args)
    root = Path(importlib.import_module(args.package).__file__).parent
    cases = repo_cases(root, args.points, 0, 4)
    engines = {}
    for draft in args.drafts.split(","):
        config = EngineConfig(target=DEFAULT_TARGET, max_context=args.max_context, draft_model=draft)
        engines[draft] = CompletionEngine.from_config(config, progress=False)
        print(
            f"{draft}: a draft token costs {engines[draft].budget.draft_cost:.3f} of a target step",
            file=sys.stderr,
        )
    first = next(iter(engines.values()))
    methods = [("none", first, "none"), ("ngram", first, "ngram")]
    for draft, engine in engines.items():
        methods += [(f"model ({draft})", engine, "model"), (f"hybrid ({draft})", engine, "hybrid")]
    best: dict[tuple[str, int], Run] = {}
    with tqdm(total=args.repeats * len(cases) * len(methods), desc="bench-drafts", file=sys.stderr) as bar:
        for repeat in range(args.repeats):
            for index, case in enumerate(cases):
                cursor = case_cursor(case)
                for name, engine, method in methods if (repeat + index) % 2 == 0 else methods[::-1]:
                    for doc, text in case.open_documents.items():
                        engine.set_document(doc, text)
                    engine.forget_outputs()  # each method drafts from the same documents
                    options = CompletionOptions(draft=method, max_new_tokens=args.max_new_tokens)
                    result = complete(engine, cursor, options)
                    s = result.stats
                    run = Run(
                        s.decode_s,
                        s.tokens,
                        sum(s.accepted_hist.values()),
                        s.drafted,
                        s.accepted,
                        result.text,
                    )
                    if (name, index) not in best or run.decode_s < best[(name, index)].decode_s:
                        best[(name, index)] = run
                    bar.update(1)
    print(
        f"{len(cases)} points in {args.package}, {args.max_new_tokens} new tokens, best of {args.repeats}\n"
    )
    columns = ("method", "decode tok/s", "speedup vs none", "tokens per verify step", "drafts accepted")
    print("| " + " | ".join((*columns, "same as none")) + " |")
    print("|---" * (len(columns) + 1) + "|")
    base = 0.0
    for name, _, _ in methods:
        runs = [best[(name, index)] for index in range(len(cases))]
        speed = sum(r.tokens for r in runs) / max(sum(r.decode_s for r in runs), 1e-9)
        base = base or speed
        steps = sum(r.steps for r in runs)
        drafted, accepted = sum(r.drafted for r in runs), sum(r.accepted for r in runs)
        per_step = (accepted + steps) / steps if steps else 1.0
        share = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "–"
        same = sum(best[(name, i)].text == best[("none", i)].text for i in range(len(cases)))
        print(
            f"| {name} | {speed:.1f} | {speed / base:.2f}x | {per_step:.2f} | {share} | {same}/{len(cases)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
