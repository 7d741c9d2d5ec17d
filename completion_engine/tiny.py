"""A tiny random Llama with a small byte-level BPE tokenizer, built offline in about a second.

It writes gibberish, deterministically: good for tests and demos of the machinery (servers,
editors, evals) where the real model would be slow. Built once into the cache as "tiny-random".
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
from pathlib import Path

from completion_engine.embedded import CONVERTED_MARKER, cache_root

TINY_VOCAB = 512


def training_text() -> list[str]:
    """Source code that is always on the machine: a few standard-library modules."""
    import argparse
    import dataclasses
    import json.decoder
    import textwrap

    return [inspect.getsource(m) for m in (argparse, dataclasses, json.decoder, textwrap)]


def build_tokenizer(vocab_size: int = TINY_VOCAB, extra_special: tuple[str, ...] = ()):
    """extra_special: more special tokens, e.g. a model family's FIM tokens (for tests)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(training_text(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|endoftext|>",
        additional_special_tokens=list(extra_special) or None,
    )


def build_model(vocab_size: int, seed: int = 0, layers: int = 2, hidden: int = 64):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        bos_token_id=1,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def save_tiny(folder: Path, seed: int = 0, layers: int = 2, hidden: int = 64) -> Path:
    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), seed, layers, hidden)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / CONVERTED_MARKER).write_text("tiny-random\n")
    return folder


def ensure_tiny() -> Path:
    folder = cache_root() / "models" / "tiny-random"
    if (folder / CONVERTED_MARKER).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="tiny-random.", dir=folder.parent))
    save_tiny(staging)
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    return folder
