"""Load target and draft models: the embedded default, a local folder, a .gguf file or a hub id."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from completion_engine import row_invariant
from completion_engine.embedded import EMBEDDED_NAME, converted_gguf_folder, ensure_embedded
from completion_engine.row_invariant import cpu_flags
from completion_engine.runner import DecoderWeights
from completion_engine.weights import UnsupportedArchitecture, check_supported, decoder_weights_from_hf

TINY_NAME = "tiny-random"  # a 2-layer random model with a small BPE tokenizer, for tests and demos
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class ModelLoadError(Exception):
    """A model could not be loaded; the message says what to do instead."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    name: str
    weights: DecoderWeights
    tokenizer: object  # a transformers PreTrainedTokenizerBase
    eos_token_ids: frozenset[int]
    vocab_map: torch.Tensor | None = None  # [head rows] -> token id, when the LM head covers a subset

    @property
    def vocab_size(self) -> int:
        return self.weights.shape.vocab


def apply_thread_setting() -> None:
    """SPEC_COMPLETE_THREADS caps torch's CPU threads (1 avoids OpenMP spin-waits on shared cores)."""
    threads = os.environ.get("SPEC_COMPLETE_THREADS")
    if threads:
        torch.set_num_threads(int(threads))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device | None = None) -> torch.dtype:
    """auto: bf16 on a GPU; float32 on a CPU where the row-invariant kernel runs (x86 with AVX2 and
    FMA, SPEC_COMPLETE_ROW_KERNEL not 0), which keeps bf16 checkpoints in bf16 panels; else bf16 on a
    CPU with AMX, float32 elsewhere.

    Measured with SmolLM2-135M, 2k context, two threads (`python -m eval.bench_forward --dtype ...`):
    on an Intel Xeon with AMX, float32 on the kernel (bf16 dot mode, before its AMX tiles) against
    bf16 in torch (oneDNN, AMX; the runner's padded row buckets), one run each: a decode step 18.2
    against 47.3 ms, a verify block of 11 tokens 42.7 against 67.9 ms, a prefill 581 against 194
    tokens/s; with the kernel's AMX tiles since, 18.6 ms, 29.0 ms and 1,367 tokens/s (README,
    session 20). On an AVX2-only CPU (AMD EPYC), one thread, a bf16 matmul is emulated: an exact
    decode step took 786 ms in bf16 at a 3k context, 108 ms in float32 at 2k. On AVX512-BF16 without
    AMX (AMD EPYC, Zen 4), two threads: a decode step 13.1 against 51.4 ms, a verify block of 11
    tokens 39.8 against 93.9 ms, a prefill 640 against 600 tokens/s. Memory is float32's cost: the
    float32 weights plus their bf16 panels, about 3x the bf16 weights (the KV cache of a bf16
    checkpoint is bf16 on the kernel: row_invariant.cache_dtype); for a large target on a small
    machine pass --dtype bfloat16.
    """
    if dtype == "auto":
        if device is None or device.type != "cpu":
            return torch.bfloat16
        if cpu_has_bf16_tiles() and not row_invariant.usable(torch.float32, device):
            return torch.bfloat16  # torch's AMX kernels beat its float32 ones
        return torch.float32
    try:
        return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose auto, bfloat16, float16 or float32") from None


def dtype_name(dtype: torch.dtype) -> str:
    """ "float32" for torch.float32: the name --dtype, vLLM and file names use."""
    return str(dtype).removeprefix("torch.")


def dtype_label(dtype: str, device: str = "auto") -> str:
    """The dtype a setting resolves to here, by name: "float32 (auto)", "bfloat16"."""
    name = dtype_name(resolve_dtype(dtype, resolve_device(device)))
    return f"{name} (auto)" if dtype == "auto" else name


def cpu_has_bf16_tiles() -> bool:
    """Whether this CPU has bf16 matrix tiles (x86 AMX-BF16): auto keeps bf16 there if the kernel is off."""
    return "amx_bf16" in cpu_flags()


def load_model(spec: str, device: str = "auto", dtype: str = "auto", progress: bool = True) -> LoadedModel:
    """spec: "smollm2-135m", "tiny-random", a model folder, a .gguf file, or a Hugging Face hub id."""
    apply_thread_setting()
    if not progress:
        quiet_transformers()
    folder = resolve_source(spec, progress)
    target_device = resolve_device(device)
    return load_folder(spec, folder, target_device, resolve_dtype(dtype, target_device))


def resolve_source(spec: str, progress: bool) -> Path | str:
    """A local folder to load from, or the hub id itself."""
    if spec == EMBEDDED_NAME:
        return ensure_embedded(progress)
    if spec == TINY_NAME:
        from completion_engine.tiny import ensure_tiny

        return ensure_tiny()
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return converted_gguf_folder(path, progress)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(
                f"{path} is a folder but has no config.json: not a Hugging Face model folder"
            )
        return path
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file")
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return spec
    raise ModelLoadError(
        f"model not found: {spec!r} is not {EMBEDDED_NAME!r}, an existing folder, "
        "a .gguf file or a hub id (org/name)"
    )


def load_folder(name: str, source: Path | str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    is_hub = isinstance(source, str)
    try:
        config = AutoConfig.from_pretrained(source)
        check_causal_lm(name, config)
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (ModelLoadError, UnsupportedArchitecture):
        raise
    except Exception as error:  # noqa: BLE001 - hub clients raise their own network errors; all mean "cannot load"
        if is_hub:
            raise ModelLoadError(
                f"could not load {name!r} from the Hugging Face hub "
                f"({type(error).__name__}: {first_line(error)}). "
                "If this machine is offline, pass a local model folder or .gguf file instead, e.g. "
                "--target /models/my-coder or --target model.Q4_K_M.gguf"
            ) from error
        raise ModelLoadError(f"could not load model from {source}: {first_line(error)}") from error
    weights = decoder_weights_from_hf(model, dtype, device)
    del model
    return LoadedModel(
        name=name, weights=weights, tokenizer=tokenizer, eos_token_ids=eos_ids(config, tokenizer, source)
    )


def quiet_transformers() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def check_causal_lm(name: str, config) -> None:
    architectures = getattr(config, "architectures", None) or []
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ModelLoadError(
            f"{name!r} is not a causal language model (architectures: {', '.join(architectures) or 'none'})"
        )
    check_supported(config)


def eos_ids(config, tokenizer, source: Path | str) -> frozenset[int]:
    ids: set[int] = set()
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    try:
        from transformers import GenerationConfig

        generation = GenerationConfig.from_pretrained(source)
        value = generation.eos_token_id
        ids.update([value] if isinstance(value, int) else list(value or []))
    except OSError:
        pass
    return frozenset(ids)


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft and target must share a vocabulary: the target verifies the draft's token ids."""
    target_vocab, draft_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        raise ModelLoadError(
            f"draft model {draft.name!r} does not share the target's tokenizer: target {target.name!r} has "
            f"{len(target_vocab)} tokens (embedding {target.vocab_size}), draft has {len(draft_vocab)} "
            f"(embedding {draft.vocab_size})"
        )


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
