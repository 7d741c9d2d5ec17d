"""Cost of one draft token against one target forward, for the shipped distilled draft.

    python -m eval.bench_draft_cost

Times 1-token steps at a 500-token context: the target in exact and fast mode, the draft with its
reduced head, and the same draft with the full 49,152-token head (what the reduced head saves).
"""

from __future__ import annotations

import sys
import time

import torch

from completion_engine.distilled import load_draft
from completion_engine.models import load_model
from completion_engine.runner import DecoderRunner, DecoderWeights


def step_ms(weights: DecoderWeights, exact: bool, ids: list[int], steps: int = 20) -> float:
    """Best of three: mean time of one 1-token forward after a 500-token prefill."""
    runner = DecoderRunner(weights, exact=exact, capacity=2048)
    runner.extend(ids[:500])
    best = float("inf")
    for _ in range(3):
        runner.truncate(500)
        start = time.perf_counter()
        for token in ids[500 : 500 + steps]:
            runner.extend([token])
        best = min(best, (time.perf_counter() - start) / steps)
    return best * 1e3


def main() -> int:
    target = load_model("smollm2-135m", progress=False)
    draft, _ = load_draft(target.weights)
    w = draft
    full_head = DecoderWeights(
        w.shape, w.embed, w.layers, w.final_norm, target.weights.lm_head, w.inv_freq, w.rope_scale
    )
    ids = torch.randint(0, target.vocab_size, (600,), generator=torch.Generator().manual_seed(0)).tolist()
    exact, fast = step_ms(target.weights, True, ids), step_ms(target.weights, False, ids)
    reduced, full = step_ms(draft, False, ids), step_ms(full_head, False, ids)
    print(f"target step: exact {exact:.1f} ms, fast {fast:.1f} ms")
    print(
        f"draft token: {reduced:.1f} ms with its {len(draft.lm_head)}-token head "
        f"= {reduced / exact:.2f} of an exact target step"
    )
    print(f"             {full:.1f} ms with the full head = {full / exact:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
