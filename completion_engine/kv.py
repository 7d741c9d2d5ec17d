"""A static KV cache: fixed buffers written at explicit positions.

Positions are the only record of what the cache holds, so rolling back a rejected draft costs
nothing (`truncate` moves the length), and a new request that shares a prefix with the cached
tokens keeps that prefix (`common_prefix_len`) and computes only what follows it.

Each position also records the row bucket of the forward that computed it (`row_buckets`): in exact
mode on torch's kernels a position's bits depend on that bucket, so reuse must know it (see
runner.reusable_prefix); on the row-invariant kernel they do not (runner.ANY_ROWS).

With `panels`, keys and values are kept in the layout row_invariant's kernel multiplies, so that
attention scores (q @ keys.T) and outputs (probs @ values) run on it: keys in panels of PANEL
positions, [layer, kv_head, capacity / PANEL, head_dim, PANEL]; values in panels of PANEL dims,
[layer, kv_head, ceil(head_dim / PANEL), capacity, PANEL] (zero past head_dim). In float32, or in
bfloat16 where the kernel's Linears have bf16 panels (row_invariant.cache_dtype): keys and values
rounded as they are written, half the bytes a step reads; attention on AMX tiles, with vdpbf16ps,
or (the float32 numerics) the fma chains over the widened values.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F

KEY_BUCKET = 128  # attention keys are padded to a multiple of this (see runner.py)
PANEL = 32  # positions (keys) or dims (values) per panel in the panel layout: row_invariant.PANEL
assert KEY_BUCKET % PANEL == 0


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def round_down(n: int, multiple: int) -> int:
    return n // multiple * multiple


PREFIX_SCAN = 32  # common_prefix_len scans its last span element by element


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (lists, tuples or ranges of ints:
    slices whose == is one bool, not numpy arrays or tensors).

    >>> common_prefix_len([1, 2, 3, 4], [1, 2, 5])
    2
    """
    n = min(len(a), len(b))
    # slices compared in C, halving towards the first difference: the common case, one sequence
    # extending the other, costs one comparison rather than n steps of a Python loop
    if _equal(a, b, 0, n):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], and they differ somewhere in [lo, hi)
    while hi - lo > PREFIX_SCAN:
        mid = (lo + hi) // 2
        if _equal(a, b, lo, mid):
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo


def _equal(a: Sequence[int], b: Sequence[int], lo: int, hi: int) -> bool:
    x, y = a[lo:hi], b[lo:hi]
    return x == y if type(x) is type(y) else list(x) == list(y)


class KVCache:
    """Keys and values of every layer for the tokens in `token_ids`, in preallocated buffers."""

    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        panels: bool = False,
    ) -> None:
        self.capacity = round_up(capacity, KEY_BUCKET)
        self.panels = panels
        if panels:
            key_shape = (n_layers, n_kv_heads, self.capacity // PANEL, head_dim, PANEL)
            value_shape = (n_layers, n_kv_heads, -(-head_dim // PANEL), self.capacity, PANEL)
        else:  # [layer, kv_head, position, head_dim]
            key_shape = value_shape = (n_layers, n_kv_heads, self.capacity, head_dim)
        self.keys = torch.zeros(key_shape, dtype=dtype, device=device)
        self.values = torch.zeros(value_shape, dtype=dtype, device=device)
        self.token_ids: list[int] = []  # token at each cached position; len() is the cache length
        self.row_buckets: list[int] = []  # rows of the forward that computed each position (0: fast mode)

    def __len__(self) -> int:
        return len(self.token_ids)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [kv_head, n, head_dim] for positions start .. start + n - 1."""
        n = k.shape[1]
        if n == 0:
            return
        if start + n > self.capacity:
            raise ValueError(f"KV cache full: {start + n} positions needed, capacity {self.capacity}")
        if not self.panels:
            self.keys[layer, :, start : start + n] = k
            self.values[layer, :, start : start + n] = v
            return
        position = start
        while position < start + n:  # keys: each panel's slice of positions, transposed
            panel, column = divmod(position, PANEL)
            end = min(start + n, (panel + 1) * PANEL)
            part = k[:, position - start : end - start]  # [kv_head, positions, head_dim]
            self.keys[layer, :, panel, :, column : column + end - position] = part.transpose(1, 2)
            position = end
        kv_heads, _, head_dim = v.shape
        padded = F.pad(v, (0, self.values.shape[2] * PANEL - head_dim))  # values: dims in panels
        self.values[layer, :, :, start : start + n] = padded.view(kv_heads, n, -1, PANEL).transpose(1, 2)

    def gather(self, start: int, positions: Sequence[int]) -> None:
        """Every layer's keys and values at `positions` copied to start, start + 1, ... (one copy each).

        positions rise from `start` on (a tree's kept path moving up to where plain decoding keeps
        it), so copying them in order reads each source before anything overwrites it. One slice
        copy a position and a tensor (on the CPU ~15 us each, against ~100 us for one advanced-index
        gather of two positions).
        """
        if not positions:
            return
        if start + len(positions) > self.capacity:
            raise ValueError(
                f"KV cache full: {start + len(positions)} positions needed, capacity {self.capacity}"
            )
        if positions[0] < start or any(later <= earlier for earlier, later in pairwise(positions)):
            raise ValueError(f"gather moves rising positions up to {start}..: got {list(positions)}")
        for target, source in enumerate(positions, start=start):
            if target == source:
                continue
            if not self.panels:
                self.keys[:, :, target] = self.keys[:, :, source]
                self.values[:, :, target] = self.values[:, :, source]
                continue
            # keys: a position is (panel, column) in dims 2 and 4; values: the position is dim 3
            self.keys[:, :, target // PANEL, :, target % PANEL] = self.keys[
                :, :, source // PANEL, :, source % PANEL
            ]
            self.values[:, :, :, target] = self.values[:, :, :, source]

    def append_tokens(self, tokens: Sequence[int], row_bucket: int) -> None:
        self.token_ids.extend(tokens)
        self.row_buckets.extend([row_bucket] * len(tokens))

    def truncate(self, length: int) -> None:
        """Forget every position >= length. Stale buffer contents stay but are always masked out."""
        if length < len(self.token_ids):
            del self.token_ids[length:]
            del self.row_buckets[length:]

    def reset(self) -> None:
        self.token_ids.clear()
        self.row_buckets.clear()
