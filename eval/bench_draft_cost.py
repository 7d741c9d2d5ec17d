"""Cost of one draft token against one target forward, for the shipped drafts.

    python -m eval.bench_draft_cost

Times 1-token steps at a 500-token context: the target in exact and fast mode, the distilled draft
with its reduced head and with the full 49,152-token head (what the reduced head saves), and one
step of the EAGLE head (one layer on its own guess, then its reduced LM head).
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


def eagle_step_ms(target: DecoderWeights, ids: list[int], steps: int = 20) -> float:
    """Best of three: mean time of one EAGLE head step (one row and its logits) after 500 slots."""
    from completion_engine.drafting.eagle import EagleHead
    from completion_engine.eagle import load_eagle

    head = EagleHead(load_eagle(target), 2048)
    features = torch.randn(500, target.shape.hidden, dtype=target.embed.dtype)
    best = float("inf")
    with torch.inference_mode():
        head.forward(features, ids[1:501], range(500))
        for _ in range(3):
            head.truncate(500)
            guess = features[-1:]
            start = time.perf_counter()
            for offset, token in enumerate(ids[500 : 500 + steps]):
                guess = head.forward(guess, [token], [500 + offset])
                int(head.logits(guess).argmax())
            best = min(best, (time.perf_counter() - start) / steps)
    return best * 1e3


def main() -> int:
    from completion_engine.eagle import eagle_available

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
    if eagle_available():
        eagle = eagle_step_ms(target.weights, ids)
        print(f"EAGLE head step: {eagle:.2f} ms = {eagle / exact:.3f} of an exact target step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
