"""The distilled draft model that ships with the project for the embedded target.

It is a 2-layer decoder of the target's width that borrows the target's (frozen) token embedding,
so only its layers ship. Its LM head covers the most frequent code tokens only (FR-Spec): a
draft step then costs a fraction of the full 49,152-token head, and the target still verifies
over the full vocabulary. Logits come back over that subset; `vocab_map` turns a subset index
into a token id.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from completion_engine.defaults import DISTILLED_DIR, DISTILLED_NAME
from completion_engine.defaults import DISTILLED_WEIGHTS as WEIGHTS_FILE
from completion_engine.runner import DecoderShape, DecoderWeights, LayerWeights

__all__ = ["DISTILLED_DIR", "DISTILLED_NAME", "WEIGHTS_FILE"]
CONFIG_FILE = "draft.json"


@dataclass(frozen=True, slots=True)
class DraftConfig:
    n_layers: int
    intermediate: int
    subset_size: int  # tokens the draft head covers
    target: str  # the target it was distilled from


def layer_names(i: int) -> dict[str, str]:
    p = f"layers.{i}."
    return {n: p + n for n in ("input_norm", "qkv", "out", "post_norm", "gate_up", "down")}


def draft_state(weights: DecoderWeights, vocab_map: torch.Tensor) -> dict[str, torch.Tensor]:
    """What ships: the layers, the final norm and the subset's token ids (not the shared embedding)."""
    state = {"final_norm": weights.final_norm, "vocab_map": vocab_map.to(torch.int64)}
    for i, layer in enumerate(weights.layers):
        for field, name in layer_names(i).items():
            state[name] = getattr(layer, field)
    return {k: v.detach().contiguous().cpu() for k, v in state.items()}


def save_draft(folder: Path, weights: DecoderWeights, vocab_map: torch.Tensor, config: DraftConfig) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(draft_state(weights, vocab_map), str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2) + "\n")


def distilled_available(folder: Path | None = None) -> bool:
    folder = folder or DISTILLED_DIR
    return (folder / WEIGHTS_FILE).exists() and (folder / CONFIG_FILE).exists()


def load_draft(target: DecoderWeights, folder: Path | None = None) -> tuple[DecoderWeights, torch.Tensor]:
    """The draft's weights on the target's device and dtype, and its vocab_map [subset] -> token id."""
    from safetensors.torch import load_file

    folder = folder or DISTILLED_DIR
    config = DraftConfig(**json.loads((folder / CONFIG_FILE).read_text()))
    state = load_file(str(folder / WEIGHTS_FILE))
    device, dtype = target.embed.device, target.embed.dtype

    def get(name: str) -> torch.Tensor:
        return state[name].to(device=device, dtype=dtype)

    layers = tuple(
        LayerWeights(
            input_norm=get(names["input_norm"]),
            qkv=get(names["qkv"]),
            qkv_bias=None,
            out=get(names["out"]),
            post_norm=get(names["post_norm"]),
            gate_up=get(names["gate_up"]),
            down=get(names["down"]),
        )
        for names in (layer_names(i) for i in range(config.n_layers))
    )
    vocab_map = state["vocab_map"].to(device)
    s = target.shape
    shape = DecoderShape(
        config.n_layers,
        s.hidden,
        s.n_heads,
        s.n_kv_heads,
        s.head_dim,
        len(vocab_map),
        s.rms_eps,
        s.max_positions,
    )
    weights = DecoderWeights(
        shape=shape,
        embed=target.embed,  # shared with the target: every token id can be read
        layers=layers,
        final_norm=get("final_norm"),
        lm_head=target.lm_head[vocab_map],  # only the subset can be proposed
        inv_freq=target.inv_freq,
        rope_scale=target.rope_scale,
    )
    return weights, vocab_map


def distilled_draft(target):
    """The shipped draft as a LoadedModel beside `target` (a LoadedModel of the embedded model)."""
    from completion_engine.models import LoadedModel, ModelLoadError

    if not distilled_available():
        raise ModelLoadError(
            f"the distilled draft is not installed (expected {DISTILLED_DIR}); train it with "
            "`spec-complete train-draft`"
        )
    weights, vocab_map = load_draft(target.weights)
    return LoadedModel(DISTILLED_NAME, weights, target.tokenizer, target.eos_token_ids, vocab_map=vocab_map)
