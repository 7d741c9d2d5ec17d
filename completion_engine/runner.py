"""A Llama-family decoder forward that gives the same bits whichever way its rows are batched.

Why: in bf16, a position computed inside a k-token verify block goes through different GEMM and
attention kernels than the same position in a 1-token decode step, so near-tied argmaxes flip and
"speculative == plain greedy" stops being true (../shared/notes/exactness.md measures this).

How (exact mode): every forward multiplies exactly ROW_BUCKET rows, padding included, so every
Linear, norm and activation sees one shape. Attention runs per key bucket: each query row attends
to its own causal prefix of length L, keys and values padded (masked to -inf, so they add exact
zeros) to a multiple of KEY_BUCKET, in a call of ROW_BUCKET query rows. At a fixed shape a row's
result depends neither on its place in the block nor on the other rows, so the hidden state of a
position is a pure function of the tokens up to it: prefill in chunks, decode one token at a time,
verify a draft block, or reuse a cached prefix, and the logits agree to the last bit.

Fast mode (exact=False) runs the rows unpadded through SDPA: quicker prefill, used for draft
models, where exactness does not matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from completion_engine.kv import KEY_BUCKET, KVCache

ROW_BUCKET = 16  # rows per forward in exact mode: a verify block holds at most this many tokens


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # As Llama: normalise in float32, cast back, then scale.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecoderRunner:
    """Runs one decoder with its own KV cache. `extend` appends tokens and returns their logits."""

    def __init__(self, weights: DecoderWeights, exact: bool, capacity: int) -> None:
        self.w = weights
        self.shape = weights.shape
        self.exact = exact
        self.dtype = weights.embed.dtype
        self.device = weights.embed.device
        s = self.shape
        capacity = min(capacity, s.max_positions) if s.max_positions > 0 else capacity
        self.cache = KVCache(
            s.n_layers, s.n_kv_heads, s.head_dim, capacity + ROW_BUCKET, self.dtype, self.device
        )
        positions = torch.arange(self.cache.capacity, dtype=torch.float32, device=self.device)
        freqs = torch.outer(positions, weights.inv_freq.to(self.device))
        emb = torch.cat((freqs, freqs), dim=-1)  # [capacity, head_dim]
        self.cos = (emb.cos() * weights.rope_scale).to(self.dtype)
        self.sin = (emb.sin() * weights.rope_scale).to(self.dtype)
        self.forwards = 0  # forward passes run, for the stats

    @property
    def capacity(self) -> int:
        return self.cache.capacity - ROW_BUCKET

    def __len__(self) -> int:
        return len(self.cache)

    @property
    def token_ids(self) -> list[int]:
        return self.cache.token_ids

    def truncate(self, length: int) -> None:
        self.cache.truncate(length)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], all_logits: bool = False) -> torch.Tensor:
        """Append tokens after the cached ones; return float32 logits [n, vocab] (or [1, vocab] for the last).

        Exact mode runs ceil(n / ROW_BUCKET) forwards of ROW_BUCKET rows; fast mode one forward.
        """
        if not tokens:
            raise ValueError("extend needs at least one token")
        if len(self.cache) + len(tokens) > self.capacity:
            raise ValueError(
                f"context of {len(self.cache) + len(tokens)} tokens exceeds capacity {self.capacity}"
            )
        step = ROW_BUCKET if self.exact else len(tokens)
        logits = []
        for begin in range(0, len(tokens), step):
            block = list(tokens[begin : begin + step])
            last_block = begin + step >= len(tokens)
            hidden = self._forward(block)  # [rows, hidden], rows >= len(block)
            self.cache.append_tokens(block)
            if all_logits:
                logits.append(self._logits(hidden)[: len(block)])
            elif last_block:
                logits.append(self._logits(self._select_row(hidden, len(block) - 1))[:1])
        return torch.cat(logits).float()

    def _select_row(self, hidden: torch.Tensor, row: int) -> torch.Tensor:
        if not self.exact:
            return hidden[row : row + 1]
        picked = torch.zeros_like(hidden)  # keep ROW_BUCKET rows so the LM head sees its one shape
        picked[0] = hidden[row]
        return picked

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(hidden, self.w.final_norm, self.shape.rms_eps), self.w.lm_head)

    def _forward(self, tokens: list[int]) -> torch.Tensor:
        s = self.shape
        n = len(tokens)
        start = len(self.cache)
        rows = ROW_BUCKET if self.exact else n
        ids = torch.zeros(rows, dtype=torch.long, device=self.device)
        ids[:n] = torch.tensor(tokens, dtype=torch.long)
        x = F.embedding(ids, self.w.embed)  # [rows, hidden]
        pos = torch.arange(start, start + rows, device=self.device)
        cos, sin = self.cos[pos, None, :], self.sin[pos, None, :]  # [rows, 1, head_dim]
        q_size, kv_size = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
        plan = self._key_buckets(start, n) if self.exact else []
        for index, layer in enumerate(self.w.layers):
            h = rms_norm(x, layer.input_norm, s.rms_eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
            q = q.view(rows, s.n_heads, s.head_dim)
            k = k.view(rows, s.n_kv_heads, s.head_dim)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.cache.write(
                index,
                start,
                k[:n].transpose(0, 1),
                v.view(rows, s.n_kv_heads, s.head_dim)[:n].transpose(0, 1),
            )
            attn = self._attention(index, q, start, n, plan)  # [rows, n_heads * head_dim]
            x = x + F.linear(attn, layer.out)
            h = rms_norm(x, layer.post_norm, s.rms_eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        self.forwards += 1
        return x

    def _attention(
        self, layer: int, q: torch.Tensor, start: int, n: int, plan: list[KeyBucket]
    ) -> torch.Tensor:
        if self.exact:
            return self._bucketed_attention(layer, q, plan)
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

    def _key_buckets(self, start: int, n: int) -> list[KeyBucket]:
        """Which key bucket each query row of this forward attends in; the same for every layer."""
        rows = ROW_BUCKET
        # Row i attends to L_i = start + i + 1 keys; padding rows copy the first row's length.
        lengths = torch.full((rows,), start + 1, device=self.device)
        lengths[:n] = torch.arange(start + 1, start + n + 1, device=self.device)
        buckets = (lengths + KEY_BUCKET - 1) // KEY_BUCKET
        distinct = torch.unique(buckets).tolist()
        plan = []
        for bucket in distinct:
            padded = bucket * KEY_BUCKET
            hidden_keys = (
                torch.arange(padded, device=self.device)[None, :] >= lengths[:, None]
            )  # [rows, padded]
            rows_here = None if len(distinct) == 1 else (buckets == bucket).repeat(self.shape.group)
            plan.append(KeyBucket(padded, hidden_keys, rows_here))
        return plan

    def _bucketed_attention(self, layer: int, q: torch.Tensor, plan: list[KeyBucket]) -> torch.Tensor:
        s = self.shape
        rows = ROW_BUCKET
        # Heads sharing a kv head go side by side: [kv_head, group * rows, head_dim].
        q_grouped = q.view(rows, s.n_kv_heads, s.group, s.head_dim).permute(1, 2, 0, 3)
        q_grouped = q_grouped.reshape(s.n_kv_heads, s.group * rows, s.head_dim)
        scale = s.head_dim**-0.5
        out = torch.empty_like(q_grouped) if len(plan) > 1 else None
        for bucket in plan:
            keys = self.cache.keys[layer, :, : bucket.padded]  # [kv_head, padded, head_dim]
            values = self.cache.values[layer, :, : bucket.padded]
            scores = (
                torch.matmul(q_grouped, keys.transpose(1, 2)).float() * scale
            )  # [kv_head, group*rows, padded]
            scores = scores.view(s.n_kv_heads, s.group, rows, bucket.padded).masked_fill(
                bucket.hidden_keys, float("-inf")
            )
            probs = (
                torch.softmax(scores, dim=-1).to(self.dtype).view(s.n_kv_heads, s.group * rows, bucket.padded)
            )
            bucket_out = torch.matmul(probs, values)  # [kv_head, group * rows, head_dim]
            if out is None:
                out = bucket_out
            else:
                out[:, bucket.rows] = bucket_out[:, bucket.rows]
        out = out.view(s.n_kv_heads, s.group, rows, s.head_dim).permute(2, 0, 1, 3)
        return out.reshape(rows, s.n_heads * s.head_dim)


@dataclass(frozen=True, slots=True)
class KeyBucket:
    """Query rows whose causal prefix pads to the same key length attend in one fixed-shape call."""

    padded: int  # keys per call: a multiple of KEY_BUCKET
    hidden_keys: torch.Tensor  # [ROW_BUCKET, padded] True where a row must not look (masked to -inf)
    rows: torch.Tensor | None  # [group * ROW_BUCKET] the rows in this bucket; None when all rows are
