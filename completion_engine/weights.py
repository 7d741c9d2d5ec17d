"""Take a Hugging Face Llama-family causal LM apart into the tensors the runner multiplies."""

from __future__ import annotations

import torch

from completion_engine.runner import DecoderShape, DecoderWeights, LayerWeights

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


class UnsupportedArchitecture(ValueError):
    pass


def check_supported(config) -> None:
    model_type = getattr(config, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitecture(
            f"model type {model_type!r} is not supported by the exact runner; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (Llama-family decoders such as SmolLM2, "
            "CodeLlama, DeepSeek-Coder, Qwen2.5-Coder, Mistral)"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedArchitecture(f"activation {config.hidden_act!r} is not supported (only silu)")


def decoder_shape(config) -> DecoderShape:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return DecoderShape(
        n_layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        n_heads=config.num_attention_heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        vocab=config.vocab_size,
        rms_eps=config.rms_norm_eps,
        max_positions=getattr(config, "max_position_embeddings", 0) or 0,
    )


def decoder_weights_from_hf(model, dtype: torch.dtype, device: torch.device) -> DecoderWeights:
    """Fuse q/k/v and gate/up per layer and copy everything to `dtype` on `device`."""
    config = model.config
    check_supported(config)
    shape = decoder_shape(config)
    state = model.state_dict()

    def get(name: str) -> torch.Tensor:
        return state[name].to(device=device, dtype=dtype).contiguous()

    layers = []
    for i in range(shape.n_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        bias_names = [p + f"self_attn.{n}_proj.bias" for n in "qkv"]
        qkv_bias = torch.cat([get(b) for b in bias_names]) if all(b in state for b in bias_names) else None
        layers.append(
            LayerWeights(
                input_norm=get(p + "input_layernorm.weight"),
                qkv=qkv,
                qkv_bias=qkv_bias,
                out=get(p + "self_attn.o_proj.weight"),
                post_norm=get(p + "post_attention_layernorm.weight"),
                gate_up=torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]),
                down=get(p + "mlp.down_proj.weight"),
            )
        )
    embed = get("model.embed_tokens.weight")
    lm_head = get("lm_head.weight") if "lm_head.weight" in state else embed
    rotary = model.model.rotary_emb
    return DecoderWeights(
        shape=shape,
        embed=embed,
        layers=tuple(layers),
        final_norm=get("model.norm.weight"),
        lm_head=lm_head,
        inv_freq=rotary.inv_freq.detach().float().clone(),
        rope_scale=float(getattr(rotary, "attention_scaling", 1.0)),
    )
