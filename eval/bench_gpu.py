"""GPU check of the exact runner on random models shaped like real 1.5B and 7B code models.

Measures, per shape: the cost of verifying k tokens against one decode step, whether a verify
block gives the same bits as decoding its tokens one at a time (exact and fast mode), whether the
logits after a KV rollback equal those of a fresh prefill, and (exact mode) whether each node of a
verified token tree gets the bits of decoding its path, and a kept path's next step those of plain
decoding. No weights are downloaded: the
tensors are random, drawn on the device.

    python -m eval.bench_gpu [--shapes 1.5b,7b] [--prefix 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from completion_engine.runner import DECODE_ROWS, DecoderRunner, DecoderShape, DecoderWeights, LayerWeights
from completion_engine.token_tree import path_to

# Qwen2.5-Coder shapes (config.json of the public checkpoints): layers, hidden, heads, kv heads, ffn, vocab
SHAPES = {
    "1.5b": (28, 1536, 12, 2, 8960, 151936),
    "7b": (28, 3584, 28, 4, 18944, 152064),
}


def random_weights(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> DecoderWeights:
    layers, hidden, heads, kv_heads, ffn, vocab = SHAPES[name]
    head_dim = hidden // heads
    generator = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int, scale: float = 0.02) -> torch.Tensor:
        values = torch.randn(*shape, generator=generator, device=device, dtype=torch.float32)
        return (values * scale).to(dtype)

    ones = torch.ones(hidden, device=device, dtype=dtype)
    qkv_rows = (heads + 2 * kv_heads) * head_dim
    layer_weights = tuple(
        LayerWeights(
            input_norm=ones,
            qkv=rand(qkv_rows, hidden),
            qkv_bias=rand(qkv_rows),
            out=rand(hidden, heads * head_dim),
            post_norm=ones,
            gate_up=rand(2 * ffn, hidden),
            down=rand(hidden, ffn),
        )
        for _ in range(layers)
    )
    shape = DecoderShape(layers, hidden, heads, kv_heads, head_dim, vocab, 1e-6, 32768)
    inv_freq = 1.0 / (1_000_000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    embed = rand(vocab, hidden, scale=1.0)
    return DecoderWeights(shape, embed, layer_weights, ones, rand(vocab, hidden), inv_freq, 1.0)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of fn() over repeats, synchronising the device."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure_shape(name: str, device: torch.device, dtype: torch.dtype, prefix: int, repeats: int) -> dict:
    weights = random_weights(name, device, dtype)
    vocab = weights.shape.vocab
    ids = torch.randint(
        0, vocab, (prefix + DECODE_ROWS,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    row = {"shape": name, "prefix": prefix}
    for exact in (True, False):
        mode = "exact" if exact else "fast"
        runner = DecoderRunner(weights, exact=exact, capacity=prefix + 64)
        row[f"{mode}_prefill_s"] = timed(lambda r=runner: (r.truncate(0), r.prefill(ids[:prefix])), device, 1)
        costs = {}
        for k in (1, 2, 4, 8, 16):

            def verify(k=k, r=runner) -> None:
                r.truncate(prefix)
                r.extend(ids[prefix : prefix + k], all_logits=True)

            verify()  # warm-up
            costs[k] = timed(verify, device, repeats)
        row[f"{mode}_verify_ms"] = {k: round(v * 1e3, 3) for k, v in costs.items()}
        row[f"{mode}_verify_cost_vs_step"] = {k: round(v / costs[1], 3) for k, v in costs.items()}
        runner.truncate(prefix)
        block = runner.extend(ids[prefix:], all_logits=True)
        runner.truncate(prefix)
        steps = torch.cat([runner.extend([t], all_logits=True) for t in ids[prefix:]])
        row[f"{mode}_verify_equals_decode"] = bool(torch.equal(block, steps))
        row[f"{mode}_max_abs_diff"] = float((block - steps).abs().max())
        row[f"{mode}_argmax_agree"] = float((block.argmax(-1) == steps.argmax(-1)).float().mean())
        # KV rollback: draft 12 junk tokens, roll back, then the real ones == a fresh prefill's
        runner.truncate(prefix)
        runner.extend(torch.randint(0, vocab, (12,)).tolist(), all_logits=True)
        runner.truncate(prefix)
        after = runner.extend(ids[prefix:], all_logits=True)
        row[f"{mode}_rollback_exact"] = bool(torch.equal(after, block))
        if exact:
            row["exact_tree_equals_paths"] = tree_equals_paths(runner, prefix, ids[prefix:])
        del runner
    del weights
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


TREES = ([-1, 0, 1, 0, 3, 4, 0], [-1, 0, 0, 0, 1, 2, 3, 1, 5, 4, 9])  # parents: a small and a wide tree


def tree_equals_paths(runner: DecoderRunner, prefix: int, tokens: list[int]) -> bool:
    """Whether every node of a verified token tree gets the logits of decoding its root-to-node path
    one token at a time after the same prefix, and whether keeping the deepest node's path
    (accept_path) and decoding one more token gives the logits plain decoding gives there (the
    runner's first `prefix` cached tokens; the cache is left there)."""
    for parents in TREES:
        runner.truncate(prefix)
        nodes = tokens[: len(parents)]
        tree_logits = runner.verify_tree(nodes, parents)
        runner.truncate(prefix)
        for node in range(len(parents)):
            steps = [runner.extend([nodes[n]], all_logits=True) for n in path_to(parents, node)]
            runner.truncate(prefix)
            if not torch.equal(steps[-1][0], tree_logits[node]):
                return False
        kept, following = path_to(parents, len(parents) - 1), tokens[len(parents)]
        runner.verify_tree(nodes, parents)
        runner.accept_path(kept)
        after_tree = runner.extend([following], all_logits=True)
        runner.truncate(prefix)
        for n in kept:
            runner.extend([nodes[n]], all_logits=True)
        plain = runner.extend([following], all_logits=True)
        runner.truncate(prefix)
        if not torch.equal(after_tree, plain):
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="1.5b,7b")
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}", flush=True)
    rows = []
    for name in args.shapes.split(","):
        row = measure_shape(name, device, torch.bfloat16, args.prefix, args.repeats)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
