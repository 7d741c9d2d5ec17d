"""Drafting with a head that reads the target's own features (EAGLE, Li et al. 2024).

The target already computed, for every position i, its last layer's output f_i (the feature its
LM head turns into the next token). The head predicts the feature one position further:

    g_i = layer(fc([embed(x_{i+1}), norm(f_i)]))      # one decoder layer, its own KV cache
    draft distribution for x_{i+2} = softmax(lm_head(final_norm(g_i)))

and goes on from its own guess (g_i in place of f_{i+1}) for the tokens after that. A head with
`feature_layers` (EAGLE-3's fused features) also reads those earlier layers' outputs at i, each
normalised on its own: fc([embed(x_{i+1}), norm(f_i), norm(l_i), norm(m_i)]); after its own guess,
which has no earlier layers, their blocks are zero. Position i of the head needs f_i, which the
target computed, and x_{i+1}, the token after it: after a verify step the runner holds features
for every kept token, and the pending token (the target's next choice) is x_{L}, so the head's
first draft token costs one head row, the rest one row each.

Greedy drafting builds a token tree (EAGLE-2): the children of a node are its most probable tokens,
a node's score is the product of the head's probabilities along its path (an estimate of its
chance to be accepted), the best nodes of each depth are expanded together in one head forward,
and the `k` highest-scoring nodes form the tree, plus as many of the next best nodes drafted at
those depths as pay for their verify rows with their scores (`extra_nodes`, from the draft budget:
such a node costs no head forward), up to the `most` nodes the step can verify. Off the
row-invariant kernel the tree verifier pays per root-to-leaf chain, so there the tree keeps at most
`max_leaves` leaves.
Sampling drafts one chain, with the head's distributions for rejection sampling.

The head's LM head covers the most frequent code tokens only (FR-Spec), as the distilled draft.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from completion_engine import row_invariant
from completion_engine.draft_budget import MODEL, best_time
from completion_engine.drafting.base import empty_draft
from completion_engine.kv import PANEL, common_prefix_len, round_down, round_up
from completion_engine.runner import (
    DecoderRunner,
    DecoderShape,
    LayerWeights,
    Linear,
    rms_norm,
    rotate_half,
    torch_linear,
)
from completion_engine.sampling import Sampler
from completion_engine.token_tree import path_lengths, path_to
from completion_engine.types import Draft

SYNC_ROWS = 256  # head rows per forward when catching up with a long context
MANY_LEAVES = 1 << 16  # no bound on a tree's leaves


@dataclass(frozen=True, slots=True)
class EagleWeights:
    """A trained head plus the target parts it borrows (embedding, final norm, LM head rows)."""

    shape: DecoderShape  # the target's shape (the head is one layer of it)
    fc: torch.Tensor  # [hidden, (2 + len(feature_layers)) * hidden]: [embedding, normed features] -> input
    feature_norm: torch.Tensor  # [(1 + len(feature_layers)) * hidden]: the last layer's, then the others'
    layer: LayerWeights
    embed: torch.Tensor  # [vocab, hidden] the target's
    final_norm: torch.Tensor  # [hidden] the target's
    head: torch.Tensor  # [subset, hidden] the target's LM head rows for vocab_map
    vocab_map: torch.Tensor  # [subset] head row -> token id
    inv_freq: torch.Tensor
    rope_scale: float
    window: int | None = None  # slots each row attends back to at most (None: all): see EagleHead
    feature_layers: tuple[int, ...] = ()  # the target's earlier layers it reads beside the last

    @property
    def feature_width(self) -> int:
        """The width of a target feature it reads (runner.features' rows)."""
        return self.shape.hidden * (1 + len(self.feature_layers))


@dataclass(frozen=True, slots=True)
class TreeSettings:
    width: int = 3  # children per expanded node, and nodes expanded per depth
    depth: int = 6  # deepest level drafted
    max_leaves: int = 3  # root-to-leaf chains in the kept tree (off the kernel, each costs attention calls)

    @classmethod
    def for_verifier(cls, one_call: bool) -> TreeSettings:
        """The defaults where the verifier checks a whole tree in one call a layer (the kernel's):
        there a leaf costs what any node does, so the leaves are not counted."""
        return cls(max_leaves=MANY_LEAVES) if one_call else cls()


def head_linear(weight: torch.Tensor, bias: torch.Tensor | None, packed: bool) -> Linear:
    """x -> x @ weight.T, on the row-invariant kernel's panels when `packed`, else torch's.

    A draft token is one row: it streams every weight once, so it runs at memory speed on the
    kernel's packed panels, in bf16 (half the bytes; the LM head rows borrowed from the target are
    rounded too). Measured on the embedded target's head at a 2,000-slot context, two threads, a
    token with its logits: torch's float32 1-row matmuls 3.5 ms, float32 panels 1.3 ms, bf16 panels
    0.87 ms, against an 18 ms target step. The draft's bits need not match anything: verification
    keeps the output exact. Under the amx numerics the panels are in AMX tile order, which other
    numerics refuse: a head is built and used under one numerics, as the target's runner is.
    """
    if packed:
        return row_invariant.pack(weight.bfloat16().float(), bias, bf16=True, amx_order=True)
    return torch_linear(weight, bias)


@dataclass(frozen=True, slots=True)
class HeadLinears:
    """The head's Linears as callables (see head_linear)."""

    fc: Linear
    fc_guess: Linear  # fc's first two blocks: a guess's input, whose earlier layers' blocks are zero
    qkv: Linear
    out: Linear
    gate_up: Linear
    down: Linear
    head: Linear

    @classmethod
    def of(cls, w: EagleWeights, packed: bool) -> HeadLinears:
        layer = w.layer
        fc = head_linear(w.fc, None, packed)
        guess_inputs = 2 * w.shape.hidden
        if not w.feature_layers:
            fc_guess = fc
        elif isinstance(fc, row_invariant.PackedLinear) and fc.splits_at(guess_inputs):
            fc_guess = fc.first_inputs(guess_inputs)  # fc's own panels: a step streams them once
        else:
            fc_guess = head_linear(w.fc[:, :guess_inputs], None, packed)
        return cls(
            fc=fc,
            fc_guess=fc_guess,
            qkv=head_linear(layer.qkv, layer.qkv_bias, packed),
            out=head_linear(layer.out, None, packed),
            gate_up=head_linear(layer.gate_up, None, packed),
            down=head_linear(layer.down, None, packed),
            head=head_linear(w.head, None, packed),
        )


class EagleHead:
    """The head's layer with its own KV cache; a slot per head position (tree nodes after the context).

    With a `window` (the span it was trained on), a row attends back to the slots from
    `view_start(position)` on: the window's first slot rounded down to a panel of PANEL slots (so a
    row sees `window` to `window` + PANEL - 1 slots back; the kernel reads its cache from a panel's
    start). Why a window: a head trained on 512-token windows never saw keys further back; at the
    engine's ~2,000-token prompts its first-token agreement with the target (6 completion points
    of the bench in `email`, 191 tokens) was 39.3% attending to everything and 49.2% within 512
    (`http`: 39.3% and 44.9%). It also keeps a long catch-up's attention cheap.

    Where the Linears are packed (the row-invariant kernel), the layer is one kernel call
    (row_invariant.layer: the target's own) over a cache in the kernel's panel layout, in the
    target cache's dtype (row_invariant.cache_dtype: bf16 for bf16 panels); elsewhere torch's ops and SDPA.
    """

    def __init__(self, weights: EagleWeights, capacity: int, packed: bool | None = None) -> None:
        """packed: the Linears, norms, rotary and silu on the row-invariant kernel (None: wherever that
        kernel is usable)."""
        self.w = weights
        if packed is None:
            packed = row_invariant.usable(weights.embed.dtype, weights.embed.device)
        self.linears = HeadLinears.of(weights, packed)
        self.packed = packed
        s = weights.shape
        self.capacity = round_up(capacity, 128)
        device, dtype = weights.embed.device, weights.embed.dtype
        if packed:  # the kernel's panel layout (kv.KVCache's, one layer)
            lin = self.linears
            self.panels = row_invariant.LayerPanels.of((lin.qkv, lin.out, lin.gate_up, lin.down))
            cache = row_invariant.cache_dtype(linears_bf16=True, head_dim=s.head_dim)
            value_panels = -(-s.head_dim // PANEL)
            self.keys = torch.zeros(s.n_kv_heads, self.capacity // PANEL, s.head_dim, PANEL, dtype=cache)
            self.values = torch.zeros(s.n_kv_heads, value_panels, self.capacity, PANEL, dtype=cache)
        else:
            self.keys = torch.zeros(s.n_kv_heads, self.capacity, s.head_dim, dtype=dtype, device=device)
            self.values = torch.zeros_like(self.keys)
        positions = torch.arange(self.capacity, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, weights.inv_freq.to(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * weights.rope_scale).to(dtype)
        self.sin = (emb.sin() * weights.rope_scale).to(dtype)
        self.tokens: list[int] = []  # x_0 .. x_n: slot i holds the pair (f_i, x_{i+1})
        self.length = 0  # slots in use
        self.first = 0  # slots before it were not computed (see EagleDrafter._sync); a multiple of PANEL

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)
        if self.length < self.first:  # below `first` nothing was computed: nothing is now
            self.first = self.length = round_down(self.length, PANEL)

    def restart(self, first: int) -> None:
        """Compute from slot `first` (a multiple of PANEL) on: the slots before it count as never computed."""
        if first % PANEL:
            raise ValueError(f"the head's first computed slot must be a multiple of {PANEL}, not {first}")
        self.first = self.length = first

    def view_start(self, position: int) -> int:
        """The first slot a causal row at `position` attends to: `first`, or its window's panel."""
        if self.w.window is None:
            return self.first
        return max(self.first, round_down(max(0, position - self.w.window + 1), PANEL))

    def tree_view(self, root: int, positions: Sequence[int]) -> int:
        """The first slot a tree's rows attend to: the view of the lowest position, at most the panel
        holding `root` (a window shorter than the tree is deep sees the context's last slots still)."""
        return min(self.view_start(min(positions)), round_down(root, PANEL))

    def forward(
        self,
        features: torch.Tensor,
        tokens: Sequence[int],
        positions: Sequence[int],
        tree: tuple[int, Sequence[int]] | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Predicted next features g [n, hidden] of n new slots appended after `length`.

        features [n, feature_width]: the target's features per row, or [n, hidden]: a parent's g (the
        earlier layers' blocks are then zero); positions: each row's sequence position.
        tree (root, parents): the slots from `root` to the new ones' last are a token forest, slot
        root + j's parent at root + parents[j] (-1: none); the new rows are its last nodes, and each
        attends to the slots before `root` and to its own path (all rows from tree_view's slot).
        None: causal, each row to every earlier slot from its view_start on.
        last_only: only the last row's g is returned ([1, hidden]), and on the kernel only it goes
        past attention; every row's keys and values are written (a catch-up, which drafts from its
        last slot only; its first row must lie at or after the last row's view_start).
        """
        w = self.w
        n, start = len(tokens), self.length
        if start + n > self.capacity:
            raise ValueError(f"draft head cache full: {start + n} slots, capacity {self.capacity}")
        if tree is not None and last_only:
            raise ValueError("a head tree computes every row: last_only is for causal catch-up blocks")
        if tree is not None and (tree[0] < self.first or tree[0] + len(tree[1]) != start + n):
            raise ValueError(
                f"a head tree's nodes must be the slots from its root ({tree[0]}, at or after the first "
                f"computed, {self.first}) to the new rows' last ({start + n - 1})"
            )
        if last_only and self.view_start(positions[-1]) > start:  # (_sync's blocks never are)
            raise ValueError("a catch-up block must start at or after its last row's view")
        ids = torch.tensor(tokens, dtype=torch.long, device=features.device)
        # a guess (a parent's g, no earlier layers) goes through fc's first two blocks only: the
        # rest would multiply zeros (the same sums, without the zeros' copy and products)
        guess = features.shape[1] < w.feature_width
        features = normed_features(features, w, self.norm if self.packed else None, pad=not guess)
        fc = self.linears.fc_guess if guess else self.linears.fc
        x = fc(torch.cat([F.embedding(ids, w.embed), features], -1))
        positions = list(positions)
        if self.packed:
            out = self._kernel_layer(x, positions, tree, last_only)
        else:
            out = self._torch_layer(x, positions, tree)
            out = out[-1:] if last_only else out
        self.length = start + n
        return out

    def _kernel_layer(
        self, x: torch.Tensor, positions: list[int], tree: tuple[int, Sequence[int]] | None, last_only: bool
    ) -> torch.Tensor:
        """The layer of rows x at slots length .. on the kernel: a tree or a catch-up block in one call,
        other causal rows in one call per run of rows that share a view."""
        n, start = len(positions), self.length
        pos = torch.tensor(positions, dtype=torch.long)
        cos, sin = self.cos[pos], self.sin[pos]
        if tree is not None:
            root, parents = tree
            view = self.tree_view(root, positions)
            lengths = [root - view + length for length in path_lengths(parents)[len(parents) - n :]]
            nodes = torch.tensor(list(parents), dtype=torch.long)
            return self._run_layer(x, cos, sin, view, root - view, lengths, (0, n), nodes)
        if last_only:
            view = self.view_start(positions[-1])
            lengths = [start + i + 1 - view for i in range(n)]
            return self._run_layer(x, cos, sin, view, start - view, lengths, (n - 1, n))
        outputs, row = [], 0
        while row < n:  # rows whose view starts at the same slot go together
            view = self.view_start(positions[row])
            end = row + 1
            while end < n and self.view_start(positions[end]) == view:
                end += 1
            lengths = [start + i + 1 - view for i in range(row, end)]
            part = slice(row, end)
            outputs.append(
                self._run_layer(
                    x[part], cos[part], sin[part], view, start + row - view, lengths, (0, end - row)
                )
            )
            row = end
        return torch.cat(outputs) if len(outputs) > 1 else outputs[0]

    def _run_layer(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        view: int,
        first_slot: int,
        lengths: list[int],
        computed: tuple[int, int],
        parents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One kernel call over the cache from slot `view` on (a panel's start): rows x written from
        `first_slot` there (a tree's: its first node), each seeing `lengths` slots of the view;
        rows computed[0] .. computed[1] - 1 go on past attention."""
        s, layer = self.w.shape, self.w.layer
        return row_invariant.layer(
            x,
            (layer.input_norm, layer.post_norm),
            s.rms_eps,
            self.panels,
            (cos, sin),
            (s.n_heads, s.n_kv_heads),
            (self.keys[:, view // PANEL :], self.values[:, :, view:]),
            first_slot,
            torch.tensor(lengths, dtype=torch.long),
            s.head_dim**-0.5,
            computed,
            parents,
        )

    def _torch_layer(
        self, x: torch.Tensor, positions: list[int], tree: tuple[int, Sequence[int]] | None
    ) -> torch.Tensor:
        """The layer of rows x at slots length .. with torch's ops, the same attention as _kernel_layer."""
        w, s = self.w, self.w.shape
        n, start = len(positions), self.length
        end = start + n
        lin, norm, layer = self.linears, self.norm, w.layer
        pos = torch.tensor(positions, dtype=torch.long, device=x.device)
        q_size, kv_size = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        qkv = lin.qkv(norm(x, layer.input_norm))
        q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
        q = q.view(n, s.n_heads, s.head_dim)
        k = k.view(n, s.n_kv_heads, s.head_dim)
        v = v.view(n, s.n_kv_heads, s.head_dim)
        cos, sin = self.cos[pos, None, :], self.sin[pos, None, :]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        self.keys[:, start:end] = k.transpose(0, 1)
        self.values[:, start:end] = v.transpose(0, 1)
        visible = torch.zeros(n, end, dtype=torch.bool)
        if tree is None:
            for row, position in enumerate(positions):
                visible[row, self.view_start(position) : start + row + 1] = True
        else:
            root, parents = tree
            visible[:, self.tree_view(root, positions) : root] = True
            for row in range(n):
                visible[row, [root + node for node in path_to(parents, len(parents) - n + row)]] = True
        if tree is None:
            first = min(self.view_start(position) for position in positions)
        else:
            first = self.tree_view(tree[0], positions)
        mask = None if n == 1 and tree is None else visible[:, first:].to(x.device)
        attn = (
            F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                self.keys[None, :, first:end],
                self.values[None, :, first:end],
                attn_mask=mask,
                enable_gqa=s.group > 1,
            )[0]
            .transpose(0, 1)
            .reshape(n, q_size)
        )
        x = x + lin.out(attn)
        gate, up = lin.gate_up(norm(x, layer.post_norm)).chunk(2, dim=-1)
        return x + lin.down(F.silu(gate) * up)

    def logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """float32 logits over the head's subset [n, subset] for predicted features [n, hidden]."""
        return self.linears.head(self.norm(predicted, self.w.final_norm)).float()

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMS norm of x's rows [..., hidden] (on the kernel, one call, where the Linears are packed)."""
        if not self.packed:
            return rms_norm(x, weight, self.w.shape.rms_eps)
        return row_invariant.rms_norm(x.reshape(-1, x.shape[-1]), weight, self.w.shape.rms_eps).view(x.shape)


def normed_features(
    features: torch.Tensor,
    w: EagleWeights,
    norm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    pad: bool = True,
) -> torch.Tensor:
    """features [n, feature_width] or [n, hidden] (a guess: the rest zero), each block RMS-normalised
    (by `norm`, default torch's); pad=False leaves a guess's zero blocks off."""
    n, hidden = features.shape[0], w.shape.hidden
    blocks = features.shape[1] // hidden
    norms = w.feature_norm.view(-1, hidden)
    if norm is None:
        normed = rms_norm(features.view(n, blocks, hidden), norms[:blocks], w.shape.rms_eps).view(n, -1)
    elif blocks == 1:  # one block: its own weights in the norm call
        normed = norm(features, norms[0])
    else:  # unit weights, then each block's own: one norm call for every block
        ones = torch.ones(hidden, dtype=features.dtype, device=features.device)
        normed = (
            norm(features.reshape(n * blocks, hidden), ones).view(n, blocks, hidden) * norms[:blocks]
        ).view(n, -1)
    if blocks == len(norms) or not pad:
        return normed
    return torch.cat([normed, normed.new_zeros(n, (len(norms) - blocks) * hidden)], -1)


class EagleDrafter:
    """Drafts from the target runner's features with an EagleHead (see the module docstring)."""

    source = MODEL

    def __init__(
        self,
        runner: DecoderRunner,
        weights: EagleWeights,
        min_prob: float,
        tree: TreeSettings | None,
        size: Callable[[int], int] | None = None,
        extra_nodes: Callable[[int, list[float]], int] | None = None,
    ) -> None:
        if runner.features is None or runner.feature_layers != weights.feature_layers:
            raise ValueError(
                "the EAGLE head needs a target runner built with keep_features=True and "
                f"feature_layers={weights.feature_layers}"
            )
        self.runner = runner
        # on the kernel exactly where the target's runner is (a float32 runner forced onto torch too)
        self.head = EagleHead(weights, runner.cache.capacity, packed=runner.row_invariant_kernel)
        self.vocab_map = weights.vocab_map
        self._token_of = weights.vocab_map.tolist()  # head row -> token id, without a tensor index per node
        self.target_vocab = runner.shape.vocab
        self.min_prob = min_prob
        self.tree = tree
        self.size = size  # most -> how many tokens (tree levels and nodes) to draft now (None: most)
        # (nodes kept, the next best nodes' chances) -> how many of those pay (None: no nodes past size's)
        self.extra_nodes = extra_nodes

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int, sampler: Sampler | None = None) -> Draft:
        most = k
        if self.size is not None:
            k = self.size(k)
        committed = len(self.runner)  # positions with target features; context[committed] is pending
        if k <= 0 or len(context) != committed + 1:
            return empty_draft(self.source)
        predicted = self._sync(context, committed)
        if predicted is None:  # no features to draft from (see _sync)
            return empty_draft(self.source)
        try:
            if sampler is not None:
                return self._chain(predicted, committed, k, sampler)
            # a tree where it can hold more than one node: k levels, or k = 1 and siblings past it
            if self.tree is not None and (k > 1 or (self.extra_nodes is not None and most > k)):
                return self._tree(predicted, committed, k, most, self.tree)
            return self._chain(predicted, committed, k, None)
        finally:
            self.head.truncate(committed)  # drop the drafted slots: they used guessed features

    @torch.inference_mode()
    def warm(self, context: Sequence[int], cancel: threading.Event | None = None) -> None:
        """Catch the head up with a context the target has just prefilled (all but its last pair)."""
        if cancel is not None and cancel.is_set():
            return
        if len(self.runner) == len(context) and len(context) > 1:
            self._sync(context, len(context) - 1, cancel)

    @torch.inference_mode()
    def token_seconds(self) -> float:
        """The best time of one head step and its logits: what drafting is priced by."""
        head = self.head
        embed = head.w.embed
        features = torch.zeros(1, head.w.feature_width, dtype=embed.dtype, device=embed.device)

        def token() -> None:
            head.logits(head.forward(features, [0], [0]))
            if features.device.type == "cuda":
                torch.cuda.synchronize()  # time the work, not its launch (as the target's step is)
            head.truncate(0)

        seconds = best_time(token)
        head.tokens = []
        return seconds

    def _sync(
        self, context: Sequence[int], slots: int, cancel: threading.Event | None = None
    ) -> torch.Tensor | None:
        """Bring the head's slots to pairs 0 .. slots - 1 of context; the last slot's g [1, hidden].

        A set `cancel` stops between blocks of SYNC_ROWS (None then; the slots done are kept). None
        too, and no draft this step, where the target kept no features from any panel start before
        the last slot on (a context cut back to just past where a prefill's feature window began:
        drafting resumes once the slots pass the next panel's start, up to PANEL steps on).
        """
        head = self.head
        keep = max(0, min(common_prefix_len(head.tokens, context[: slots + 1]) - 1, head.length, slots - 1))
        # A windowed head's last row sees from its view_start on, so older slots need not be
        # computed (after a cold 2,000-token prefill: ~512 head rows, not 2,000). A slot's keys and
        # values depend on its own pair only, so the rows computed here are right even where they
        # look back at slots that were not: only the last row's output is used.
        window = head.w.window
        needed = 0 if window is None else round_down(max(0, slots - window), PANEL)  # view_start(slots - 1)
        # ... and where the target kept no features (a prefill with a feature window), the head
        # starts at the first panel after the last position without (it then looks back less far)
        missing = (~self.runner.features_valid[needed:slots]).nonzero()
        if len(missing):  # never the last slot: the runner's feature window is wider (engine.py)
            needed = round_up(needed + int(missing[-1]) + 1, PANEL)
            if needed > slots - 1:  # no panel start with features before the last slot: no draft
                return None
        if keep < needed or needed < head.first:  # a gap before `keep`, or slots never computed
            head.restart(needed)
        else:
            head.truncate(keep)
        head.tokens = list(context[: slots + 1])
        predicted = None
        for begin in range(head.length, slots, SYNC_ROWS):
            if cancel is not None and cancel.is_set():
                return None
            end = min(slots, begin + SYNC_ROWS)
            predicted = head.forward(
                self.runner.features[begin:end],
                context[begin + 1 : end + 1],
                range(begin, end),
                last_only=True,
            )
        return predicted

    def _chain(self, predicted: torch.Tensor, committed: int, k: int, sampler: Sampler | None) -> Draft:
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        position = committed
        while True:
            logits = self.head.logits(predicted)[0]
            probs = sampler.probs(logits) if sampler else torch.softmax(logits, dim=-1)
            row = sampler.sample(probs) if sampler else int(probs.argmax())
            if sampler is None and float(probs[row]) < self.min_prob and tokens:
                break
            token = self._token_of[row]
            tokens.append(token)
            if sampler is not None:
                dists.append(self._over_target_vocab(probs))
            if len(tokens) == k:
                break
            predicted = self.head.forward(predicted, [token], [position])
            position += 1
        return Draft(tokens=tokens, probs=torch.stack(dists) if dists else None, source=self.source)

    def _tree(
        self, predicted: torch.Tensor, committed: int, k: int, most: int, settings: TreeSettings
    ) -> Draft:
        # node: (token, parent node or -1, log score, depth); grown depth by depth
        nodes: list[tuple[int, int, float, int]] = []
        slot_of: dict[int, int] = {}  # expanded node -> its head slot
        frontier = [-1]  # the nodes whose children the next level drafts (-1: the pending token's slot)
        outputs = predicted  # [len(frontier), hidden]: g after each frontier node
        levels = min(settings.depth, k)  # k nodes reach no deeper than k: deeper levels would be paid and cut
        for depth in range(1, levels + 1):
            top = torch.log_softmax(self.head.logits(outputs), dim=-1).topk(settings.width, dim=-1)
            children = []  # (node, the row of its parent in outputs)
            for row, (parent, logps, head_rows) in enumerate(
                zip(frontier, top.values.tolist(), top.indices.tolist(), strict=True)
            ):
                base = nodes[parent][2] if parent >= 0 else 0.0
                for logp, head_row in zip(logps, head_rows, strict=True):
                    nodes.append((self._token_of[head_row], parent, base + logp, depth))
                    children.append((len(nodes) - 1, row))
            if depth == levels:
                break
            chosen = heapq.nlargest(settings.width, children, key=lambda child: nodes[child[0]][2])
            frontier = [node for node, _ in chosen]
            outputs = self._expand(frontier, outputs[[row for _, row in chosen]], nodes, slot_of, committed)
        return self._best_subtree(nodes, k, settings.max_leaves, most, self.extra_nodes)

    def _expand(
        self,
        frontier: list[int],
        inputs: torch.Tensor,
        nodes: list[tuple[int, int, float, int]],
        slot_of: dict[int, int],
        committed: int,
    ) -> torch.Tensor:
        """Run the head on the frontier's nodes in one forward, from their parents' g (`inputs`, in
        frontier order): each sees the context and its ancestors. -> their g, in frontier order."""
        start = self.head.length
        for row, node in enumerate(frontier):
            slot_of[node] = start + row
        # the expanded nodes, in their slots from `committed` on: a forest under the pending token
        parents = [-1] * (start + len(frontier) - committed)
        for node, slot in slot_of.items():
            parent = nodes[node][1]
            parents[slot - committed] = slot_of[parent] - committed if parent >= 0 else -1
        return self.head.forward(
            inputs,
            [nodes[node][0] for node in frontier],
            [committed + nodes[node][3] - 1 for node in frontier],
            tree=(committed, parents),
        )

    def _best_subtree(
        self,
        nodes: list[tuple[int, int, float, int]],
        k: int,
        max_leaves: int,
        most: int = 0,
        extra_nodes: Callable[[int, list[float]], int] | None = None,
    ) -> Draft:
        """The k best-scoring nodes (a parent scores at least its child) with at most max_leaves leaves,
        then, up to `most` nodes in all, as many of the next best as extra_nodes(k, their scores as
        chances) says pay (None: none)."""
        kept: list[int] = []
        kept_set: set[int] = set()
        leaves = 0
        limit = max(k, most) if extra_nodes is not None else k
        for node in sorted(range(len(nodes)), key=lambda n: (-nodes[n][2], nodes[n][3])):
            parent = nodes[node][1]
            if parent >= 0 and parent not in kept_set:
                continue
            new_leaf = parent < 0 or any(nodes[other][1] == parent for other in kept)
            if new_leaf and leaves >= max_leaves:
                continue
            leaves += new_leaf
            kept.append(node)
            kept_set.add(node)
            if len(kept) == limit:
                break
        if extra_nodes is not None and len(kept) > k:  # the k best, and the extras that pay
            kept = kept[: k + extra_nodes(k, [math.exp(nodes[n][2]) for n in kept[k:]])]
        kept.sort(key=lambda n: (nodes[n][3], n))  # parents before children
        index = {node: i for i, node in enumerate(kept)}
        return Draft(
            tokens=[nodes[n][0] for n in kept],
            probs=None,
            source=self.source,
            parents=[index[nodes[n][1]] if nodes[n][1] >= 0 else -1 for n in kept],
        )

    def _over_target_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """q over the target's vocabulary: tokens outside the head's subset get probability 0."""
        full = torch.zeros(self.target_vocab, dtype=probs.dtype, device=probs.device)
        return full.scatter(0, self.vocab_map.to(probs.device), probs)
