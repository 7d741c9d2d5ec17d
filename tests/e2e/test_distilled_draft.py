"""The shipped distilled draft: small enough to ship, and lossless beside the embedded target."""

from __future__ import annotations

from pathlib import Path

import pytest

from completion_engine.defaults import DISTILLED_DIR, DISTILLED_NAME, DISTILLED_WEIGHTS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
shipped = pytest.mark.skipif(
    not (DISTILLED_DIR / DISTILLED_WEIGHTS).exists(), reason="no distilled draft shipped"
)


@shipped
def test_the_shipped_weights_stay_under_40_mb():
    assert (DISTILLED_DIR / DISTILLED_WEIGHTS).stat().st_size < 40 * 2**20


@shipped
@pytest.mark.embedded
def test_model_and_hybrid_drafts_equal_plain_decoding_on_the_embedded_model():
    from completion_engine.config import EngineConfig
    from completion_engine.engine import CompletionEngine
    from completion_engine.types import Request

    engine = CompletionEngine.from_config(EngineConfig(draft_model=DISTILLED_NAME), progress=False)
    text = (EXAMPLES / "shapes.py").read_text()
    accepted = 0
    for cut in (180, 330, 520):
        context = engine.encode(text[:cut])
        plain = engine.complete(Request(context=context, max_new_tokens=24, draft="none")).tokens
        for method in ("model", "hybrid"):
            generation = engine.complete(Request(context=context, max_new_tokens=24, draft=method))
            assert generation.tokens == plain, f"{method} diverged at {cut}"
            accepted += (
                generation.stats.by_source.get("model").accepted
                if "model" in generation.stats.by_source
                else 0
            )
    assert accepted > 0, "the distilled draft should be right some of the time"
