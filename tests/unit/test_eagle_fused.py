"""An EAGLE head that also reads earlier layers of the target (EAGLE-3's fused features): the runner
keeps those layers' outputs without changing its bits, drafting stays lossless, training reads and
extends such heads, and a saved head says which layers it reads."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from completion_engine.drafting.eagle import EagleHead, EagleWeights, normed_features
from completion_engine.eagle import LAYER_FIELDS, EagleConfig, eagle_weights, load_eagle, save_eagle
from completion_engine.models import LoadedModel, ModelLoadError
from completion_engine.runner import DecoderRunner, DecoderWeights
from completion_engine.types import Request
from tests.conftest import tiny_loaded
from tests.unit.test_eagle import drafting_and_training_gap
from tests.unit.test_lossless import engine_for, plain, random_prompts

LAYERS = (0, 1)  # of a 3-layer target: every earlier layer


@pytest.fixture(scope="module")
def three_layers(tiny_tokenizer) -> LoadedModel:
    return tiny_loaded(tiny_tokenizer, seed=5, layers=3)


@pytest.fixture(scope="module")
def three_layers_float32(tiny_tokenizer) -> LoadedModel:
    """float32: the runner and the head run on the row-invariant kernel."""
    return tiny_loaded(tiny_tokenizer, seed=5, layers=3, dtype=torch.float32)


def fused_head(
    target: LoadedModel, layers: tuple[int, ...] = LAYERS, window: int | None = None
) -> EagleWeights:
    """The target's last layer fed the next token, with a trace of each feature block."""
    w = target.weights
    hidden = w.shape.hidden
    blocks = 1 + len(layers)
    state = {
        "fc": torch.cat([torch.eye(hidden)] + [0.01 * torch.eye(hidden)] * blocks, dim=1),
        "feature_norm": torch.ones(blocks * hidden),
        **{f"layer.{name}": getattr(w.layers[-1], name) for name in LAYER_FIELDS},
    }
    return eagle_weights(w, state, torch.arange(480), window, layers)


def first_layers(weights: DecoderWeights, n: int) -> DecoderWeights:
    """The target cut after its first n layers: its last-layer output is the full target's layer n - 1."""
    shape = dataclasses.replace(weights.shape, n_layers=n)
    return dataclasses.replace(weights, shape=shape, layers=weights.layers[:n], packed={})


@pytest.mark.parametrize("kernel", [False, True])
def test_the_runner_keeps_the_earlier_layers_outputs_without_changing_its_bits(
    three_layers, three_layers_float32, kernel
):
    target = three_layers_float32 if kernel else three_layers
    weights = target.weights
    fused = DecoderRunner(weights, exact=True, capacity=512, keep_features=True, feature_layers=LAYERS)
    last_only = DecoderRunner(weights, exact=True, capacity=512, keep_features=True)
    assert fused.row_invariant_kernel == kernel
    context = (random_prompts(target.vocab_size, 1, seed=4)[0] * 30)[:200]  # two prefill blocks
    logits = [runner.prefill(context)[0] for runner in (fused, last_only)]
    assert torch.equal(logits[0], logits[1])
    steps = [runner.extend([3, 4, 5], all_logits=True) for runner in (fused, last_only)]
    assert torch.equal(steps[0], steps[1])
    n, hidden = len(fused), weights.shape.hidden
    assert fused.features.shape[1] == 3 * hidden
    assert torch.equal(fused.features[:n, :hidden], last_only.features[:n])
    for block, layer in enumerate(LAYERS, start=1):
        cut = DecoderRunner(first_layers(weights, layer + 1), exact=True, capacity=512, keep_features=True)
        cut.prefill(context)
        cut.extend([3, 4, 5])
        # the same layers over the same tokens; the cut model's forwards have the same row counts
        assert torch.equal(fused.features[:n, block * hidden : (block + 1) * hidden], cut.features[:n])


def test_after_a_tree_step_the_fused_features_are_those_of_plain_decoding(three_layers):
    weights = three_layers.weights
    chain = DecoderRunner(weights, exact=True, capacity=512, keep_features=True, feature_layers=LAYERS)
    tree = DecoderRunner(weights, exact=True, capacity=512, keep_features=True, feature_layers=LAYERS)
    context = random_prompts(three_layers.vocab_size, 1, seed=4)[0]
    chain.prefill(context)
    tree.prefill(context)
    chain.extend([10, 11, 12])
    tree.verify_tree([10, 20, 11, 21, 12], [-1, 0, 0, 2, 2])
    tree.accept_path([0, 2, 4])
    n = len(chain)
    assert tree.token_ids == chain.token_ids and torch.equal(tree.features[:n], chain.features[:n])


def test_feature_layers_are_checked(three_layers):
    for bad in ((2,), (1, 0), (1, 1), (-1,)):
        with pytest.raises(ValueError, match="feature layers"):
            DecoderRunner(
                three_layers.weights, exact=True, capacity=64, keep_features=True, feature_layers=bad
            )
    engine_runner = DecoderRunner(three_layers.weights, exact=True, capacity=64, keep_features=True)
    from completion_engine.drafting.eagle import EagleDrafter

    with pytest.raises(ValueError, match="feature_layers"):
        EagleDrafter(engine_runner, fused_head(three_layers), 0.0, None)  # a runner without the layers


@pytest.mark.parametrize("kernel", [False, True])
@pytest.mark.parametrize("tree", [False, True])
def test_a_fused_head_drafts_losslessly(three_layers, three_layers_float32, tree, kernel):
    target = three_layers_float32 if kernel else three_layers
    engine = engine_for(target, fused_head(target, window=6 if tree else None), k=6, eagle_tree=tree)
    assert engine.target_runner.feature_layers == LAYERS
    accepted = drafted = 0
    for prompt in random_prompts(target.vocab_size, 6, seed=21):
        expected = plain(engine, prompt, 30)
        engine.warm(prompt)
        generation = engine.complete(Request(context=prompt, max_new_tokens=30, draft="model"))
        assert generation.tokens == expected, f"fused head (tree={tree}) diverged on prompt {prompt}"
        accepted += generation.stats.accepted
        drafted += generation.stats.drafted
    assert 0 < drafted and accepted <= drafted


def test_a_guess_reads_zero_for_the_earlier_layers(three_layers):
    weights = fused_head(three_layers)
    hidden = weights.shape.hidden
    g = torch.randn(2, hidden).to(weights.embed.dtype)
    full = torch.cat([g, torch.zeros(2, 2 * hidden, dtype=g.dtype)], -1)
    assert torch.equal(normed_features(g, weights), normed_features(full, weights))
    assert normed_features(g, weights).shape == (2, 3 * hidden)


def test_drafting_computes_what_training_computes_with_fused_features(three_layers):
    weights = fused_head(three_layers)
    norm = torch.linspace(0.5, 1.5, 3 * weights.shape.hidden).to(weights.embed.dtype)  # blocks differ
    weights = dataclasses.replace(weights, feature_norm=norm)
    assert drafting_and_training_gap(three_layers, weights) < 0.02


def test_a_head_continued_with_more_layers_starts_where_it_was(three_layers, tmp_path):
    """--init-head with --feature-layers: the old head's columns, zero for the new layers."""
    from eval.train_eagle import TrainableHead, feature_layers, load_head_state, target_pass

    target = three_layers.weights
    old = fused_head(three_layers, layers=())
    save_eagle(tmp_path, old, EagleConfig(subset_size=480, target="tiny", hidden=target.shape.hidden))
    state, start_layers = load_head_state(tmp_path, target.shape.hidden)
    assert start_layers == () and feature_layers(None, start_layers, 3) == ()
    layers = feature_layers("0,1", start_layers, 3)
    before, after = (
        TrainableHead(target, state["vocab_map"]),
        TrainableHead(target, state["vocab_map"], layers),
    )
    before.start_from(state)
    after.start_from(state)
    windows = torch.randint(2, three_layers.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    narrow, wide = target_pass(target, windows, "test"), target_pass(target, windows, "test", layers)
    assert wide.features.shape[-1] == 3 * target.shape.hidden
    assert torch.equal(wide.features[..., : target.shape.hidden], narrow.features)
    assert torch.equal(wide.choices, narrow.choices)
    with torch.no_grad():
        g_before = before(narrow.features[:, :-1].float(), windows[:, 1:])
        g_after = after(wide.features[:, :-1].float(), windows[:, 1:])
    torch.testing.assert_close(g_after, g_before)
    with pytest.raises(SystemExit, match="must come first"):
        feature_layers("1", (0,), 3)
    with pytest.raises(SystemExit, match="distinct ascending"):
        feature_layers("1,0", (), 3)
    with pytest.raises(SystemExit, match="distinct ascending"):
        feature_layers("2", (), 3)
    with pytest.raises(SystemExit, match="layer numbers"):
        feature_layers("a", (), 3)


def test_a_saved_fused_head_loads_with_its_layers_and_is_checked(three_layers, tmp_path):
    import json

    weights = fused_head(three_layers)
    hidden = weights.shape.hidden
    save_eagle(
        tmp_path, weights, EagleConfig(subset_size=480, target="tiny", hidden=hidden, feature_layers=LAYERS)
    )
    loaded = load_eagle(three_layers.weights, tmp_path)
    assert loaded.feature_layers == LAYERS and loaded.feature_width == 3 * hidden
    assert torch.equal(loaded.fc, weights.fc)
    config = json.loads((tmp_path / "eagle.json").read_text())
    config["feature_layers"] = [0, 2]  # the target's last layer is read anyway
    (tmp_path / "eagle.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="reads layers"):
        load_eagle(three_layers.weights, tmp_path)
    config["feature_layers"] = [1]  # fewer layers than its input projection was trained for
    (tmp_path / "eagle.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="input projection"):
        load_eagle(three_layers.weights, tmp_path)


@pytest.mark.parametrize("kernel", [False, True])
def test_a_guess_through_fc_guess_gives_what_zero_padded_features_give(
    three_layers, three_layers_float32, kernel
):
    # a guess skips the earlier layers' zero blocks (fc's first two blocks only): the same g
    target = three_layers_float32 if kernel else three_layers
    weights = fused_head(target)
    hidden, dtype = weights.shape.hidden, weights.embed.dtype
    norm = torch.linspace(0.5, 1.5, 3 * hidden).to(dtype)
    # every block of fc its own weights (fused_head's feature blocks are alike): a guess that read
    # the wrong columns would differ
    fc = 0.05 * torch.randn(hidden, 4 * hidden, generator=torch.Generator().manual_seed(3))
    weights = dataclasses.replace(weights, feature_norm=norm, fc=fc.to(dtype))
    g = torch.randn(3, hidden, generator=torch.Generator().manual_seed(4)).to(weights.embed.dtype)
    padded = torch.cat([g, torch.zeros(3, 2 * hidden, dtype=g.dtype)], -1)
    outputs = []
    for features in (g, padded):
        head = EagleHead(weights, capacity=64, packed=kernel)
        outputs.append(head.forward(features, [5, 6, 7], [0, 1, 2]))
    if kernel:  # the kernel's sums over zeros add exact zeros; its rms_norm is (x * scale) * weight
        assert torch.equal(outputs[0], outputs[1])
    else:
        torch.testing.assert_close(outputs[0], outputs[1])
