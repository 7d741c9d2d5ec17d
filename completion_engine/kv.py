"""A static KV cache: fixed buffers written at explicit positions.

Positions are the only record of what the cache holds, so rolling back a rejected draft costs
nothing (`truncate` moves the length), and a new request that shares a prefix with the cached
tokens keeps that prefix (`common_prefix_len`) and computes only what follows it.

Each position also records the row bucket of the forward that computed it (`row_buckets`): in exact
mode a position's bits depend on that bucket, so reuse must know it (see runner.reusable_prefix).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

KEY_BUCKET = 128  # attention keys are padded to a multiple of this (see runner.py)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    >>> common_prefix_len([1, 2, 3, 4], [1, 2, 5])
    2
    """
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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
    ) -> None:
        self.capacity = round_up(capacity, KEY_BUCKET)
        shape = (n_layers, n_kv_heads, self.capacity, head_dim)  # [layer, kv_head, position, head_dim]
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.token_ids: list[int] = []  # token at each cached position; len() is the cache length
        self.row_buckets: list[int] = []  # rows of the forward that computed each position (0: fast mode)

    def __len__(self) -> int:
        return len(self.token_ids)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [kv_head, n, head_dim] for positions start .. start + n - 1."""
        n = k.shape[1]
        if start + n > self.capacity:
            raise ValueError(f"KV cache full: {start + n} positions needed, capacity {self.capacity}")
        self.keys[layer, :, start : start + n] = k
        self.values[layer, :, start : start + n] = v

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
