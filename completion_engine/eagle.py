"""The EAGLE draft head that ships for the embedded target: save, load, and whether it is installed.

What ships is the head's own parameters (the input projection, the feature norm, one decoder layer)
and the token subset its LM head covers; the embedding, the final norm and the LM head rows are the
target's, borrowed at load time. See drafting/eagle.py for what the head computes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from completion_engine.defaults import EAGLE_CONFIG, EAGLE_DIR, EAGLE_NAME, EAGLE_WEIGHTS, is_eagle_head
from completion_engine.drafting.eagle import EagleWeights
from completion_engine.runner import DecoderWeights, LayerWeights, feature_layers_fit

__all__ = [
    "EAGLE_DIR",
    "EAGLE_NAME",
    "EagleConfig",
    "eagle_available",
    "is_eagle_head",
    "load_eagle",
    "save_eagle",
]
LAYER_FIELDS = ("input_norm", "qkv", "out", "post_norm", "gate_up", "down")


@dataclass(frozen=True, slots=True)
class EagleConfig:
    subset_size: int  # tokens the head's LM head covers
    target: str  # the target it was trained for
    hidden: int  # the target's width, checked at load
    # the length of its training windows: how far back it attends (EagleHead.view_start)
    window: int | None = None
    feature_layers: tuple[int, ...] = ()  # the target's earlier layers it reads beside the last (EAGLE-3)

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(self.feature_layers))  # a JSON list


def save_eagle(folder: Path, weights: EagleWeights, config: EagleConfig) -> None:
    """The head's own parameters in bf16: half the file (drafting rounds them to bf16 on the CPU kernel
    anyway, see drafting/eagle.head_linear); the shipped head's held-out agreement measured the same
    rounded as in float32 (39.3%)."""
    from safetensors.torch import save_file

    state = {"fc": weights.fc, "feature_norm": weights.feature_norm}
    for name in LAYER_FIELDS:
        state[f"layer.{name}"] = getattr(weights.layer, name)
    state = {k: v.detach().to(torch.bfloat16) for k, v in state.items()}
    state["vocab_map"] = weights.vocab_map
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in state.items()}, str(folder / EAGLE_WEIGHTS))
    (folder / EAGLE_CONFIG).write_text(json.dumps(asdict(config), indent=2) + "\n")


def eagle_available(folder: Path | None = None) -> bool:
    folder = folder or EAGLE_DIR
    return (folder / EAGLE_WEIGHTS).exists() and (folder / EAGLE_CONFIG).exists()


def eagle_weights(
    target: DecoderWeights,
    state: dict[str, torch.Tensor],
    vocab_map: torch.Tensor,
    window: int | None = None,
    feature_layers: tuple[int, ...] = (),
) -> EagleWeights:
    """Head parameters (any dtype) next to the target's borrowed parts, on the target's device and dtype."""
    device, dtype = target.embed.device, target.embed.dtype

    def get(name: str) -> torch.Tensor:
        return state[name].to(device=device, dtype=dtype)

    layer = LayerWeights(**{name: get(f"layer.{name}") for name in LAYER_FIELDS}, qkv_bias=None)
    vocab_map = vocab_map.to(device)
    return EagleWeights(
        shape=target.shape,
        fc=get("fc"),
        feature_norm=get("feature_norm"),
        layer=layer,
        embed=target.embed,
        final_norm=target.final_norm,
        head=target.lm_head[vocab_map],
        vocab_map=vocab_map,
        inv_freq=target.inv_freq,
        rope_scale=target.rope_scale,
        window=window,
        feature_layers=tuple(feature_layers),
    )


def load_eagle(target: DecoderWeights, spec: str | Path | None = None) -> EagleWeights:
    """The head named by spec (EAGLE_NAME or a folder) for `target`; a clear error when it cannot be used."""
    from safetensors.torch import load_file

    from completion_engine.models import ModelLoadError

    folder = EAGLE_DIR if spec in (None, EAGLE_NAME) else Path(spec)
    if not eagle_available(folder):
        raise ModelLoadError(
            f"the EAGLE draft head is not installed (expected {folder}); train it with "
            "`spec-complete train-draft --kind eagle`"
        )
    config = EagleConfig(**json.loads((folder / EAGLE_CONFIG).read_text()))
    if config.hidden != target.shape.hidden:
        raise ModelLoadError(
            f"the EAGLE head in {folder} was trained for {config.target} (width {config.hidden}), "
            f"not for a target of width {target.shape.hidden}"
        )
    if config.window is not None and config.window < 1:
        raise ModelLoadError(f"the EAGLE head in {folder} has a window of {config.window} slots (at least 1)")
    layers = config.feature_layers
    if not feature_layers_fit(layers, target.shape.n_layers):
        raise ModelLoadError(
            f"the EAGLE head in {folder} reads layers {list(layers)}; a target of {target.shape.n_layers} "
            f"layers has earlier layers 0 .. {target.shape.n_layers - 2} (distinct, ascending)"
        )
    state = load_file(str(folder / EAGLE_WEIGHTS))
    width = (2 + len(layers)) * target.shape.hidden
    if tuple(state["fc"].shape) != (target.shape.hidden, width):
        raise ModelLoadError(
            f"the EAGLE head in {folder}: its input projection is {tuple(state['fc'].shape)}, not "
            f"{(target.shape.hidden, width)} for feature layers {list(layers)}"
        )
    return eagle_weights(target, state, state["vocab_map"], config.window, layers)
