"""Shared fixtures: tiny random Llama models built in-process with fixed seeds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from completion_engine import row_invariant
from completion_engine.models import LoadedModel
from completion_engine.tiny import build_model, build_tokenizer
from completion_engine.weights import decoder_weights_from_hf

# Tiny models: one thread avoids OpenMP spin-waits when cores are shared; servers started by tests inherit it.
os.environ.setdefault("SPEC_COMPLETE_THREADS", "1")
torch.set_num_threads(1)


NUMERICS_FLAGS = {"float32": None, "bf16dot": "avx512_bf16", "amx": "amx_bf16"}  # the CPU flag each needs


@contextmanager
def numerics_or_skip(name: str | None) -> Iterator[str]:
    """row_invariant.numerics_mode(name), skipping the test where the CPU lacks what it needs; where the
    CPU has it but the kernel did not take it (Linux refused AMX's tile state, say), the test fails."""
    with row_invariant.numerics_mode(name) as got:
        if name is not None and got != name:
            flag = NUMERICS_FLAGS[name]
            if flag is not None and flag not in row_invariant.cpu_flags():
                pytest.skip(f"the CPU has no {flag}: no {name} numerics")
            kernel = row_invariant.kernel()
            why = kernel.amx_unavailable() if kernel is not None and name == "amx" else ""
            pytest.fail(f"the CPU has what {name} needs, but the kernel runs {got} {why}".rstrip())
        yield got


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tokenizer()


def tiny_loaded(
    tokenizer,
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
    layers: int = 2,
    hidden: int = 64,
    spread: float = 0.3,
    noise: float = 0.0,
    bf16_valued: bool = False,
) -> LoadedModel:
    """A random model whose greedy output varies (weights drawn wider than the default 0.02).

    noise > 0 perturbs every weight: a draft that agrees with the seed's model most of the time.
    bf16_valued rounds every weight to a bf16 value (a bf16 checkpoint loaded in float32).
    """
    model = build_model(len(tokenizer), seed=seed, layers=layers, hidden=hidden)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.copy_(torch.randn(param.shape, generator=generator) * spread)
        if noise:
            perturb = torch.Generator().manual_seed(seed + 1000)
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=perturb) * noise)
        if bf16_valued:
            for param in model.parameters():
                param.copy_(param.bfloat16().float())
    weights = decoder_weights_from_hf(model, dtype, torch.device("cpu"))
    # no end-of-sequence token: every run goes to max_new_tokens (test_eos_inside_a_draft sets its own)
    return LoadedModel(f"tiny-{seed}", weights, tokenizer, frozenset())


@pytest.fixture(scope="session")
def tiny_target(tiny_tokenizer) -> LoadedModel:
    return tiny_loaded(tiny_tokenizer, seed=1)


@pytest.fixture(scope="session")
def tiny_draft(tiny_tokenizer) -> LoadedModel:
    """A different random model: its drafts are mostly rejected."""
    return tiny_loaded(tiny_tokenizer, seed=2, layers=1)


@pytest.fixture(scope="session")
def tiny_near_draft(tiny_tokenizer) -> LoadedModel:
    """The target with noise added: its drafts are accepted often but not always."""
    return tiny_loaded(tiny_tokenizer, seed=1, noise=0.03)


@pytest.fixture(scope="session")
def tiny_target_fp32(tiny_tokenizer) -> LoadedModel:
    return tiny_loaded(tiny_tokenizer, seed=1, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_target_fp32_bf16_valued(tiny_tokenizer) -> LoadedModel:
    """float32 weights that are all bf16 values: the row-invariant kernel packs them in bf16 panels."""
    return tiny_loaded(tiny_tokenizer, seed=1, dtype=torch.float32, bf16_valued=True)


@pytest.fixture(scope="session")
def tiny_near_draft_fp32(tiny_tokenizer) -> LoadedModel:
    return tiny_loaded(tiny_tokenizer, seed=1, noise=0.03, dtype=torch.float32)
