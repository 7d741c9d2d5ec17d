"""Distil the shipped draft model from the embedded target (`spec-complete train-draft`).

The draft: 2 decoder layers of the target's width, initialised from the target's first layers,
reading the target's frozen token embedding, with an LM head over the most frequent code tokens
(FR-Spec). Labels are the target's own next-token distributions (restricted to that subset):
the draft learns to predict what the target will say, not what the file says.

Data: Python sources of the standard library, without the packages the evaluation uses (email,
json) and the held-out package (http), on which top-1 agreement is measured.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from completion_engine.distilled import DISTILLED_DIR, DraftConfig, save_draft
from completion_engine.runner import DecoderShape, DecoderWeights, LayerWeights, rms_norm, rotate_half

EXCLUDED_PACKAGES = {
    "email",
    "json",
    "http",
    "test",
    "idlelib",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "site-packages",
}
HELD_OUT_PACKAGE = "http"
EAGLE_LR = 2e-3  # the EAGLE head's peak learning rate (train_eagle.EagleSettings)


@dataclass(frozen=True, slots=True)
class TrainSettings:
    steps: int = 1200
    minutes: float = 50.0  # stop (and save) after this much training time
    batch: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    warmup: int = 50
    subset_size: int = 8192
    n_layers: int = 2
    seed: int = 0
    eval_windows: int = 48
    checkpoint_every: int = 25


def python_files(root: Path, include: bool) -> list[Path]:
    """Stdlib .py files outside (include=False: inside) the excluded/held-out packages, sorted."""
    files = []
    for path in sorted(root.rglob("*.py")):
        top = path.relative_to(root).parts[0]
        excluded = top in EXCLUDED_PACKAGES
        if include != excluded:
            files.append(path)
    return files


def token_windows(files: list[Path], tokenizer, seq_len: int, eos: int) -> torch.Tensor:
    """All files tokenised end to end (EOS between files) and cut into [N, seq_len] windows."""
    ids: list[int] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
        ids.append(eos)
    usable = len(ids) // seq_len * seq_len
    return torch.tensor(ids[:usable], dtype=torch.long).view(-1, seq_len)


def frequent_tokens(windows: torch.Tensor, size: int) -> torch.Tensor:
    counts = Counter(windows.flatten().tolist())
    return torch.tensor(sorted(t for t, _ in counts.most_common(size)), dtype=torch.long)


class TrainableDraft(nn.Module):
    """The draft's layers as trainable float32 parameters; the forward mirrors runner.py in fast mode."""

    def __init__(self, target: DecoderWeights, n_layers: int, vocab_map: torch.Tensor) -> None:
        super().__init__()
        self.shape = target.shape
        self.register_buffer("embed", target.embed.float(), persistent=False)
        self.register_buffer("head", target.lm_head[vocab_map].float(), persistent=False)
        self.register_buffer("vocab_map", vocab_map, persistent=False)
        self.layers = nn.ModuleList(
            nn.ParameterDict(
                {n: nn.Parameter(getattr(target.layers[i], n).float().clone()) for n in LAYER_FIELDS}
            )
            for i in range(n_layers)
        )
        self.final_norm = nn.Parameter(target.final_norm.float().clone())
        self.inv_freq = target.inv_freq
        self.rope_scale = target.rope_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> logits over the subset [B, T, subset]."""
        s = self.shape
        x = F.embedding(ids, self.embed)
        cos, sin = rotary_tables(ids.shape[1], self.inv_freq, self.rope_scale)
        for layer in self.layers:
            x = causal_layer(x, layer, s, cos, sin)
        return F.linear(rms_norm(x, self.final_norm, s.rms_eps), self.head)

    def export(self, dtype: torch.dtype) -> DecoderWeights:
        s = self.shape
        layers = tuple(
            LayerWeights(**{n: layer[n].detach().to(dtype) for n in LAYER_FIELDS}, qkv_bias=None)
            for layer in self.layers
        )
        shape = DecoderShape(
            len(layers),
            s.hidden,
            s.n_heads,
            s.n_kv_heads,
            s.head_dim,
            len(self.vocab_map),
            s.rms_eps,
            s.max_positions,
        )
        return DecoderWeights(
            shape,
            self.embed.to(dtype),
            layers,
            self.final_norm.detach().to(dtype),
            self.head.to(dtype),
            self.inv_freq,
            self.rope_scale,
        )


LAYER_FIELDS = ("input_norm", "qkv", "out", "post_norm", "gate_up", "down")


def rotary_tables(
    length: int, inv_freq: torch.Tensor, rope_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, length, 1, head_dim] for positions 0 .. length - 1 (as the runner builds them)."""
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rope_scale)[None, :, None], (emb.sin() * rope_scale)[None, :, None]


def causal_layer(
    x: torch.Tensor, layer: Mapping[str, torch.Tensor], s: DecoderShape, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """One Llama decoder layer over x [B, T, hidden] with causal attention (runner.py's maths, batched).

    layer maps LAYER_FIELDS (and optionally "qkv_bias") to tensors.
    """
    q, k, v = layer_qkv(x, layer, s, cos, sin)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return layer_rest(x, attn, layer, s)


def layer_qkv(
    x: torch.Tensor, layer: Mapping[str, torch.Tensor], s: DecoderShape, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decoder layer's rotated queries [B, heads, T, dim] and keys, values [B, kv_heads, T, dim] over x."""
    batch, length, _ = x.shape
    q_size, kv_size = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    h = rms_norm(x, layer["input_norm"], s.rms_eps)
    q, k, v = F.linear(h, layer["qkv"], layer.get("qkv_bias")).split((q_size, kv_size, kv_size), dim=-1)
    q = q.view(batch, length, s.n_heads, s.head_dim)
    k = k.view(batch, length, s.n_kv_heads, s.head_dim)
    q = (q * cos + rotate_half(q) * sin).to(v.dtype)
    k = (k * cos + rotate_half(k) * sin).to(v.dtype)
    v = v.view(batch, length, s.n_kv_heads, s.head_dim)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def layer_rest(
    x: torch.Tensor, attn: torch.Tensor, layer: Mapping[str, torch.Tensor], s: DecoderShape
) -> torch.Tensor:
    """The rest of the layer after attention: attn [B, heads, T, dim] -> the layer's output [B, T, hidden]."""
    batch, length, _ = x.shape
    x = x + F.linear(attn.transpose(1, 2).reshape(batch, length, s.n_heads * s.head_dim), layer["out"])
    h = rms_norm(x, layer["post_norm"], s.rms_eps)
    gate, up = F.linear(h, layer["gate_up"]).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, layer["down"])


def target_logits(target_model, ids: torch.Tensor) -> torch.Tensor:
    """The target's logits [B, T, vocab] (float32) from the stock transformers forward, no grad."""
    with torch.inference_mode():
        return target_model(ids).logits.float()


def distill_loss(
    draft_logits: torch.Tensor, teacher_logits: torch.Tensor, vocab_map: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy of the draft against the target's distribution restricted to the subset (soft labels)."""
    teacher = torch.softmax(teacher_logits[..., vocab_map], dim=-1)
    return -(teacher * torch.log_softmax(draft_logits, dim=-1)).sum(-1).mean()


def agreement(draft: TrainableDraft, target_model, windows: torch.Tensor, batch: int) -> float:
    """Share of positions where the draft's top token equals the target's top token (full vocabulary)."""
    agree = total = 0
    with torch.no_grad():
        for start in range(0, len(windows), batch):
            ids = windows[start : start + batch]
            teacher_top = target_logits(target_model, ids).argmax(-1)
            draft_top = draft.vocab_map[draft(ids).argmax(-1)]
            agree += int((draft_top == teacher_top).sum())
            total += teacher_top.numel()
    return agree / max(total, 1)


def save_checkpoint(path: Path, name: str, model: nn.Module, optimizer, step: int) -> None:
    """The trained module (under `name`), its optimizer and the step, for --resume."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({name: model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, path)


def resume(path: Path, name: str, model: nn.Module, optimizer) -> int:
    """Load a checkpoint written by save_checkpoint, if there is one; the step to go on from."""
    if not path.exists():
        return 0
    saved = torch.load(path, weights_only=False)
    model.load_state_dict(saved[name])
    optimizer.load_state_dict(saved["optimizer"])
    print(f"resumed at step {saved['step']}", file=sys.stderr)
    return saved["step"]


def learning_rate(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainSettings()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--minutes", type=float, default=defaults.minutes, help="training time budget")
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument(
        "--kind",
        choices=("distilled", "eagle"),
        default="distilled",
        help="distilled: a 2-layer draft model; eagle: a head reading the target's features",
    )
    parser.add_argument(
        "--seq-len", type=int, default=None, help=f"window length (distilled: {defaults.seq_len})"
    )
    parser.add_argument(
        "--train-tokens", type=int, default=300_000, help="eagle: tokens the target reads for training"
    )
    parser.add_argument(
        "--subset-size", type=int, default=defaults.subset_size, help="tokens in the draft head"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--out", default=None, help="where the shipped weights go (default: the package's data)"
    )
    parser.add_argument("--checkpoint", default=None, help="default: eval/out/train-<kind>/checkpoint.pt")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument(
        "--stdlib",
        default=sysconfig.get_paths()["stdlib"],
        help="the standard library: trained on without the evaluation's packages; its http is the test set",
    )
    parser.add_argument(
        "--train-root",
        action="append",
        default=None,
        metavar="DIR",
        help="train on the Python files under DIR instead of the standard library (repeatable); the "
        "held-out set stays the standard library's http",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"peak learning rate (default: distilled {defaults.lr:g}, eagle {EAGLE_LR:g})",
    )
    parser.add_argument(
        "--skip-tokens",
        type=int,
        default=0,
        help="eagle: skip the first this many tokens of the seeded window order (those an earlier run with "
        "the same --seed and --seq-len read)",
    )
    parser.add_argument(
        "--init-head",
        default=None,
        help="eagle: start from this exported head (folder), keeping its token subset",
    )
    parser.add_argument(
        "--feature-layers",
        default=None,
        help="eagle: the target's earlier layers the head reads beside the last (EAGLE-3), e.g. 1,14; "
        "default: those of --init-head, else none. A head continued with more layers starts with "
        "zero weights on the new ones (it drafts as before until it learns to use them)",
    )
    parser.add_argument(
        "--unroll",
        type=int,
        default=None,
        help="eagle: draft depths trained, the later ones from the head's own guesses as when drafting "
        "(a training-time test; default 3)",
    )


def training_files(args: argparse.Namespace) -> list[Path]:
    """The .py files to train on: every one under the --train-root folders (once each, never one of
    the standard library's excluded packages: the evaluation's and the held-out one), else the
    standard library's outside those packages."""
    stdlib = Path(args.stdlib)
    if not args.train_root:
        return python_files(stdlib, include=True)
    excluded = [(stdlib / name).resolve() for name in EXCLUDED_PACKAGES]
    files: dict[Path, None] = {}
    for root in map(Path, args.train_root):
        if not root.is_dir():
            raise SystemExit(f"--train-root {root} is not a folder")
        for path in sorted(root.rglob("*.py")):
            resolved = path.resolve()
            if not any(resolved.is_relative_to(folder) for folder in excluded):
                files.setdefault(resolved)
    if not files:
        raise SystemExit(f"no Python files to train on under --train-root {' '.join(args.train_root)}")
    return list(files)


def run_train(args: argparse.Namespace) -> int:
    if args.kind == "eagle":
        from eval.train_eagle import run_train_eagle

        return run_train_eagle(args)
    return run_train_distilled(args)


def run_train_distilled(args: argparse.Namespace) -> int:
    if args.init_head or args.skip_tokens or args.feature_layers or args.unroll is not None:
        raise SystemExit("--init-head, --skip-tokens, --feature-layers and --unroll are for --kind eagle")
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from completion_engine.models import load_model, resolve_source

    settings = TrainSettings(
        steps=args.steps,
        minutes=args.minutes,
        batch=args.batch,
        seq_len=args.seq_len or TrainSettings.seq_len,
        subset_size=args.subset_size,
        seed=args.seed,
        lr=TrainSettings().lr if args.lr is None else args.lr,
    )
    torch.manual_seed(settings.seed)
    # the target in the dtype it serves in here (models.resolve_dtype)
    target = load_model("smollm2-135m", device="cpu", dtype="auto", progress=True)
    target_model = AutoModelForCausalLM.from_pretrained(
        resolve_source("smollm2-135m", True), dtype=target.weights.embed.dtype
    )
    target_model.eval()
    eos = next(iter(target.eos_token_ids))
    root = Path(args.stdlib)
    print(f"tokenising {' '.join(args.train_root or [str(root)])} ...", file=sys.stderr, flush=True)
    train = token_windows(training_files(args), target.tokenizer, settings.seq_len, eos)
    held_out = token_windows(
        sorted((root / HELD_OUT_PACKAGE).rglob("*.py")), target.tokenizer, settings.seq_len, eos
    )
    held_out = held_out[: settings.eval_windows]
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(settings.seed))
    vocab_map = frequent_tokens(train, settings.subset_size)
    print(
        f"{len(train)} training windows ({train.numel():,} tokens), {len(held_out)} held out; "
        f"head covers {len(vocab_map)} tokens",
        file=sys.stderr,
        flush=True,
    )
    draft = TrainableDraft(target.weights, 2, vocab_map)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=settings.lr, weight_decay=0.0)
    step = 0
    checkpoint = Path(args.checkpoint or "eval/out/train-draft/checkpoint.pt")
    if args.resume:
        step = resume(checkpoint, "draft", draft, optimizer)
    before = agreement(draft, target_model, held_out, settings.batch)
    print(f"held-out top-1 agreement before training: {before:.3f}", file=sys.stderr, flush=True)
    started = time.monotonic()
    bar = tqdm(total=settings.steps, initial=step, desc="train-draft", file=sys.stderr)
    while step < settings.steps and (time.monotonic() - started) / 60 < settings.minutes:
        picks = order[(step * settings.batch) % len(order) :][: settings.batch]
        ids = train[picks]
        teacher = target_logits(target_model, ids)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, settings)
        loss = distill_loss(draft(ids), teacher, vocab_map)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % settings.checkpoint_every == 0:
            save_checkpoint(checkpoint, "draft", draft, optimizer, step)
    bar.close()
    after = agreement(draft, target_model, held_out, settings.batch)
    config = DraftConfig(
        n_layers=2,
        intermediate=draft.layers[0]["down"].shape[1],
        subset_size=len(vocab_map),
        target="smollm2-135m",
    )
    out = Path(args.out or DISTILLED_DIR)
    save_draft(out, draft.export(torch.bfloat16), vocab_map, config)
    print(
        f"steps {step}; held-out top-1 agreement {before:.3f} -> {after:.3f}; saved to {out}",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_train_arguments(parser)
    return run_train(parser.parse_args(argv))


if __name__ == "__main__":
    random.seed(0)
    sys.exit(main())
