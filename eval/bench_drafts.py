"""The shipped drafts side by side, in one process: the distilled draft model and the EAGLE head.

    python -m eval.bench_drafts --package email --points 6 --repeats 2 --threads 2

`spec-complete bench` loads one draft per run, and on a shared host only speeds measured in the same
run compare. Here one engine per draft loads the embedded target, and each runs the repo suite's
cases through the same CaseRunner as `bench` (open documents, repeats, the comparison with `none`):
`none`, `ngram`, the draft alone (`model`) and `hybrid`, the engines taking turns case by case.
Per engine and method: decode tok/s (each case's fastest repeat), speedup over that engine's `none`,
tokens per verify step, the drafts' acceptance, the time spent drafting in the loop (a verify step's,
and a drafted token's, also as a share of a plain decode step; a head's catch-up with a new context
counts too, where the fastest repeat had one), and how many outputs equal `none`'s.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from completion_engine.defaults import DEFAULT_TARGET, DISTILLED_NAME, EAGLE_NAME, is_eagle_head

METHODS = ("none", "ngram", "model", "hybrid")


def summary_rows(name: str, rows: list[dict]) -> list[str]:
    """Markdown table rows of one engine's case rows (CaseRunner.run's)."""
    lines = []
    base = None
    plain_step: float | None = None
    for method in METHODS:
        runs = [row["methods"][method] for row in rows]
        decode_s = max(sum(run["decode_s"] for run in runs), 1e-9)
        speed = sum(run["tokens"] for run in runs) / decode_s
        base = base or speed
        stats = [run["stats"] for run in runs]
        steps = sum(sum(s["accepted_hist"].values()) for s in stats)
        if method == "none":
            plain_step = decode_s / steps if steps else None  # one 1-row forward a step
        drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
        per_step = (accepted + steps) / steps if steps else 1.0
        share = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "–"
        draft_s = sum(s.get("draft_s", 0.0) for s in stats)
        drafting = f"{draft_s / steps * 1e3:.2f}" if steps else "–"
        if drafted and plain_step:  # what a drafted token cost in the loop, against a plain decode step
            per_token = draft_s / drafted
            drafting += f" / {per_token * 1e3:.2f} ({per_token / plain_step:.2f})"
        same = sum(run["identical"] for run in runs)
        lines.append(
            f"| {name} | {method} | {speed:.1f} | {speed / base:.2f}x | {per_step:.2f} | {share} "
            f"| {drafting} | {same}/{len(runs)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="email", help="a standard-library package: the cases' files")
    parser.add_argument("--points", type=int, default=6, help="completion points")
    parser.add_argument("--repeats", type=int, default=2, help="runs per method; the fastest counts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--drafts",
        default=f"{DISTILLED_NAME},{EAGLE_NAME}",
        help="drafts to compare, comma-separated; an EAGLE head drafts EAGLE-2 trees (the default), its "
        f"name with +chain chains (e.g. {EAGLE_NAME},{EAGLE_NAME}+chain)",
    )
    args = parser.parse_args(argv)
    drafts = {draft: draft.partition("+")[::2] for draft in args.drafts.split(",")}  # name -> (model, shape)
    for draft, (model, shape) in drafts.items():
        if shape not in ("", "tree", "chain") or (shape and not is_eagle_head(model)):
            parser.error(f"--drafts: {draft}: only an EAGLE head takes a suffix, +tree or +chain")

    from tqdm import tqdm

    from completion_engine.config import EngineConfig
    from completion_engine.engine import CompletionEngine
    from eval.cases import repo_cases
    from eval.options import eval_options, set_threads
    from eval.repo_completion import score_repo
    from eval.runner import CaseRunner

    set_threads(args)
    root = Path(importlib.import_module(args.package).__file__).parent
    cases = repo_cases(root, args.points, 0, 4)
    options = eval_options(args)  # as `bench`'s
    runners = {}
    for draft, (model, shape) in drafts.items():
        config = EngineConfig(
            target=DEFAULT_TARGET,
            max_context=args.max_context,
            draft_model=model,
            eagle_tree={"": None, "tree": True, "chain": False}[shape],
        )
        engine = CompletionEngine.from_config(config, progress=False)
        cost = engine.budget.draft_cost
        print(f"{draft}: a draft token costs {cost:.3f} of a target step", file=sys.stderr)
        runners[draft] = CaseRunner(engine, options, METHODS, score_repo, repeats=args.repeats)
    rows: dict[str, list[dict]] = {draft: [] for draft in runners}
    order = list(runners)
    for index, case in enumerate(tqdm(cases, desc="bench-drafts", file=sys.stderr)):
        for draft in order if index % 2 == 0 else order[::-1]:
            rows[draft].append(runners[draft].run(case))
    print(f"{len(cases)} points in {args.package}, {args.max_new_tokens} new tokens, best of {args.repeats}")
    columns = ("draft", "method", "decode tok/s", "speedup vs none", "tokens per verify step")
    columns = (*columns, "drafts accepted", "drafting ms a step / a token (of a plain step)", "same as none")
    print("\n| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for draft, draft_rows in rows.items():
        print("\n".join(summary_rows(draft, draft_rows)))
    lossless = all(row["lossless"]["identical"] for draft_rows in rows.values() for row in draft_rows)
    return 0 if lossless else 1


if __name__ == "__main__":
    raise SystemExit(main())
