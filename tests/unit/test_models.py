"""Model loading: folders, the tiny model, and clear errors for what cannot be loaded."""

from __future__ import annotations

import json

import pytest
import torch

from completion_engine import models
from completion_engine.models import LoadedModel, ModelLoadError, check_compatible, load_model
from completion_engine.tiny import build_tokenizer, save_tiny


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny"))


def test_loads_a_local_folder(tiny_folder):
    model = load_model(str(tiny_folder), device="cpu", progress=False)
    assert model.vocab_size == len(model.tokenizer) and model.weights.shape.n_layers == 2


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="model not found"):
        load_model(str(tmp_path / "nope"), progress=False)
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(str(tmp_path / "model.gguf"), progress=False)


def test_folder_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path), progress=False)


def test_not_a_causal_lm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_model(str(tmp_path), progress=False)


def test_unreachable_hub_says_how_to_pass_a_local_path(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="pass a local model folder or .gguf file"):
        load_model("no-such-org/no-such-model", progress=False)


def test_draft_with_another_tokenizer_is_refused(tiny_folder, tiny_target):
    other = build_tokenizer(vocab_size=400)
    draft = LoadedModel("other", tiny_target.weights, other, frozenset())
    target = load_model(str(tiny_folder), device="cpu", progress=False)
    with pytest.raises(ModelLoadError, match=r"does not share the target's tokenizer.*512 tokens.*400"):
        check_compatible(target, draft)


@pytest.mark.parametrize(("flags", "kernel_runs", "device", "expected"), [
    # AMX: the float32 kernel (AMX tiles) decodes ~2.5x faster than torch's bf16 (oneDNN, AMX)
    ({"amx_bf16", "avx512_bf16", "avx2", "fma"}, True, "cpu", torch.float32),
    ({"amx_bf16", "avx512_bf16", "avx2", "fma"}, False, "cpu", torch.bfloat16),  # torch's kernels: AMX's bf16
    # AVX512-BF16 without AMX (Zen 4): the float32 kernel decodes ~4x faster than torch's bf16
    ({"avx512_bf16", "avx2", "fma"}, True, "cpu", torch.float32),
    ({"avx2", "fma"}, True, "cpu", torch.float32),  # AVX2 only: bf16 matmuls are emulated, float32 ~8x faster
    ({"avx2", "fma"}, True, "cuda", torch.bfloat16),
])  # fmt: skip
def test_auto_dtype_follows_the_hardware(monkeypatch, flags, kernel_runs, device, expected):
    monkeypatch.setattr(models, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(models.row_invariant, "usable", lambda dtype, device: kernel_runs)
    assert models.resolve_dtype("auto", torch.device(device)) == expected
    assert models.resolve_dtype("float32", torch.device(device)) == torch.float32  # an explicit choice stands


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="choose auto, bfloat16, float16 or float32"):
        models.resolve_dtype("int4")
