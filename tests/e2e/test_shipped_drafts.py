"""The shipped drafts (the distilled draft model, the EAGLE head): small enough to ship, and lossless
beside the embedded target as chains, trees and in hybrid."""

from __future__ import annotations

from pathlib import Path

import pytest

from completion_engine.defaults import (
    DISTILLED_DIR,
    DISTILLED_NAME,
    DISTILLED_WEIGHTS,
    EAGLE_DIR,
    EAGLE_NAME,
    EAGLE_WEIGHTS,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHIPPED = [
    pytest.param(
        name,
        path,
        limit_mb,
        marks=pytest.mark.skipif(not path.exists(), reason=f"{name} is not shipped"),
        id=name,
    )
    for name, path, limit_mb in (
        (DISTILLED_NAME, DISTILLED_DIR / DISTILLED_WEIGHTS, 40),
        (EAGLE_NAME, EAGLE_DIR / EAGLE_WEIGHTS, 20),
    )
]


@pytest.mark.parametrize(("name", "weights", "limit_mb"), SHIPPED)
def test_the_shipped_weights_stay_small(name, weights, limit_mb):
    assert weights.stat().st_size < limit_mb * 2**20


@pytest.mark.embedded
@pytest.mark.parametrize(("name", "weights", "limit_mb"), SHIPPED)
def test_model_and_hybrid_drafts_equal_plain_decoding_on_the_embedded_model(name, weights, limit_mb):
    from completion_engine.config import EngineConfig
    from completion_engine.engine import CompletionEngine
    from completion_engine.types import Request

    # row_cost=draft_cost=0: drafts keep the size the drafter chose on every machine (costs timed at
    # load on a busy host could cut model drafts to almost none)
    config = EngineConfig(draft_model=name, row_cost=0.0, draft_cost=0.0)
    engine = CompletionEngine.from_config(config, progress=False)
    text = (EXAMPLES / "shapes.py").read_text()
    accepted = 0
    for cut in (180, 330, 520):
        context = engine.encode(text[:cut])
        plain = engine.complete(Request(context=context, max_new_tokens=24, draft="none")).tokens
        for method in ("model", "hybrid"):
            generation = engine.complete(Request(context=context, max_new_tokens=24, draft=method))
            assert generation.tokens == plain, f"{name} {method} diverged at {cut}"
            model = generation.stats.by_source.get("model")
            accepted += model.accepted if model else 0
    assert accepted > 0, f"{name} should be right some of the time"


def test_the_embedded_target_drafts_with_its_eagle_head_by_default(monkeypatch, tmp_path):
    from completion_engine import defaults
    from completion_engine.config import DEFAULT_TARGET

    if not (EAGLE_DIR / EAGLE_WEIGHTS).exists():
        pytest.skip("the EAGLE head is not shipped")
    assert defaults.default_draft_model(DEFAULT_TARGET) == EAGLE_NAME
    assert defaults.default_draft_model("some/other-model") is None
    monkeypatch.setattr(defaults, "EAGLE_DIR", tmp_path)  # a package without the head: the distilled draft
    expected = DISTILLED_NAME if (DISTILLED_DIR / DISTILLED_WEIGHTS).exists() else None
    assert defaults.default_draft_model(DEFAULT_TARGET) == expected
