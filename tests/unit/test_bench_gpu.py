"""eval.bench_gpu's checks, run on the CPU with a tiny shape (the GPU run is the benchmark's own; a
float32 CPU runner verifies a tree in one kernel call, a GPU's chain by chain)."""

from __future__ import annotations

import torch

from completion_engine.runner import DecoderRunner
from eval import bench_gpu


def test_the_tree_check_passes_on_an_exact_runner(monkeypatch):
    monkeypatch.setitem(bench_gpu.SHAPES, "tiny", (2, 64, 4, 2, 128, 500))
    weights = bench_gpu.random_weights("tiny", torch.device("cpu"), torch.float32)
    runner = DecoderRunner(weights, exact=True, capacity=256)
    ids = list(range(1, 100))
    runner.prefill(ids[:64])
    runner.extend(ids[64:80], all_logits=True)  # as the benchmark leaves it: past the prefix
    assert bench_gpu.tree_equals_paths(runner, 64, ids[64:])
    assert len(runner) == 64  # the cache is left at the prefix
    accept_path = runner.accept_path  # a kept path's keys and values put one position off: caught
    monkeypatch.setattr(runner, "accept_path", lambda path: accept_path(path[:-1]) or runner.extend([1]))
    assert not bench_gpu.tree_equals_paths(runner, 64, ids[64:])
    monkeypatch.setattr(runner, "accept_path", accept_path)
    verify_tree = runner.verify_tree  # a verifier whose nodes get one another's logits: caught
    monkeypatch.setattr(runner, "verify_tree", lambda tokens, parents: verify_tree(tokens, parents).flip(0))
    assert not bench_gpu.tree_equals_paths(runner, 64, ids[64:])
