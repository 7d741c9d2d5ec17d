"""Every engine setting in one place, passed explicitly."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TARGET = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    target: str = DEFAULT_TARGET  # "smollm2-135m", a Hugging Face id, a local folder or a .gguf file
    draft_model: str | None = None  # same forms as target; needed by the "model" and "hybrid" drafters
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    # "auto" (bf16 on a GPU, float32 on a CPU but bf16 with AMX where the row-invariant kernel is off:
    # models.resolve_dtype) | "bfloat16" | "float16" | "float32"
    dtype: str = "auto"
    exact: bool = True  # shape-bucketed forward: speculative output bit-identical to plain decoding
    max_draft: int = 10  # k: tokens drafted per step (at most DECODE_ROWS - 1 in exact mode)
    # the cost of one more row in a verify forward, in 1-row steps: None times it when the engine
    # loads, after a short and a long context (it grows with the context: draft_budget.RowCost), and
    # the staircase of a forward's cost in its rows (a number: the same for every row);
    # drafts are cut to the size that pays at that cost (draft_budget.py); 0 never cuts them. A timed
    # cost is then corrected by the decode steps' own timings (step_costs.py); a given one is kept
    row_cost: float | None = None
    # the cost of one token from the draft model (or EAGLE head), in 1-row target steps: None times it
    # when the engine loads (and corrected by the decode steps, as row_cost); model drafts are sized
    # before drafting at row_cost + draft_cost a token
    draft_cost: float | None = None
    ngram_min: int = 2  # shortest n-gram that may produce a draft
    ngram_max: int = 8  # longest n-gram the matcher tries to extend to
    # hybrid: an n-gram match this long wins over the draft model (README, "The distilled draft model")
    hybrid_min_match: int = 4
    draft_min_prob: float = 0.3  # model drafter stops when its top probability falls below this
    # an EAGLE head drafts a tree of its top tokens (EAGLE-2) instead of a chain, for exact greedy
    # requests: None wherever the draft model is an EAGLE head and the verifier exact (with AMX
    # attention a verify row costs little: trees ran faster than chains on both packages measured,
    # README), True to require it, False for chains
    eagle_tree: bool | None = None
    max_context: int = 4096  # tokens of context kept (the oldest are cut)
    kept_outputs: int = 32  # earlier completions kept in the n-gram corpus for drafting (0: none)
