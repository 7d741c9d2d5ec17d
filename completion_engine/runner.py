"""A Llama-family decoder forward that gives the same bits whichever way its rows are batched.

Why: in bf16, a position computed inside a k-token verify block goes through different GEMM and
attention kernels than the same position in a 1-token decode step, so near-tied argmaxes flip and
"speculative == plain greedy" stops being true (../shared/notes/exactness.md measures this).

How (exact mode): a forward multiplies a fixed number of rows, padding included, so every Linear,
norm and activation sees one of two shapes: DECODE_ROWS (decode steps and verify blocks) or
PREFILL_ROWS (context prefill). At a fixed shape a row's result depends neither on its place in the
block nor on the other rows. Where the kernels give a row the same bits in a smaller forward as in a
DECODE_ROWS one (probed once per runner, `_probe_decode_buckets`; not on a GPU nor where torch
multiplies bf16 natively on the CPU, where a probe was seen to pass and real tokens to differ), a
short decode forward uses the smallest such bucket that holds it. In float32 on an AVX2 CPU the
Linears run on row_invariant's kernel, where every output is one fixed chain of fused
multiply-adds whatever the row count, so the probe admits every bucket and a decode step is a
1-row forward (with MKL there, 1-3 rows differ).
Attention runs per key bucket: each query row attends to its own causal
prefix of length L, keys and values padded (masked to -inf, so they add exact zeros) to a multiple
of KEY_BUCKET, in calls of a fixed number of query rows (DECODE_ATTENTION_ROWS in decode forwards,
KEY_BUCKET in prefill forwards). On the kernel, attention is instead one call per layer over the
real rows (row_invariant.attention), each row over exactly its own L keys. So the hidden state of
a position is a pure function of the tokens up to it and of the row bucket that computed each of them.

On the kernel (exact float32 with row_invariant's kernel: `any_schedule`) the row bucket drops out:
every reduction of the forward (Linears, attention, the norms, the final norm) is the kernel's,
a fixed function of the row's own inputs, and the rest is elementwise, so a position's bits depend
on the tokens up to it alone. There the runner keeps no schedule: a forward holds only its real
rows (a 3-token draft is a 3-row forward), a prefill runs blocks of KERNEL_PREFILL_ROWS from the
first position it does not have and the rest in one forward, and every cached position that holds the
same token is kept, including generated ones that became context.

The schedule that makes every path agree: context positions below `prefill_boundary(len)` (whole
blocks of PREFILL_ROWS) are computed in prefill forwards, the rest of the context and every
generated or drafted token in decode forwards. Plain decoding and every drafter share it, so
speculative output equals plain output; the KV cache records each position's bucket and
`reusable_prefix` keeps a cached position only where a cold run would have computed it in the same
bucket, so a warm request gives the bits of a cold one.

Why these sizes (measured on a 2-core AMX CPU with SmolLM2-135M, bf16; `python -m eval.bench_forward`):
- a decode forward of 16 rows costs about what a 1-row forward costs (the weights are read once
  either way; bf16 GEMV is no faster than a 16-row GEMM here), so a 15-token draft is verified for
  the price of one decode step;
- attention in a decode forward runs on the real rows only, in calls of DECODE_ATTENTION_ROWS
  rows: a 1-token step no longer pays for 15 padding rows of scores over the whole context;
- prefill forwards of 128 rows run the GEMMs several times faster per token than 16-row forwards,
  and a 128-row block of positions shares one key bucket, so its attention has no padding rows.

Fast mode (exact=False) runs the rows unpadded through SDPA: quicker where torch's kernels run, used
for draft models there, where exactness does not matter (on the row-invariant kernel a draft model
runs the exact path, which is unpadded and faster there).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from completion_engine import row_invariant
from completion_engine.kv import KEY_BUCKET, KVCache, common_prefix_len
from completion_engine.token_tree import path_lengths, path_to

DECODE_ROWS = 16  # rows of a decode / verify forward: a verify block holds at most this many tokens
# smaller decode forwards, used where they give every row the bits of a DECODE_ROWS forward (probed)
DECODE_BUCKET_CANDIDATES = (1, 2, 4, 8, DECODE_ROWS)
PREFILL_ROWS = 128  # rows of a prefill forward
# rows of a prefill forward on the kernel (any rows give the same bits there): each block streams
# the weights once, so bigger blocks read them less often. Measured (a cold 2,000-token prefill of
# SmolLM2-135M, AMX numerics, two threads, best of 3, one process): 128 rows 0.957 s, 256 0.884,
# 512 0.843.
KERNEL_PREFILL_ROWS = 512
DECODE_ATTENTION_ROWS = 4  # query rows per attention call in a decode forward
FAST = 0  # row bucket recorded for positions computed in fast (inexact) mode
ANY_ROWS = -1  # row bucket recorded on the row-invariant kernel, where any forward gives the same bits


def prefill_boundary(context_len: int) -> int:
    """Context positions below this are computed in prefill forwards, the rest in decode forwards.

    Whole blocks of PREFILL_ROWS only, so typing at the end of a file recomputes a few positions in
    one decode forward; crossing a block boundary recomputes that block once in a prefill forward.

    >>> prefill_boundary(2000), prefill_boundary(127), prefill_boundary(256)
    (1920, 0, 256)
    """
    return context_len // PREFILL_ROWS * PREFILL_ROWS


def cold_row_bucket(position: int, context_len: int) -> int:
    return PREFILL_ROWS if position < prefill_boundary(context_len) else DECODE_ROWS


def reusable_prefix(
    cached_tokens: Sequence[int], cached_buckets: Sequence[int], context: Sequence[int]
) -> int:
    """How many cached positions a request for `context` keeps: same token and the bucket a cold run uses.

    >>> P, D = PREFILL_ROWS, DECODE_ROWS
    >>> reusable_prefix([5, 6, 7], [D, D, D], [5, 6, 8])  # short context: all decode forwards
    2
    >>> ctx = list(range(300))
    >>> reusable_prefix(ctx[:200], [P] * 128 + [D] * 72, ctx)  # 128..199 must now be prefill rows
    128
    """
    common = common_prefix_len(cached_tokens, context)
    for position in range(common):
        if cached_buckets[position] != cold_row_bucket(position, len(context)):
            return position
    return common


@dataclass(frozen=True, slots=True)
class DecoderShape:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    max_positions: int

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads


@dataclass(frozen=True, slots=True)
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [(n_heads + 2 * n_kv_heads) * head_dim, hidden]: q, k, v fused
    qkv_bias: torch.Tensor | None  # Qwen2 has biases on q, k, v
    out: torch.Tensor  # [hidden, n_heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: torch.Tensor  # [2 * intermediate, hidden]: gate and up fused
    down: torch.Tensor  # [hidden, intermediate]


@dataclass(frozen=True, slots=True)
class DecoderWeights:
    shape: DecoderShape
    embed: torch.Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden]
    inv_freq: torch.Tensor  # [head_dim / 2] float32 rotary frequencies (any scaling already applied)
    rope_scale: float  # attention_scaling of the rotary embedding (1.0 unless YaRN-like scaling)
    # the Linears packed for row_invariant's kernel, made once by the first runner that uses them
    packed: dict[str, tuple[tuple[LayerLinears, ...], Linear]] = field(
        default_factory=dict, compare=False, repr=False
    )


Linear = Callable[[torch.Tensor], torch.Tensor]  # x [rows, in] -> [rows, out], as F.linear(x, w, b)


@dataclass(frozen=True, slots=True)
class LayerLinears:
    """The four Linears of a layer as the runner multiplies them: torch's F.linear or the packed kernel."""

    qkv: Linear
    out: Linear
    gate_up: Linear
    down: Linear


_packing = threading.Lock()


def torch_linear(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
    return lambda x: F.linear(x, weight, bias)


def decoder_linears(
    weights: DecoderWeights, row_invariant_kernel: bool
) -> tuple[tuple[LayerLinears, ...], Linear]:
    """Each layer's Linears and the LM head: torch's, or row_invariant's (packed once per weights)."""
    if not row_invariant_kernel:
        layers = tuple(
            LayerLinears(
                torch_linear(w.qkv, w.qkv_bias),
                torch_linear(w.out),
                torch_linear(w.gate_up),
                torch_linear(w.down),
            )
            for w in weights.layers
        )
        return layers, torch_linear(weights.lm_head)
    amx_order = row_invariant.numerics() == "amx"
    key = "row_invariant-amx" if amx_order else "row_invariant"
    with _packing:
        if key not in weights.packed:

            def pack(weight: torch.Tensor, bias: torch.Tensor | None = None) -> row_invariant.PackedLinear:
                return row_invariant.pack(weight, bias, amx_order=amx_order)

            layers = tuple(
                LayerLinears(pack(w.qkv, w.qkv_bias), pack(w.out), pack(w.gate_up), pack(w.down))
                for w in weights.layers
            )
            weights.packed[key] = (layers, pack(weights.lm_head))
        return weights.packed[key]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # As Llama: normalise in float32, cast back, then scale.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def feature_layers_fit(layers: Sequence[int], n_layers: int) -> bool:
    """Can a runner keep these layers' outputs beside the last one's: distinct, ascending, earlier layers."""
    return list(layers) == sorted(set(layers)) and all(0 <= layer < n_layers - 1 for layer in layers)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def full_decode_rows_only(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether every decode forward must be DECODE_ROWS rows, no probe admitting fewer: off the CPU
    (an H200's cuBLAS), and where torch multiplies bf16 natively on the CPU (oneDNN on AVX512-BF16 or
    AMX). Both were seen to pass a probe of a few tokens and to differ on real ones
    (DecoderRunner._probe_decode_buckets says where)."""
    if device.type != "cpu":
        return True
    return dtype == torch.bfloat16 and row_invariant.cpu_multiplies_bf16()


class DecoderRunner:
    """Runs one decoder with its own KV cache.

    `prefill` brings the cache to a context (reusing what it can) and returns the last logits;
    `extend` appends decode-bucket tokens (plain steps, verify blocks) and returns their logits.
    """

    def __init__(
        self,
        weights: DecoderWeights,
        exact: bool,
        capacity: int,
        keep_features: bool = False,
        decode_buckets: tuple[int, ...] | None = None,
        row_invariant_kernel: bool | None = None,
        feature_window: int | None = None,
        feature_layers: tuple[int, ...] = (),
    ) -> None:
        self.w = weights
        self.shape = weights.shape
        self.exact = exact
        self.dtype = weights.embed.dtype
        self.device = weights.embed.device
        s = self.shape
        capacity = min(capacity, s.max_positions) if s.max_positions > 0 else capacity
        # float32 on an AVX2 CPU: row_invariant's kernel, whose rows never depend on the row count,
        # for the Linears and (exact mode, keys and values kept in its panel layout) for attention
        if row_invariant_kernel is None:
            row_invariant_kernel = row_invariant.usable(self.dtype, self.device)
        self.row_invariant_kernel = row_invariant_kernel
        self.linears, self.lm_head = decoder_linears(weights, row_invariant_kernel)
        # exact on the kernel: no row buckets to keep, every small step on the kernel too, and the KV
        # cache in its panel layout (see the module docstring)
        self.any_schedule = exact and row_invariant_kernel
        self.prefill_rows = (
            KERNEL_PREFILL_ROWS if self.any_schedule else PREFILL_ROWS
        )  # rows of a prefill forward
        # ... and a chain's layers as one kernel call each (row_invariant.layer)
        self._layer_panels = (
            [row_invariant.LayerPanels.of((lin.qkv, lin.out, lin.gate_up, lin.down)) for lin in self.linears]
            if self.any_schedule
            else []
        )
        # on the kernel with bf16 panels, a bf16 cache (row_invariant.cache_dtype): attention multiplies
        # bf16 under the amx and bf16dot numerics, widens it under float32 (row_invariant.attention)
        linears_bf16 = bool(self._layer_panels) and self._layer_panels[0].panels[0].dtype == torch.bfloat16
        self.cache = KVCache(
            s.n_layers,
            s.n_kv_heads,
            s.head_dim,
            capacity + DECODE_ROWS,
            row_invariant.cache_dtype(linears_bf16, s.head_dim) if self.any_schedule else self.dtype,
            self.device,
            panels=self.any_schedule,
        )
        positions = torch.arange(self.cache.capacity, dtype=torch.float32, device=self.device)
        freqs = torch.outer(positions, weights.inv_freq.to(self.device))
        emb = torch.cat((freqs, freqs), dim=-1)  # [capacity, head_dim]
        self.cos = (emb.cos() * weights.rope_scale).to(self.dtype)
        self.sin = (emb.sin() * weights.rope_scale).to(self.dtype)
        self.forwards = 0  # forward passes run, for the stats
        # (length, logits after position length - 1) from the last prefill: still valid while the cache
        # keeps those positions, so a prefill of a context already cached (a warm-up) needs no forward
        self._last_logits: tuple[int, torch.Tensor] | None = None
        self._tree: tuple[list[int], TreePlan] | None = None  # the last verify_tree, for accept_path
        # keep_features: the last layer's output (before the final norm) at every cached position,
        # what a draft head that reads the target's features (drafting/eagle.py) starts from; a
        # copy of rows the forward computes anyway, so the target's bits do not change.
        # feature_layers: earlier layers whose outputs are kept beside it (EAGLE-3's low and middle
        # features): features[p] is [last, feature_layers[0], ...], each `hidden` wide.
        if not feature_layers_fit(feature_layers, s.n_layers):
            raise ValueError(
                f"feature layers are distinct, ascending and in 0 .. {s.n_layers - 2} (the last is kept "
                f"anyway), not {feature_layers}"
            )
        self.feature_layers = tuple(feature_layers) if keep_features else ()
        self.features = (
            torch.zeros(
                self.cache.capacity,
                s.hidden * (1 + len(self.feature_layers)),
                dtype=self.dtype,
                device=self.device,
            )
            if keep_features
            else None
        )
        # feature_window: a prefill keeps the features of its last `feature_window` positions only
        # (a head that looks no further back needs no more); on the kernel the last layer's other
        # rows are then not computed, as without features (about 1/30 of a prefill).
        # features_valid[p]: whether features[p] was computed for the token cached at p.
        self.feature_window = feature_window
        self.features_valid = torch.zeros(self.cache.capacity, dtype=torch.bool)
        self._features_from = 0  # during a prefill: the first position whose features it keeps
        # row counts of decode forwards, smallest first: (DECODE_ROWS,) unless smaller forwards give
        # the same bits (None: probe this machine's kernels with these weights)
        if decode_buckets is None and self.any_schedule:
            decode_buckets = tuple(range(1, DECODE_ROWS + 1))  # every row count: the real rows only
        self.decode_buckets = decode_buckets or (self._probe_decode_buckets() if exact else (DECODE_ROWS,))
        if self.decode_buckets[-1] != DECODE_ROWS:
            raise ValueError(f"decode buckets must end with DECODE_ROWS ({DECODE_ROWS})")

    @property
    def capacity(self) -> int:
        return self.cache.capacity - DECODE_ROWS

    def __len__(self) -> int:
        return len(self.cache)

    @property
    def token_ids(self) -> list[int]:
        return self.cache.token_ids

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)
        if self._last_logits is not None and self._last_logits[0] > length:
            self._last_logits = None

    @torch.inference_mode()
    def prefill(
        self, context: Sequence[int], cancel: threading.Event | None = None
    ) -> tuple[torch.Tensor | None, int]:
        """Bring the cache to `context`; return (float32 logits [1, vocab] after its last token, computed).

        Cached positions are kept where a cold run would give the same bits (`reusable_prefix`); the
        last token's logits come from the last prefill when it ended there, else it is recomputed.
        `computed` counts the positions run. A set `cancel` stops within one layer: the cache keeps
        the positions done (valid for later reuse) and the logits are None.
        """
        if not context:
            raise ValueError("prefill needs at least one token")
        self._check_room(len(context))
        if self.exact and not self.any_schedule:
            keep = reusable_prefix(self.cache.token_ids, self.cache.row_buckets, context)
        else:
            keep = common_prefix_len(self.cache.token_ids, context)
        if keep == len(context) and self._last_logits is not None and self._last_logits[0] == keep:
            self.truncate(keep)
            return self._last_logits[1], 0
        keep = min(keep, len(context) - 1)
        self.truncate(keep)
        if not self.exact or self.any_schedule:
            # fast mode: one forward, or blocks of PREFILL_ROWS when it may be cancelled (a warm-up: a
            # request waits at most one block, not a whole context). On the kernel: always blocks of
            # KERNEL_PREFILL_ROWS, so a cancelled warm-up loses at most one block's layers (any blocks
            # give the same bits).
            step = self.prefill_rows if cancel is not None or self.exact else len(context) - keep
            if self.feature_window is not None and self.any_schedule:
                self._features_from = max(0, len(context) - self.feature_window)
            try:
                for begin in range(keep, len(context), step):
                    block = list(context[begin : begin + step])
                    last = begin + step >= len(context)
                    try:
                        logits = self._run(block, len(block), all_logits=False, logits=last, cancel=cancel)
                    except _Cancelled:
                        return None, begin - keep
            finally:
                self._features_from = 0
            self._last_logits = (len(context), logits)
            return logits, len(context) - keep
        boundary = prefill_boundary(len(context))
        position = keep
        while position < len(context):
            if position < boundary:  # up to the end of this position's block of PREFILL_ROWS
                rows, end = PREFILL_ROWS, min(boundary, (position // PREFILL_ROWS + 1) * PREFILL_ROWS)
            else:
                end = min(len(context), position + DECODE_ROWS)
                rows = self._decode_rows(end - position)
            last = end == len(context)
            try:
                logits = self._run(
                    list(context[position:end]), rows, all_logits=False, logits=last, cancel=cancel
                )
            except _Cancelled:
                return None, position - keep
            position = end
        self._last_logits = (len(context), logits)
        return logits, len(context) - keep

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], all_logits: bool = False) -> torch.Tensor:
        """Append tokens after the cached ones; return float32 logits [n, vocab] (or [1, vocab] for the last).

        Exact mode runs ceil(n / DECODE_ROWS) decode forwards; fast mode one forward.
        """
        if not tokens:
            raise ValueError("extend needs at least one token")
        self._check_room(len(self.cache) + len(tokens))
        step = DECODE_ROWS if self.exact else len(tokens)
        logits = []
        for begin in range(0, len(tokens), step):
            block = list(tokens[begin : begin + step])
            last_block = begin + step >= len(tokens)
            rows = self._decode_rows(len(block)) if self.exact else step
            if all_logits or last_block:
                logits.append(self._run(block, rows, all_logits))
            else:
                self._run(block, rows, all_logits=False, logits=False)
        return torch.cat(logits)

    @torch.inference_mode()
    def verify_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """One decode forward over a token tree after the cached tokens; float32 logits [n, vocab].

        tokens[0] is the root (the pending token), parents[i] < i node i's parent (parents[0] == -1).
        Node i sits at position len(cache) + depth(i) and attends to the cache and its own ancestors,
        whose keys lie where plain decoding of its root-to-node path would put them, in the same
        fixed-shape calls: its logits are the bits of decoding that path one token at a time. The
        cache keeps no tree position until `accept_path` picks one root-to-node path.
        On the kernel the whole tree is one call per layer, as a chain's: node i's keys and values
        go to len(cache) + i, and the kernel reads a node's path in order after the cache
        (row_invariant.attention's trees), so a tree costs what a chain of as many tokens does.
        Elsewhere each root-to-leaf chain in turn is written in place and attends (a call per chain).
        """
        if not self.exact:
            raise ValueError("tree verification needs the exact forward")
        if not 0 < len(tokens) <= DECODE_ROWS or len(parents) != len(tokens):
            raise ValueError(f"a token tree has 1 to {DECODE_ROWS} nodes, each with a parent")
        tree = TreePlan.of(parents, self.shape.n_layers)
        # (on the kernel node i's keys go to len(cache) + i: within the DECODE_ROWS the cache keeps
        # past `capacity`)
        self._check_room(len(self.cache) + max(tree.depths) + 1)
        taps: list[torch.Tensor] = []
        hidden = self._forward(list(tokens), self._decode_rows(len(tokens)), tree, taps=taps)
        tree.hidden = torch.cat([hidden[: len(tokens)], *taps], dim=-1) if taps else hidden[: len(tokens)]
        self._tree = (list(tokens), tree)
        return self._logits(hidden)[: len(tokens)].float()

    def accept_path(self, path: Sequence[int]) -> None:
        """Keep the nodes of `path` (root first, each the parent of the next) from the last verify_tree.

        Call it right after verify_tree: on the kernel the nodes' keys and values are read back from
        the cache positions that forward left them at.
        """
        tokens, tree = self._tree
        start = len(self.cache)
        if tree.keys[0] is None:  # the kernel left node i at start + i: move the path's nodes up
            first = next((depth for depth, node in enumerate(path) if node != depth), len(path))
            self.cache.gather(start + first, [start + node for node in path[first:]])
        else:
            for layer in range(self.shape.n_layers):
                self.cache.write(layer, start, tree.keys[layer][:, path], tree.values[layer][:, path])
        if self.features is not None:
            self.features[start : start + len(path)] = tree.hidden[path]
            self.features_valid[start : start + len(path)] = True
        self.cache.append_tokens([tokens[node] for node in path], self._bucket_class(DECODE_ROWS))

    def rows_cost_time(self, rows: int) -> bool:
        """Whether a forward of `rows` tokens costs more than one of 1 token for certain: on the CPU,
        where the two run different rows (exact: different decode buckets; fast: a chain runs its
        own rows). Where both run DECODE_ROWS rows (AMX, a GPU) they cost the same, and on a GPU a
        few more rows cost nothing measurable."""
        if self.device.type != "cpu":
            return False
        return not self.exact or self._decode_rows(1) < self._decode_rows(rows)

    def _decode_rows(self, n: int) -> int:
        """The rows of the decode forward that holds n tokens: the smallest bucket that fits them."""
        return next(rows for rows in self.decode_buckets if rows >= n)

    def _bucket_class(self, rows: int) -> int:
        """The row bucket the KV cache records: decode buckets are one class, as they give the same bits."""
        if not self.exact:
            return FAST
        if self.any_schedule:
            return ANY_ROWS
        return PREFILL_ROWS if rows == PREFILL_ROWS else DECODE_ROWS

    @torch.inference_mode()
    def _probe_decode_buckets(self) -> tuple[int, ...]:
        """The decode forwards smaller than DECODE_ROWS that give every row the bits of a DECODE_ROWS one.

        Whether a GEMM's row depends on the row count is up to the kernels the library picks for each
        shape, dtype and thread count: e.g. with MKL on an AVX2 CPU in float32, 4-, 8- and 16-row
        forwards agree bit for bit (1-row ones do not), and a 4-row forward costs 0.75x a 16-row one;
        on an AMX CPU in bf16 a 16-row forward costs about what a 1-row one does; row_invariant's kernel
        agrees at every row count by construction. So each runner checks, once, with its own weights:
        the same tokens through each candidate row count, every layer's output and the logits compared
        bit for bit with the DECODE_ROWS forward. Only candidates that agree are used.

        Not where torch multiplies bf16 natively on the CPU (AVX512-BF16 or AMX): there oneDNN's
        GEMMs for 1-8 rows and for 16 rows round differently on rare inputs, which a probe of a few
        tokens does not meet (seen on a Zen 4: a 16-row verify block and 1-row steps of the same
        tokens differed at 3 of 16 positions of one real sequence, and speculative output left plain
        decoding's; with every forward in 16 rows they agreed). There every forward is DECODE_ROWS
        rows; on an AMX CPU a 16-row forward costs about a 1-row one.
        Nor on a GPU (any device but the CPU: the probe is shown sufficient there alone): on an
        H200 (torch 2.11, cuBLAS, bf16, `eval.bench_gpu`'s random 1.5B shape) the probe passed 1, 2,
        4 and 8 rows, yet on one of three random 16-token blocks after a 1,024-token prefix the
        block's logits left those of 1-row steps at 14 of 16 positions (max 0.016); with every
        forward in 16 rows all three agreed bit for bit (the 7B shape's probe passed 16 alone).
        """
        if full_decode_rows_only(self.device, self.dtype):
            return (DECODE_ROWS,)
        tokens = [(7919 * i + 11) % self.shape.vocab for i in range(3)]  # any tokens: kernels, not data
        start = len(self.cache)

        def outputs(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
            held = tokens[:rows]
            hidden = self._forward(held, rows)  # writes scratch keys past the cache's length only
            logits = self.lm_head(rms_norm(hidden, self.w.final_norm, self.shape.rms_eps))
            return hidden[: len(held)], logits[: len(held)]

        reference = outputs(DECODE_ROWS)
        agree = []
        for rows in DECODE_BUCKET_CANDIDATES[:-1]:
            candidate = outputs(rows)
            if all(torch.equal(a, b[: len(a)]) for a, b in zip(candidate, reference, strict=True)):
                agree.append(rows)
        self.forwards = 0
        assert len(self.cache) == start
        return (*agree, DECODE_ROWS)

    def _check_room(self, length: int) -> None:
        if length > self.capacity:
            raise ValueError(f"context of {length} tokens exceeds capacity {self.capacity}")

    def _run(
        self,
        tokens: list[int],
        rows: int,
        all_logits: bool,
        logits: bool = True,
        cancel: threading.Event | None = None,
    ) -> torch.Tensor | None:
        """One forward of `rows` rows (exact) holding `tokens`; float32 logits of all or the last token.

        A set `cancel` stops the forward between two layers (_Cancelled): the cache's length is
        unchanged, and the keys and values already written past it are overwritten by the next forward.
        """
        rows = rows if self.exact else len(tokens)
        n = len(tokens)
        start = len(self.cache)
        outputs = None  # every row's last-layer output: for the features, all logits, or torch's path
        if self.any_schedule and not all_logits and rows == n:
            # the last layer's rows: the kept features' (from _features_from on), else the last row's
            first = n if self.features is None else min(max(self._features_from - start, 0), n)
            outputs = (min(first, n - 1) if logits else first, n)
        taps: list[torch.Tensor] = []
        hidden = self._forward(tokens, rows, cancel=cancel, outputs=outputs, taps=taps)
        if self.features is not None:
            first = 0 if outputs is None else outputs[0]
            self.features[start + first : start + n, : self.shape.hidden] = hidden[: n - first]
            for block, tap in enumerate(taps, start=1):
                self.features[
                    start + first : start + n, block * self.shape.hidden : (block + 1) * self.shape.hidden
                ] = tap[first:n]
            self.features_valid[start : start + first] = False
            self.features_valid[start + first : start + n] = True
        self.cache.append_tokens(tokens, self._bucket_class(rows))
        if not logits:
            return None
        if all_logits:
            return self._logits(hidden)[:n].float()
        if outputs is not None:  # hidden holds rows outputs[0] .. n - 1: the last one's logits
            return self._logits(hidden[n - 1 - outputs[0] : n - outputs[0]])[:1].float()
        return self._logits(self._select_row(hidden, n - 1))[:1].float()

    def _select_row(self, hidden: torch.Tensor, row: int) -> torch.Tensor:
        if not self.exact or self.any_schedule:
            return hidden[row : row + 1]
        picked = hidden.new_zeros(self.decode_buckets[0], hidden.shape[1])  # the LM head sees a decode bucket
        picked[0] = hidden[row]
        return picked

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.any_schedule:  # the final norm on the kernel too: each row's logits on its own
            return self.lm_head(row_invariant.rms_norm(hidden, self.w.final_norm, self.shape.rms_eps))
        if self.exact and hidden.shape[0] not in self.decode_buckets:  # a prefill forward's: per block
            return torch.cat([self._logits(part) for part in hidden.split(DECODE_ROWS)])
        return self.lm_head(rms_norm(hidden, self.w.final_norm, self.shape.rms_eps))

    def _forward(
        self,
        tokens: list[int],
        rows: int,
        tree: TreePlan | None = None,
        cancel: threading.Event | None = None,
        outputs: tuple[int, int] | None = None,
        taps: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Hidden states [rows, hidden] of `tokens` placed after the cache (a chain, or a tree's nodes).

        On the kernel a chain's layers are one call each (row_invariant.layer; the same steps as the
        loop below, so the same bits); token trees and the torch paths run the steps one by one.
        outputs (the kernel's path, a chain): only real rows [a, b) of the last layer are computed
        past its keys and values, and [b - a, hidden] is returned. A prefill block needs no row of
        it (only the next forward's keys), its last block one row: about 1/30 of a prefill of
        SmolLM2-135M. On the kernel a row's bits do not depend on the rows beside it, so the rows
        that are computed get the same bits as in a whole forward.
        taps: gets the outputs [n, hidden] of the runner's feature_layers, in their order (copies).
        """
        s = self.shape
        n = len(tokens)
        start = len(self.cache)
        ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        ids[:n] = torch.tensor(tokens, dtype=torch.long)
        x = F.embedding(ids, self.w.embed)  # [rows, hidden]
        pos = torch.full((rows,), start, device=self.device)  # padding rows sit at the first position
        offsets = tree.depths if tree is not None else list(range(n))  # a tree node sits at its depth
        pos[:n] = start + torch.tensor(offsets, dtype=torch.long, device=self.device)
        cos, sin = self.cos[pos], self.sin[pos]  # [rows, head_dim]
        q_size, kv_size = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        if not self.exact:
            calls = []
        elif tree is None:
            calls = self._attention_calls([(i, start + i + 1) for i in range(n)], rows)
        elif self.any_schedule and rows == n:  # the kernel attends a whole tree in one call
            tree_lengths = torch.tensor([start + depth + 1 for depth in tree.depths])
            tree_parents = torch.tensor(tree.parents)
        else:
            paths = [
                (chain, self._attention_calls([(i, start + tree.depths[i] + 1) for i in owned], rows))
                for chain, owned in tree.paths
            ]
        for index, (layer, linear) in enumerate(zip(self.w.layers, self.linears, strict=True)):
            if cancel is not None and cancel.is_set():  # a warm-up gives way within one layer
                raise _Cancelled
            if self.any_schedule and rows == n:  # a chain or a tree on the kernel: one call
                last = outputs is not None and index == s.n_layers - 1
                x = row_invariant.layer(
                    x,
                    (layer.input_norm, layer.post_norm),
                    s.rms_eps,
                    self._layer_panels[index],
                    (cos, sin),
                    (s.n_heads, s.n_kv_heads),
                    (self.cache.keys[index], self.cache.values[index]),
                    start,
                    calls[0].lengths if tree is None else tree_lengths,
                    s.head_dim**-0.5,
                    outputs if last else (0, n),
                    None if tree is None else tree_parents,
                )
                if taps is not None and index in self.feature_layers:
                    taps.append(x[:n].clone())
                continue
            if self.any_schedule:  # the small steps on the kernel too: one call each
                qkv = linear.qkv(row_invariant.rms_norm(x, layer.input_norm, s.rms_eps))
                q, k = row_invariant.rotary(qkv, s.n_heads, s.n_kv_heads, cos, sin)
            else:
                qkv = linear.qkv(rms_norm(x, layer.input_norm, s.rms_eps))
                q, k, _ = qkv.split((q_size, kv_size, kv_size), dim=-1)
                q = q.view(rows, s.n_heads, s.head_dim)
                k = k.view(rows, s.n_kv_heads, s.head_dim)
                q = q * cos[:, None] + rotate_half(q) * sin[:, None]
                k = k * cos[:, None] + rotate_half(k) * sin[:, None]
            k = k[:n].transpose(0, 1)  # [kv_head, n, head_dim]
            v = qkv[:, q_size + kv_size :].view(rows, s.n_kv_heads, s.head_dim)[:n].transpose(0, 1)
            attn = q.new_zeros(rows, s.n_heads * s.head_dim)  # padding rows of the forward stay zero
            if tree is not None:
                # Each root-to-leaf chain in turn is written where plain decoding keeps it, and the
                # rows it owns attend to exactly the keys a chain would give them.
                tree.keys[index], tree.values[index] = k, v
                for chain, calls in paths:
                    self.cache.write(index, start, k[:, chain], v[:, chain])
                    self._bucketed_attention(index, q, calls, attn)
            else:
                self.cache.write(index, start, k, v)
                if self.exact:
                    self._bucketed_attention(index, q, calls, attn)
                else:
                    attn = self._sdpa_attention(index, q, start, n)
            x = x + linear.out(attn)  # [rows, n_heads * head_dim] -> [rows, hidden]
            if self.any_schedule:
                act = row_invariant.silu_mul(
                    linear.gate_up(row_invariant.rms_norm(x, layer.post_norm, s.rms_eps))
                )
            else:
                gate, up = linear.gate_up(rms_norm(x, layer.post_norm, s.rms_eps)).chunk(2, dim=-1)
                act = F.silu(gate) * up
            x = x + linear.down(act)
            if taps is not None and index in self.feature_layers:
                taps.append(x[:n].clone())
        self.forwards += 1
        return x

    def _sdpa_attention(self, layer: int, q: torch.Tensor, start: int, n: int) -> torch.Tensor:
        s = self.shape
        length = start + n
        keys = self.cache.keys[layer, :, :length]  # [kv_head, length, head_dim]
        values = self.cache.values[layer, :, :length]
        # row i sits at position start + i and sees keys 0 .. start + i
        visible = (
            torch.arange(length, device=self.device)[None, :]
            <= torch.arange(start, length, device=self.device)[:, None]
        )
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None], values[None], attn_mask=visible, enable_gqa=s.group > 1
        )  # [1, n_heads, n, head_dim]
        return out[0].transpose(0, 1).reshape(n, s.n_heads * s.head_dim)

    def _attention_calls(self, entries: list[tuple[int, int]], rows: int) -> list[AttentionCall]:
        """The fixed-shape attention calls of one forward; the same for every layer.

        entries: (row, L) for each real row, in order: the row attends to its first L keys. Consecutive
        rows whose L pads to the same key bucket go together, in calls of `call_rows` rows (padding
        rows repeat the call's first row and are dropped).
        """
        if self.cache.panels:  # on the kernel a row's attention depends on nothing else: one call
            row_ids = [row for row, _ in entries]
            lengths = torch.tensor([length for _, length in entries], device=self.device)
            return [AttentionCall(row_ids[0], len(row_ids), 0, None, self._row_index(row_ids), lengths)]
        call_rows = KEY_BUCKET if rows == PREFILL_ROWS else DECODE_ATTENTION_ROWS
        calls = []
        first = 0
        while first < len(entries):
            padded = -(-entries[first][1] // KEY_BUCKET) * KEY_BUCKET
            last = first
            while last < len(entries) and last - first < call_rows and entries[last][1] <= padded:
                last += 1
            here = entries[first:last]
            lengths = [length for _, length in here] + [here[0][1]] * (call_rows - len(here))
            row_lengths = torch.tensor(lengths, device=self.device)
            hidden_keys = torch.arange(padded, device=self.device)[None, :] >= row_lengths[:, None]
            mask = torch.zeros(len(lengths), padded, device=self.device).masked_fill_(
                hidden_keys, float("-inf")
            )
            row_ids = [row for row, _ in here]
            calls.append(AttentionCall(row_ids[0], len(here), padded, mask, self._row_index(row_ids)))
            first = last
        return calls

    def _row_index(self, row_ids: list[int]) -> torch.Tensor | None:
        """The forward's rows of a call as an index, or None when they are first..first + n."""
        if row_ids == list(range(row_ids[0], row_ids[0] + len(row_ids))):
            return None
        return torch.tensor(row_ids, device=self.device)

    def _bucketed_attention(
        self, layer: int, q: torch.Tensor, calls: list[AttentionCall], out: torch.Tensor
    ) -> None:
        """Attention of the calls' rows, written into out [rows, n_heads * head_dim]."""
        s = self.shape
        scale = s.head_dim**-0.5
        for call in calls:
            if call.lengths is not None:  # the kernel's attention, on the real rows only
                q_rows = (
                    q[call.first : call.first + call.real]
                    if call.index is None
                    else q.index_select(0, call.index)
                )
                call_out = row_invariant.attention(
                    q_rows.contiguous(), self.cache.keys[layer], self.cache.values[layer], call.lengths, scale
                )
                if call.index is None:
                    out[call.first : call.first + call.real] = call_out
                else:
                    out.index_copy_(0, call.index, call_out)
                continue
            rows = call.mask.shape[0]
            if call.index is None:
                q_rows = q[call.first : call.first + call.real]
            else:
                q_rows = q.index_select(0, call.index)
            if call.real < rows:
                q_rows = torch.cat([q_rows, q_rows[:1].expand(rows - call.real, -1, -1)])
            # Heads sharing a kv head go side by side: [kv_head, group * rows, head_dim].
            q_grouped = q_rows.view(rows, s.n_kv_heads, s.group, s.head_dim).permute(1, 2, 0, 3)
            q_grouped = q_grouped.reshape(s.n_kv_heads, s.group * rows, s.head_dim)
            # One 2-D matmul per kv head: the cache slices are strided, and a batched matmul would
            # copy them first (measured: 4x slower for a 128-row prefill call).
            heads = []
            for head in range(s.n_kv_heads):
                keys = self.cache.keys[layer, head, : call.padded]
                scores = torch.mm(q_grouped[head], keys.t()).float().mul_(scale)
                # masked keys get -inf: softmax gives them exact zeros
                scores = scores.view(s.group, rows, call.padded).add_(call.mask)
                probs = torch.softmax(scores, dim=-1).to(self.dtype).view(s.group * rows, call.padded)
                values = self.cache.values[layer, head, : call.padded]
                heads.append(torch.mm(probs, values))  # [group * rows, head_dim]
            call_out = torch.stack(heads)  # [kv_head, group * rows, head_dim]
            call_out = call_out.view(s.n_kv_heads, s.group, rows, s.head_dim)[:, :, : call.real]
            call_out = call_out.permute(2, 0, 1, 3).reshape(call.real, -1)
            if call.index is None:
                out[call.first : call.first + call.real] = call_out
            else:
                out.index_copy_(0, call.index, call_out)


class _Cancelled(Exception):
    """A prefill's cancel was set in the middle of a forward."""


@dataclass(frozen=True, slots=True)
class AttentionCall:
    """Consecutive real rows whose causal prefixes pad to one key length, attended in one fixed-shape call."""

    first: int  # first row of the forward in this call
    real: int  # real rows in this call (the rest of the call's rows are padding)
    padded: int  # keys per call: a multiple of KEY_BUCKET (0 on the kernel)
    mask: torch.Tensor | None  # [call rows, padded] float32: 0 where a row may look, -inf where it must not
    index: torch.Tensor | None = None  # [real] the forward's rows in this call, when not first..first+real
    lengths: torch.Tensor | None = None  # [real] keys each row sees: set when the kernel attends


@dataclass(slots=True)
class TreePlan:
    """A token tree in one decode forward: where each node sits and which chain each node's row reads.

    Node i sits at depth[i] (the root, node 0, at 0). The tree is cut into chains that follow first
    children: `paths` holds (the root-to-leaf chain of nodes, the nodes whose rows that chain owns).
    """

    parents: list[int]  # [n]: parents[i] < i, -1 for the root
    depths: list[int]  # [n]
    paths: list[tuple[list[int], list[int]]]
    keys: list[torch.Tensor | None]  # per layer [kv_head, n, head_dim]: the nodes' keys, for accept_path
    values: list[torch.Tensor | None]
    hidden: torch.Tensor | None = None  # [n, features' width] the nodes' features (runner.features)

    @classmethod
    def of(cls, parents: Sequence[int], layers: int) -> TreePlan:
        """parents[i] < i is node i's parent; parents[0] == -1 (the root).

        >>> plan = TreePlan.of([-1, 0, 1, 0, 3], layers=1)  # root -> a -> b and root -> c -> d
        >>> plan.depths, plan.paths
        ([0, 1, 2, 1, 2], [([0, 1, 2], [0, 1, 2]), ([0, 3, 4], [3, 4])])
        """
        if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError("a token tree needs parents[0] == -1 and 0 <= parents[i] < i")
        depths = [length - 1 for length in path_lengths(parents)]
        children: list[list[int]] = [[] for _ in parents]
        for node in range(1, len(parents)):
            children[parents[node]].append(node)
        paths = []
        for node in range(len(parents)):
            if node and children[parents[node]][0] == node:
                continue  # a first child continues its parent's chain
            owned = [node]
            while children[owned[-1]]:
                owned.append(children[owned[-1]][0])
            ancestors = path_to(parents, parents[node]) if node else []
            paths.append((ancestors + owned, owned))
        return cls(list(parents), depths, paths, [None] * layers, [None] * layers)
