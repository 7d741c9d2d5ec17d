"""Engine options on the command line, shared by `complete`, `serve`, `eval` and `bench`; no torch import."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from completion_engine.config import DEFAULT_TARGET, EngineConfig
from completion_engine.defaults import EAGLE_NAME, default_draft_method, default_draft_model, is_eagle_head


def add_engine_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    defaults = EngineConfig()
    parser.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"target model: {DEFAULT_TARGET} (embedded), tiny-random, a folder, a .gguf file or a hub id",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="draft model (same forms) for --draft model|hybrid; the embedded target gets its shipped one",
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto (bf16 on a GPU; on a CPU float32 on the row-invariant kernel, ~3x the weights' memory, "
        "or bf16 where the kernel is off and the CPU has AMX) "
        "| bfloat16 | float16 | float32",
    )
    parser.add_argument(
        "--inexact",
        action="store_true",
        help="faster unpadded forward; output may differ from plain decoding",
    )
    parser.add_argument(
        "--max-draft", type=int, default=defaults.max_draft, help="tokens drafted per verify step (<= 15)"
    )
    parser.add_argument(
        "--row-cost",
        type=float,
        default=None,
        help="cost of one more verify row in 1-row steps, which sizes drafts, the same at every context "
        "length and for every row (default: timed when the model loads after a short and a long context, "
        "priced at each step's length, with the steps a forward's cost climbs in as rows are added, "
        "then corrected by what the decode steps take; 0 never cuts n-gram drafts)",
    )
    parser.add_argument(
        "--draft-cost",
        type=float,
        default=None,
        help="cost of one draft-model token in 1-row target steps, which sizes model drafts together "
        "with --row-cost (default: timed when the model loads, then corrected by what drafting takes)",
    )
    parser.add_argument(
        "--eagle-tree",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an EAGLE draft head (--draft-model smollm2-135m-eagle) drafts a tree of its most probable "
        "tokens (EAGLE-2) instead of a chain, for exact greedy requests (default: wherever the draft "
        "model is an EAGLE head and the verifier exact; --no-eagle-tree drafts chains)",
    )
    parser.add_argument(
        "--max-context",
        type=int,
        default=defaults.max_context,
        help="context tokens kept (the oldest are cut)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: the faster of 1 and all cores, timed when the model loads)",
    )


def engine_config(args: argparse.Namespace, **overrides) -> EngineConfig:
    config = EngineConfig(
        target=args.target,
        draft_model=args.draft_model,
        device=args.device,
        dtype=args.dtype,
        exact=not args.inexact,
        max_draft=args.max_draft,
        row_cost=args.row_cost,
        draft_cost=args.draft_cost,
        max_context=args.max_context,
        eagle_tree=args.eagle_tree,
    )
    return replace(config, **overrides)


def apply_threads_argument(args: argparse.Namespace) -> None:
    """--threads reaches torch through the environment, so call this before torch is imported."""
    if args.threads:
        os.environ["SPEC_COMPLETE_THREADS"] = str(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)


def eagle_tree_problem(args: argparse.Namespace) -> str | None:
    """Why --eagle-tree cannot apply to this command line (call after resolve_draft_defaults), or None."""
    if not args.eagle_tree:  # None (trees where they apply) or False (chains)
        return None
    if not is_eagle_head(args.draft_model or ""):
        return f"--eagle-tree needs an EAGLE draft head (--draft-model {EAGLE_NAME} or a head's folder)"
    if args.inexact:
        return "--eagle-tree needs the exact verifier (drop --inexact)"
    return None


def resolve_draft_defaults(args: argparse.Namespace) -> None:
    """Fill in --draft-model and --draft when not given (the shipped draft for the embedded target)."""
    args.draft_model = args.draft_model or default_draft_model(args.target)
    args.draft = args.draft or default_draft_method(args.draft_model)


def completion_options(args: argparse.Namespace):
    """The completion options given on a command line (`complete`'s, or `serve`'s defaults).

    `serve` has no --top-p or --seed (a client's seed comes per request): those keep their defaults.
    """
    from completion_engine.completion import CompletionOptions

    defaults = CompletionOptions()
    return CompletionOptions(
        draft=args.draft,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=getattr(args, "top_p", defaults.top_p),
        seed=getattr(args, "seed", defaults.seed),
        syntax=not args.no_syntax,
        healing=not args.no_healing,
        fim=args.fim,
        cross_file_tokens=args.cross_file_tokens,
    )
