"""Bit-exactness at the embedded model's real shapes (SmolLM2-135M, bf16): the kernels the tiny models
never reach (576-wide rows, 1536-deep down projections, 3 kv heads) must give a position the same bits
on every path too."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

pytestmark = pytest.mark.embedded


@pytest.fixture(scope="module")
def embedded():
    from completion_engine.models import load_model

    return load_model("smollm2-135m", progress=False)


@pytest.fixture(scope="module")
def code_tokens(embedded) -> list[int]:
    return embedded.tokenizer.encode(inspect.getsource(json.decoder), add_special_tokens=False)[:700]


def runner_for(model):
    from completion_engine.runner import DecoderRunner

    return DecoderRunner(model.weights, exact=True, capacity=1024)


@pytest.mark.parametrize("prefix_len", [300, 509, 650])  # 509 + 16 crosses a key bucket
def test_verify_block_equals_decode_steps(embedded, code_tokens, prefix_len):
    runner = runner_for(embedded)
    runner.prefill(code_tokens[:prefix_len])
    block = code_tokens[prefix_len : prefix_len + 15]
    together = runner.extend(block, all_logits=True)
    runner.truncate(prefix_len)
    steps = torch.cat([runner.extend([t], all_logits=True) for t in block])
    assert torch.equal(together, steps)


def test_warm_prefill_equals_cold_after_edits(embedded, code_tokens):
    warm = runner_for(embedded)
    warm.prefill(code_tokens[:400])
    warm.extend(code_tokens[400:411], all_logits=True)
    for context in (
        code_tokens[:401],  # typed one token
        code_tokens[:200] + [13] + code_tokens[201:401],  # an edit inside a prefill block
        code_tokens[:560],  # grew across a block boundary
    ):
        warm_logits, computed = warm.prefill(context)
        cold_logits, _ = runner_for(embedded).prefill(context)
        assert torch.equal(warm_logits, cold_logits)
        assert computed < len(context)


def test_tree_nodes_equal_their_paths_decoded(embedded, code_tokens):
    # two continuations of the code, branching after 3 tokens, and a lone third branch
    start = 505  # the deeper branch crosses the key bucket at 512
    a, b = code_tokens[start : start + 9], code_tokens[start + 20 : start + 25]
    tokens = [a[0], a[1], a[2], a[3], a[4], a[5], a[6], b[0], b[1], b[2], 77]
    parents = [-1, 0, 1, 2, 3, 4, 5, 2, 7, 8, 0]
    runner = runner_for(embedded)
    runner.prefill(code_tokens[:start])
    logits = runner.verify_tree(tokens, parents)
    for node in range(len(tokens)):
        path, up = [], node
        while up >= 0:
            path.append(tokens[up])
            up = parents[up]
        steps = torch.cat([runner.extend([t], all_logits=True) for t in path[::-1]])
        runner.truncate(start)
        assert torch.equal(logits[node], steps[-1]), f"node {node}"
