"""`spec-complete bench`: engine speed on real source, per draft method, and how exact it stays.

The cases are the repo suite's (cursor points in a standard-library package, other files of the
package open), run by the same CaseRunner. On top of the repo suite it:
- runs plain `none` vs `ngram` again in every mode x dtype (exact / inexact, bf16 / fp32) and
  reports how often ngram's output equals plain decoding's in each;
- reports stock HF `generate()` plain decoding as the fastest plain reference.
Each configuration keeps its rows in its own subfolder (so --resume works per configuration).
"""

from __future__ import annotations

import argparse
import gc
import sysconfig
from pathlib import Path

from completion_engine.defaults import default_draft_model
from completion_engine.options import eagle_tree_problem, engine_config
from eval.options import (
    add_engine_arguments,
    build_engine,
    build_peers,
    close_peers,
    command_line,
    eval_options,
    kv_cache_label,
    linear_products,
    requested_methods,
    run_meta,
    say,
    set_threads,
)

DEFAULT_PACKAGE = "email"  # many related files (parsers, generators, headers) that share idioms
MATRIX = ((True, "bfloat16"), (False, "bfloat16"), (True, "float32"), (False, "float32"))
SPEED_PEERS = ("hf_plain", "hf_prompt_lookup", "hf_fp32_plain")  # stock generate() beside every method


def default_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / DEFAULT_PACKAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        default=None,
        help=f"Python source folder (default: the standard library's {DEFAULT_PACKAGE} package)",
    )
    parser.add_argument("--points", type=int, default=20, help="completion points (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed that picks the points")
    parser.add_argument(
        "--open-files", type=int, default=4, help="other files of the package opened for n-grams"
    )
    parser.add_argument(
        "--no-matrix", action="store_true", help="skip the exact/inexact x bf16/fp32 identical-output runs"
    )
    add_engine_arguments(parser, max_new_tokens=64)


def configuration_name(exact: bool, dtype: str) -> str:
    return f"{'exact' if exact else 'inexact'}-{_dtype_name(dtype)}"


def _dtype_name(dtype: str) -> str:
    from completion_engine.models import dtype_label

    return dtype_label(dtype).removesuffix(" (auto)")


def run(args: argparse.Namespace) -> int:
    from eval.cases import repo_cases
    from eval.runner import plan_methods
    from eval.suite import machine_meta, out_folder

    set_threads(args)
    root = Path(args.root).expanduser() if args.root else default_root()
    if not root.is_dir():
        raise FileNotFoundError(f"--root {root} is not a folder")
    cases = repo_cases(root, args.points, args.seed, args.open_files)
    args.draft_model = args.draft_model or default_draft_model(args.target)  # the shipped draft: hybrid
    problem = eagle_tree_problem(args)
    if problem:
        raise ValueError(problem)
    main_config = engine_config(args)
    methods, skipped = plan_methods(requested_methods(args), main_config.draft_model is not None)
    notes = [f"method {m!r} skipped: {why}" for m, why in skipped.items()]
    for note in notes:
        say(note)
    configurations = [(main_config.exact, _dtype_name(main_config.dtype))]
    if not args.no_matrix:
        configurations += [c for c in MATRIX if c not in configurations]
    folder = out_folder("bench", args.out, args.resume)
    names = ", ".join(configuration_name(*c) for c in configurations)
    say(f"{len(cases)} points in {root}; configurations {names}; results in {folder}")
    summaries = {}
    for index, configuration in enumerate(configurations):
        main = index == 0  # the main configuration runs every method and the HF reference
        run_methods = methods if main else ("none", "ngram")
        summaries[configuration] = run_configuration(
            args, cases, root, folder, configuration, run_methods, notes if main else [], main
        )
    machine = {
        **machine_meta(),
        "products": linear_products(main_config),
        "kv_cache": summaries[configurations[0]]["kv_cache"],
    }
    text = bench_markdown(summaries, configurations[0], len(cases), root, command_line(), machine)
    (folder / "bench.md").write_text(text)
    print(text)
    print(f"results: {folder}/bench.md and one subfolder per configuration")
    main_summary = summaries[configurations[0]]
    return 1 if main_summary["lossless_mismatches"] else 0


def run_configuration(
    args: argparse.Namespace,
    cases: list,
    root: Path,
    folder: Path,
    configuration: tuple[bool, str],
    methods: tuple[str, ...],
    notes: list[str],
    main: bool,
) -> dict:
    """Run the cases in one mode x dtype (in its own subfolder); return the summary."""
    from eval.repo_completion import score_repo
    from eval.report import summarize, write_report
    from eval.runner import CaseRunner
    from eval.suite import prepare_folder, run_cases

    exact, dtype = configuration
    name = configuration_name(exact, dtype)
    # the other configurations run ngram vs none only: no draft model to load
    config = engine_config(
        args, exact=exact, dtype=dtype, **({} if main else {"draft_model": None, "eagle_tree": False})
    )
    with_peers = main and not args.no_peers
    meta = run_meta(args, config, methods, f"bench {name}", root, notes, peers=with_peers)
    prepare_folder(folder / name, meta, args.resume)
    engine = build_engine(config, not args.quiet)
    meta["kv_cache"] = kv_cache_label(engine)  # the report's, not a setting a resume must match
    peers = build_peers(config, not args.quiet, SPEED_PEERS, args.vllm_python) if with_peers else None
    runner = CaseRunner(engine, eval_options(args), methods, score_repo, peers, args.repeats)
    try:
        rows = run_cases(cases, runner, folder / name, args.resume, not args.quiet, desc=name)
    finally:
        close_peers(peers)
    write_report(folder / name, rows, meta, plots=main and not args.no_plots)
    del engine, peers, runner
    summary = summarize(rows)
    summary["kv_cache"] = meta["kv_cache"]  # for bench.md's line on the main configuration
    gc.unfreeze()  # settle_heap froze the loaded engine: let its cycles be collected too
    gc.collect()  # free this configuration's model before the next one loads
    return summary


def bench_markdown(
    summaries: dict[tuple[bool, str], dict],
    main: tuple[bool, str],
    points: int,
    root: Path,
    command: str,
    machine: dict,
) -> str:
    from eval.report import origin_table, prices_table, products_note, sections, speed_table

    s = summaries[main]
    lines = [
        f"# Engine speed: {points} completion points in {root}",
        "",
        f"Command: `{command}`",
        "",
        f"{configuration_name(*main)}{products_note(machine)}; "
        f"{machine['torch_threads']} torch threads on {machine['cpu']}; "
        f"median context {s['median_context_tokens']} tokens.",
        "",
        *speed_table(s),
    ]
    lines += sections(origin_table(s), prices_table(s))
    lines += [
        "",
        "Identical-output rate, `ngram` vs `none`, per mode and dtype:",
        "",
        "| mode | dtype | ngram output == none output | ngram speedup vs none | none tok/s | ngram tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for (exact, dtype), summary in summaries.items():
        none, ngram = summary["methods"].get("none"), summary["methods"].get("ngram")
        if not none or not ngram:
            continue
        lines.append(
            f"| {'exact' if exact else 'inexact'} | {dtype} | {ngram['identical']}/{ngram['cases']} "
            f"({ngram['identical'] / max(ngram['cases'], 1):.0%}) | {_fmt(ngram['speedup'])}x | "
            f"{none['decode_tokens_per_s']:.1f} | {ngram['decode_tokens_per_s']:.1f} |"
        )
    mismatches = s["lossless_mismatches"]
    lines += [""]
    if mismatches:
        lines.append(
            f"**{len(mismatches)} outputs of {configuration_name(*main)} differ from `none`:** "
            + ", ".join(f"{m['case_id']} ({m['method']})" for m in mismatches)
        )
    else:
        lines.append(f"Every output of {configuration_name(*main)} equals `none`'s.")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
