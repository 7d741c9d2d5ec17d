"""Train the EAGLE draft head for the embedded target (`spec-complete train-draft --kind eagle`).

Self-distillation: the target reads standard-library code (not the packages the evaluation uses,
see train_draft.EXCLUDED_PACKAGES) once; its last-layer features f_t and its own greedy choices
are stored (eval/out/train-eagle/, reused by --resume). The head then learns, for every position t,

    g_t = head(f_t, x_{t+1})  ~  f_{t+1}           (smooth L1 on RMS-normalised features)
    lm_head(final_norm(g_t))  ->  the target's choice for x_{t+2}   (cross-entropy, on the subset)
                              and its distribution there         (cross-entropy with its top 8 tokens)

and the same again from its own guesses (a training-time test, as EAGLE-3): at drafting time every
token after the first is predicted from the head's guess of the feature, and the head's cache then
holds the target's features up to where the chain left them and its own guesses after. Pass j
(`--unroll` passes) reads pass j-1's guess g_{t-1} in place of f_t and attends as the j-th draft
token of a chain would: to the first pass's keys up to t-j+1, then to each later pass's key on the
chain (ttt_mask). With `--feature-layers` the
head also reads those earlier layers' outputs at t (EAGLE-3's fused features; zero after a guess).
Held-out top-1 agreement (the head's first draft token equals the target's greedy token) is
measured on the `http` package.

More text for a trained head: `--init-head <its folder>` starts from its parameters (and keeps its
token subset), `--skip-tokens N` reads the windows after the first N tokens of the same seeded
order, so that the target pass covers text the earlier runs did not read.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from completion_engine import row_invariant
from completion_engine.defaults import EAGLE_CONFIG, EAGLE_WEIGHTS
from completion_engine.drafting.eagle import EagleWeights
from completion_engine.eagle import EAGLE_DIR, EagleConfig, eagle_weights, save_eagle
from completion_engine.models import dtype_name
from completion_engine.runner import DecoderRunner, DecoderWeights, feature_layers_fit, rms_norm
from eval.train_draft import (
    EAGLE_LR,
    HELD_OUT_PACKAGE,
    LAYER_FIELDS,
    causal_layer,
    frequent_tokens,
    layer_qkv,
    layer_rest,
    resume,
    rotary_tables,
    save_checkpoint,
    token_windows,
    training_files,
)

WORK_DIR = Path("eval/out/train-eagle")
IGNORE = -100  # labels outside the head's subset
TOP = 8  # the target's most probable next tokens kept per position (the soft labels)


@dataclass(frozen=True, slots=True)
class EagleSettings:
    train_tokens: int = 300_000  # target features stored for training (the target pass is the slow part)
    seq_len: int = 512
    batch: int = 8
    epochs_max: int = 40
    minutes: float = 40.0  # training time budget (after the target pass)
    lr: float = EAGLE_LR
    warmup: int = 50
    subset_size: int = 8192
    feature_weight: float = 1.0  # the smooth-L1 feature loss beside the cross-entropy
    soft_weight: float = 1.0  # the cross-entropy with the target's top tokens, beside the one with its choice
    noise: float = 0.05  # uniform noise on the normalised input features (robustness to the head's guesses)
    unroll: int = 3  # draft depths trained: the first from the target's features, the rest from guesses
    eval_windows: int = 48
    eval_every: int = 100  # steps between held-out measurements (a few seconds each)
    seed: int = 0


@dataclass(slots=True)
class TargetPass:
    """What the target computed over a set of windows."""

    ids: torch.Tensor  # [N, T] tokens
    features: torch.Tensor  # [N, T, width] target dtype: last-layer outputs before the final norm, then
    # those of the feature layers (runner.features' rows)
    choices: torch.Tensor  # [N, T] the target's greedy next token after each position
    top_ids: torch.Tensor  # [N, T, TOP] int32: the target's most probable next tokens, best first
    top_logprobs: torch.Tensor  # [N, T, TOP] float32: their log-probabilities (over the whole vocabulary)


PASS_FIELDS = ("ids", "features", "choices", "top_ids", "top_logprobs")  # TargetPass's, in order


@torch.inference_mode()
def target_pass(
    target: DecoderWeights, ids: torch.Tensor, desc: str, feature_layers: tuple[int, ...] = ()
) -> TargetPass:
    """The target's features and greedy choices over windows ids [N, T].

    Each window is prefilled by the runner that serves the target (an exact one, keeping features), so
    the features are the bits the head reads when drafting; the LM head over them runs in torch.
    """
    from tqdm import tqdm

    s = target.shape
    runner = DecoderRunner(
        target, exact=True, capacity=ids.shape[1], keep_features=True, feature_layers=feature_layers
    )
    features, choices, top_ids, top_logprobs = [], [], [], []
    for window in tqdm(ids, desc=desc, file=sys.stderr, unit="window"):
        runner.truncate(0)
        runner.prefill(window.tolist())
        x = runner.features[: len(window)].clone()
        features.append(x)
        logits = F.linear(rms_norm(x[:, : s.hidden], target.final_norm, s.rms_eps), target.lm_head).float()
        choices.append(logits.argmax(-1))
        top = logits.topk(TOP, dim=-1)
        top_ids.append(top.indices.int())
        top_logprobs.append(top.values - torch.logsumexp(logits, -1, keepdim=True))
    return TargetPass(ids, *(torch.stack(parts) for parts in (features, choices, top_ids, top_logprobs)))


class TrainableHead(nn.Module):
    """The head's parameters in float32; forward mirrors drafting/eagle.EagleHead over whole windows."""

    def __init__(
        self, target: DecoderWeights, vocab_map: torch.Tensor, feature_layers: tuple[int, ...] = ()
    ) -> None:
        super().__init__()
        s = target.shape
        self.shape = s
        self.feature_layers = feature_layers
        blocks = 1 + len(feature_layers)
        self.register_buffer("embed", target.embed.float(), persistent=False)
        self.register_buffer("final_norm", target.final_norm.float(), persistent=False)
        self.register_buffer("head", target.lm_head[vocab_map].float(), persistent=False)
        self.register_buffer("vocab_map", vocab_map, persistent=False)
        self.inv_freq, self.rope_scale = target.inv_freq, target.rope_scale
        # the input projection starts as "the normalised feature, plus a little of the token"
        # (the earlier layers' columns start at zero)
        fc = torch.zeros(s.hidden, (1 + blocks) * s.hidden)
        fc[:, s.hidden : 2 * s.hidden] = torch.eye(s.hidden)
        fc[:, : s.hidden] = torch.randn(s.hidden, s.hidden) * (0.02 / math.sqrt(s.hidden))
        self.fc = nn.Parameter(fc)
        self.feature_norm = nn.Parameter(torch.ones(blocks * s.hidden))
        last = target.layers[-1]  # the layer starts as the target's last one
        self.layer = nn.ParameterDict(
            {n: nn.Parameter(getattr(last, n).float().clone()) for n in LAYER_FIELDS}
        )

    @torch.no_grad()
    def start_from(self, state: dict[str, torch.Tensor]) -> None:
        """Take an exported head's parameters (eagle.save_eagle's names) as the starting point.

        A head that read fewer feature layers (a prefix of this one's blocks) fills the leading
        columns; the new layers' columns stay zero, so the head drafts as before at the start.
        """
        fc, norm = state["fc"].float(), state["feature_norm"].float()
        self.fc[:, : fc.shape[1]] = fc
        self.fc[:, fc.shape[1] :] = 0
        self.feature_norm[: norm.shape[0]] = norm
        for name, parameter in self.layer.items():
            parameter.copy_(state[f"layer.{name}"].float())

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """features [B, T, width] (f_t, or a guess: zero past hidden), next_ids [B, T] (x_{t+1}).

        Returns g [B, T, hidden].
        """
        cos, sin = rotary_tables(next_ids.shape[1], self.inv_freq, self.rope_scale)
        return causal_layer(self.layer_input(features, next_ids), self.layer, self.shape, cos, sin)

    def layer_input(self, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """The layer's input [B, T, hidden]: fc over the token's embedding and the normalised features."""
        s = self.shape
        blocks = features.view(*features.shape[:2], -1, s.hidden)
        normed = rms_norm(blocks, self.feature_norm.view(-1, s.hidden), s.rms_eps).flatten(2)
        return F.linear(torch.cat([F.embedding(next_ids, self.embed), normed], -1), self.fc)

    def unrolled(self, features: torch.Tensor, next_ids: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """g [B, T, hidden] of draft depths 1 .. depth at every position t (a training-time test).

        Depth 1 is forward(); depth j reads depth j-1's guess at t-1 in place of f_t and attends
        through ttt_mask, as the j-th token of a chain drafted after position t-j+1 does. Its rows
        t < j-1 have no such chain (they read f_t) and are not meant to be used.
        """
        s, width, length = self.shape, features.shape[-1], next_ids.shape[1]
        cos, sin = rotary_tables(length, self.inv_freq, self.rope_scale)
        keys, values, guesses = [], [], []
        inputs = features
        for j in range(1, depth + 1):
            x = self.layer_input(inputs, next_ids)
            q, k, v = layer_qkv(x, self.layer, s, cos, sin)
            keys.append(k)
            values.append(v)
            if j == 1:
                attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                attn = F.scaled_dot_product_attention(
                    q,
                    torch.cat(keys, dim=2),
                    torch.cat(values, dim=2),
                    attn_mask=ttt_mask(length, j),
                    enable_gqa=True,
                )
            guesses.append(layer_rest(x, attn, self.layer, s))
            if j < depth:
                inputs = torch.cat([features[:, :1], as_guess(guesses[-1][:, :-1], width)], dim=1)
        return guesses

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(predicted, self.final_norm, self.shape.rms_eps), self.head)

    def export(self, target: DecoderWeights) -> EagleWeights:
        state = {"fc": self.fc, "feature_norm": self.feature_norm}
        state.update({f"layer.{n}": p for n, p in self.layer.items()})
        return eagle_weights(
            target,
            {k: v.detach() for k, v in state.items()},
            self.vocab_map,
            feature_layers=self.feature_layers,
        )


def load_head_state(folder: Path, hidden: int) -> tuple[dict[str, torch.Tensor], tuple[int, ...]]:
    """An exported head's tensors (its parameters and token subset) and feature layers: what
    --init-head continues from."""
    import json

    from safetensors.torch import load_file

    from completion_engine.eagle import eagle_available

    if not eagle_available(folder):
        raise SystemExit(f"--init-head: no EAGLE head in {folder}")
    config = EagleConfig(**json.loads((folder / EAGLE_CONFIG).read_text()))
    if config.hidden != hidden:
        raise SystemExit(f"--init-head: the head in {folder} is for width {config.hidden}, not {hidden}")
    return load_file(str(folder / EAGLE_WEIGHTS)), config.feature_layers


def ttt_mask(length: int, depth: int) -> torch.Tensor:
    """Which keys the depth-th draft token at each position sees when drafting: bool [T, depth * T].

    The keys are the passes' in order (depth 1's, computed from the target's features, then each
    later depth's, from the guesses before it), T each. The depth-j token at position t continues
    a chain that left the target's features after position p = t - j + 1: it sees the first pass's
    keys at s <= p, then depth i's key at p + i - 1 for i = 2 .. j (its own, at t, last). With T = 5,
    depth 2: position 3 sees the first pass's 0, 1, 2 and its own 3.
    """
    t = torch.arange(length)[:, None]
    s = torch.arange(length)[None, :]
    return torch.cat([s <= t - depth + 1] + [s == t - depth + i for i in range(2, depth + 1)], dim=1)


def as_guess(predicted: torch.Tensor, width: int) -> torch.Tensor:
    """The head's guesses g [..., hidden] as feature rows [..., width]: the earlier layers' blocks zero."""
    return F.pad(predicted, (0, width - predicted.shape[-1]))


def unit_rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def subset_labels(choices: torch.Tensor, vocab_map: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token ids -> head rows; IGNORE for tokens outside the subset."""
    row_of = torch.full((vocab,), IGNORE, dtype=torch.long)
    row_of[vocab_map] = torch.arange(len(vocab_map))
    return row_of[choices]


@dataclass(frozen=True, slots=True)
class Labels:
    """What the head learns at each position of the training windows, in head rows."""

    choice: torch.Tensor  # [N, T] the target's greedy token (IGNORE outside the subset)
    top_rows: torch.Tensor  # [N, T, TOP] its most probable tokens (row 0 where outside the subset)
    top_probs: torch.Tensor  # [N, T, TOP] their probabilities, renormalised over those inside the subset


def subset_targets(data: TargetPass, vocab_map: torch.Tensor, vocab: int) -> Labels:
    """The hard and soft labels of a target pass for a head over vocab_map's tokens.

    The soft label of a position is the target's distribution over its top tokens, restricted to
    the subset and renormalised (all zero where none of them is in the subset).
    """
    rows = subset_labels(data.top_ids.long(), vocab_map, vocab)
    inside = rows != IGNORE
    probs = data.top_logprobs.exp() * inside
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)
    return Labels(subset_labels(data.choices, vocab_map, vocab), rows.clamp(min=0), probs)


def head_loss(
    head: TrainableHead, data: TargetPass, rows: torch.Tensor, labels: Labels, settings: EagleSettings
) -> tuple[torch.Tensor, float]:
    """Loss of one batch of windows (settings.unroll draft depths); and the first depth's top-1 agreement."""
    feats = data.features[rows].float()  # [B, T, width]
    hidden = head.shape.hidden
    ids = data.ids[rows]
    # position t: (f_t, x_{t+1}) -> f_{t+1}, the target's choice after x_{t+1} and its distribution there
    inputs, next_ids = feats[:, :-1], ids[:, 1:]
    target_features, target_rows = unit_rms(feats[:, 1:, :hidden]), labels.choice[rows][:, 1:]
    top_rows, top_probs = labels.top_rows[rows][:, 1:], labels.top_probs[rows][:, 1:]
    scale = inputs.unflatten(-1, (-1, hidden)).pow(2).mean(-1, keepdim=True).sqrt()  # each block's RMS
    noise = ((torch.rand_like(inputs) * 2 - 1).unflatten(-1, (-1, hidden)) * settings.noise * scale).flatten(
        -2
    )
    total = torch.zeros(())
    agreement = 0.0
    # every depth at position t guesses f_{t+1} and the target's choice after x_{t+1}; depth j from t = j - 1
    for j, predicted in enumerate(head.unrolled(inputs + noise, next_ids, settings.unroll), start=1):
        logits = head.logits(predicted[:, j - 1 :])
        rows_j, top_rows_j, top_probs_j = target_rows[:, j - 1 :], top_rows[:, j - 1 :], top_probs[:, j - 1 :]
        ce = F.cross_entropy(logits.flatten(0, 1), rows_j.flatten(), ignore_index=IGNORE)
        log_q = torch.log_softmax(logits.float(), -1).gather(-1, top_rows_j)  # [B, T - j, TOP]
        soft = -(top_probs_j * log_q).sum(-1).sum() / top_probs_j.sum().clamp(min=1.0)
        feature = F.smooth_l1_loss(unit_rms(predicted[:, j - 1 :]), target_features[:, j - 1 :])
        total = total + ce + settings.soft_weight * soft + settings.feature_weight * feature
        if j == 1:
            valid = rows_j != IGNORE
            agreement = float(((logits.argmax(-1) == rows_j) & valid).sum() / valid.sum().clamp(min=1))
    return total, agreement


@dataclass(frozen=True, slots=True)
class Agreement:
    """Held-out top-1 agreement of the head's drafts with the target's greedy choices (full vocabulary)."""

    first: float  # the first draft token, at every position of the text
    on_greedy: float  # the same where the text's next token is the target's own choice, as when drafting
    second: float  # the second draft token, drafted from the head's own guess of the feature
    third: float  # the third, from its guess after that


@torch.no_grad()
def held_out_agreement(head: TrainableHead, data: TargetPass, batch: int) -> Agreement:
    """How often the head's drafts are the target's greedy tokens on held-out text.

    When drafting, the head's first token always follows the target's own choice (the pending
    token), so `on_greedy` counts the positions where the text's next token is that choice; the
    second and third tokens are drafted from the head's guesses of the feature, attending as when
    drafting (TrainableHead.unrolled; until session 24 the second token's measure attended to guesses
    at every earlier position: the run-J head read 51.0% that way, 50.5% this way).
    """
    agree, total = [0, 0, 0, 0], [0, 0, 0, 0]
    for start in range(0, len(data.ids), batch):
        feats = data.features[start : start + batch].float()
        ids = data.ids[start : start + batch]
        choices = data.choices[start : start + batch]
        # depth j at position t guesses the target's choice after x_{t+1}; it has a chain from t = j - 1
        depths = [
            head.vocab_map[head.logits(g).argmax(-1)] for g in head.unrolled(feats[:, :-1], ids[:, 1:], 3)
        ]
        hits = depths[0] == choices[:, 1:]
        agree[0] += int(hits.sum())
        total[0] += hits.numel()
        greedy = ids[:, 1:] == choices[:, :-1]  # x_{t+1} is what the target chose after x_t
        agree[1] += int((hits & greedy).sum())
        total[1] += int(greedy.sum())
        for j in (2, 3):
            agree[j] += int((depths[j - 1][:, j - 1 :] == choices[:, j:]).sum())
            total[j] += depths[j - 1][:, j - 1 :].numel()
    return Agreement(*(a / max(t, 1) for a, t in zip(agree, total, strict=True)))  # in its fields' order


def learning_rate(step: int, total: int, elapsed_min: float, settings: EagleSettings) -> float:
    """Warm-up, then a cosine decay to 0 over whichever ends first: the steps or the time budget."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = max((step - settings.warmup) / max(1, total - settings.warmup), elapsed_min / settings.minutes)
    return settings.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def cached_pass(target, windows: torch.Tensor, name: str, feature_layers: tuple[int, ...] = ()) -> TargetPass:
    """The target pass over windows, kept under WORK_DIR; a pass stored for a prefix of them is reused."""
    length = windows.shape[1]
    width = target.shape.hidden * (1 + len(feature_layers))
    if feature_layers:  # passes with other feature layers are other files
        name = f"{name}-layers{'_'.join(map(str, feature_layers))}"
    # other features, other files: the numerics, and the KV cache's dtype they attend over (a bf16
    # checkpoint's cache is bf16 since session 44, float32 numerics included)
    cache = str(row_invariant.cache_dtype(True, target.shape.head_dim)).removeprefix("torch.")
    if target.embed.dtype == torch.float32 and (row_invariant.numerics() != "float32" or cache != "float32"):
        name = f"{name}-{row_invariant.numerics()}-kv-{cache}"
    done = TargetPass(
        windows[:0],
        torch.empty(0, length, width, dtype=target.embed.dtype),
        windows[:0],
        torch.empty(0, length, TOP, dtype=torch.int32),
        torch.empty(0, length, TOP),
    )
    dtype = dtype_name(target.embed.dtype)
    for path in sorted(WORK_DIR.glob(f"{name}-{dtype}-*x{length}.pt")):
        saved = torch.load(path, weights_only=True)
        n = len(saved["ids"])
        # a pass stored before the soft labels were kept (no top_ids) is done again
        fits = len(done.ids) < n <= len(windows) and torch.equal(saved["ids"], windows[:n])
        if fits and "top_ids" in saved:
            done = TargetPass(**{field: saved[field] for field in PASS_FIELDS})
    if len(done.ids):
        print(f"target pass ({name}): reusing {len(done.ids)} of {len(windows)} windows", file=sys.stderr)
    if len(done.ids) == len(windows):
        return done
    rest = target_pass(target, windows[len(done.ids) :], f"target pass ({name})", feature_layers)
    data = TargetPass(
        windows, *(torch.cat([getattr(done, field), getattr(rest, field)]) for field in PASS_FIELDS[1:])
    )
    path = WORK_DIR / f"{name}-{dtype}-{len(windows)}x{length}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({field: getattr(data, field) for field in PASS_FIELDS}, path)
    return data


def feature_layers(spec: str | None, start: tuple[int, ...], n_layers: int) -> tuple[int, ...]:
    """--feature-layers (e.g. "1,14"), checked; default: those of the head it starts from.

    A head continued with more layers keeps its own as a prefix (its input columns stay in place).
    """
    if spec is None:
        return start
    try:
        layers = tuple(int(part) for part in spec.split(",") if part.strip())
    except ValueError:
        raise SystemExit(f"--feature-layers: comma-separated layer numbers, not {spec!r}") from None
    if not feature_layers_fit(layers, n_layers):
        raise SystemExit(
            f"--feature-layers: distinct ascending layers in 0 .. {n_layers - 2} (the last is read anyway), "
            f"not {spec!r}"
        )
    if layers[: len(start)] != start:
        raise SystemExit(
            f"--feature-layers {spec}: the head it starts from reads {list(start)}, which must come first"
        )
    return layers


def run_train_eagle(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from completion_engine.models import load_model

    settings = EagleSettings(
        train_tokens=args.train_tokens,
        seq_len=args.seq_len or EagleSettings().seq_len,
        batch=args.batch,
        minutes=args.minutes,
        subset_size=args.subset_size,
        seed=args.seed,
        lr=EagleSettings().lr if args.lr is None else args.lr,
        unroll=EagleSettings().unroll if args.unroll is None else args.unroll,
    )
    if settings.unroll < 1:
        raise SystemExit(f"--unroll must be >= 1, not {settings.unroll}")
    torch.manual_seed(settings.seed)
    # the target in the dtype it serves in here (models.resolve_dtype): its features as drafting sees them
    target = load_model("smollm2-135m", device="cpu", dtype="auto", progress=True)
    autocast = row_invariant.cpu_multiplies_bf16()  # the head trains in bf16 where the CPU has bf16 units
    eos = next(iter(target.eos_token_ids))
    root = Path(args.stdlib)
    print(f"tokenising {' '.join(args.train_root or [str(root)])} ...", file=sys.stderr, flush=True)
    windows = token_windows(training_files(args), target.tokenizer, settings.seq_len, eos)
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(settings.seed))
    if args.skip_tokens < 0:
        raise SystemExit(f"--skip-tokens must be >= 0, not {args.skip_tokens}")
    skip = args.skip_tokens // settings.seq_len  # windows an earlier run read: new text for this one
    windows = windows[order[skip : skip + max(1, settings.train_tokens // settings.seq_len)]]
    if not len(windows):
        raise SystemExit(f"--skip-tokens {args.skip_tokens} leaves no training windows")
    held_out = token_windows(
        sorted((root / HELD_OUT_PACKAGE).rglob("*.py")), target.tokenizer, settings.seq_len, eos
    )[: settings.eval_windows]
    start, start_layers = (
        load_head_state(Path(args.init_head), target.weights.shape.hidden) if args.init_head else (None, ())
    )
    layers = feature_layers(args.feature_layers, start_layers, target.weights.shape.n_layers)
    train = cached_pass(target.weights, windows, f"train-from{skip}" if skip else "train", layers)
    test = cached_pass(target.weights, held_out, "held-out", layers)
    # a head continued from another keeps its token subset (its LM head rows)
    if start is not None:
        vocab_map = start["vocab_map"]
    else:
        vocab_map = frequent_tokens(train.choices, settings.subset_size)
    labels = subset_targets(train, vocab_map, target.vocab_size)
    covered = float((labels.choice != IGNORE).float().mean())
    print(
        f"{len(train.ids)} training windows ({train.ids.numel():,} tokens), {len(test.ids)} held out; "
        f"head covers {len(vocab_map)} tokens ({covered:.1%} of the target's choices)",
        file=sys.stderr,
        flush=True,
    )
    head = TrainableHead(target.weights, vocab_map, layers)
    if start is not None:
        head.start_from(start)
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.lr, weight_decay=0.0)
    steps_per_epoch = max(1, len(train.ids) // settings.batch)
    total_steps = steps_per_epoch * settings.epochs_max
    step = 0
    checkpoint = Path(args.checkpoint or WORK_DIR / "checkpoint.pt")
    if args.resume:
        step = resume(checkpoint, "head", head, optimizer)
    if start is not None and not args.resume:
        seen = held_out_agreement(head, test, settings.batch)
        print(
            f"starting from {args.init_head}: held-out agreement {seen.first:.3f} (as when drafting "
            f"{seen.on_greedy:.3f}), second token {seen.second:.3f}, third {seen.third:.3f}",
            file=sys.stderr,
            flush=True,
        )
    started = time.monotonic()
    bar = tqdm(total=total_steps, initial=step, desc="train-eagle", file=sys.stderr)
    generator = torch.Generator().manual_seed(settings.seed + step)
    perm = torch.randperm(len(train.ids), generator=generator)
    while step < total_steps and (time.monotonic() - started) / 60 < settings.minutes:
        position = (step % steps_per_epoch) * settings.batch
        if position == 0 and step:
            perm = torch.randperm(len(train.ids), generator=generator)
        rows = perm[position : position + settings.batch]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total_steps, (time.monotonic() - started) / 60, settings)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, agreement = head_loss(head, train, rows, labels, settings)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", top1=f"{agreement:.2f}")
        if step % 50 == 0:
            save_checkpoint(checkpoint, "head", head, optimizer, step)
        if step % settings.eval_every == 0:
            seen = held_out_agreement(head, test, settings.batch)
            bar.write(
                f"step {step}: held-out agreement {seen.first:.3f} (as when drafting {seen.on_greedy:.3f}), "
                f"second token {seen.second:.3f}, third {seen.third:.3f}",
                file=sys.stderr,
            )
    bar.close()
    agreement = held_out_agreement(head, test, settings.batch)
    out = Path(args.out or EAGLE_DIR)
    config = EagleConfig(
        subset_size=len(vocab_map),
        target="smollm2-135m",
        hidden=target.weights.shape.hidden,
        # the last row of a training window sees itself and the seq_len - 2 slots before it: no
        # key further back (see drafting/eagle.EagleHead)
        window=settings.seq_len - 1,
        feature_layers=layers,
    )
    save_eagle(out, head.export(target.weights), config)
    minutes = (time.monotonic() - started) / 60
    print(
        f"steps {step} ({minutes:.1f} min); held-out top-1 agreement: first token {agreement.first:.3f} "
        f"({agreement.on_greedy:.3f} where the text follows the target's choice, as when drafting), "
        f"second token (from its own guess) {agreement.second:.3f}, third {agreement.third:.3f}; "
        f"saved to {out}",
        flush=True,
    )
    return 0
