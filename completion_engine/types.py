"""Data that crosses module boundaries: requests in, drafts and chunks through, stats out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from completion_engine.drafters import DRAFT_METHODS, drafter_spec  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # torch stays out of the import path of anything that only needs the types
    import torch


@dataclass(frozen=True, slots=True)
class Request:
    """One completion: the token context and how to continue it."""

    context: Sequence[int]  # token ids of everything before the cursor
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()  # generation ends before the first of these strings
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    seed: int = 0
    draft: str = "ngram"  # one of DRAFT_METHODS
    stop_tokens: frozenset[int] = frozenset()  # tokens that end generation like EOS (FIM end tokens)
    heal: str = ""  # token healing: text the first generated tokens must spell; not part of the completion

    def __post_init__(self) -> None:
        drafter_spec(self.draft)  # ValueError for an unknown name
        if self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class Draft:
    """Tokens a drafter proposes to come next."""

    tokens: list[int]  # [n <= k]; empty, never None
    probs: torch.Tensor | None  # [n, vocab] draft distribution q; None for point-mass (n-gram) drafts
    source: str  # "ngram" | "model"
    match_len: int = 0  # n-gram drafts: how many context tokens the match covered
    # a token tree: parents[i] < i is the parent of tokens[i], -1 for a child of the pending token;
    # None for a chain (each token follows the one before)
    parents: list[int] | None = None
    # where each token came from (CONTEXT, DOCUMENTS, OUTPUTS); None: all from `source`
    origins: list[str] | None = None


# where an n-gram draft's token came from: a match in the request's context, in an open document or
# in one of the engine's earlier completions; a draft model's tokens are its source's, "model"
CONTEXT, DOCUMENTS, OUTPUTS = "context", "documents", "outputs"
ORIGINS = (CONTEXT, DOCUMENTS, OUTPUTS, "model")  # Stats.by_origin's names, in the reports' order


@dataclass(frozen=True, slots=True)
class Chunk:
    """Text accepted in one verify step, streamed to the caller."""

    text: str  # the new text since the previous chunk
    tokens: list[int]  # the tokens accepted in this step
    source: str  # draft source of this step: "ngram" | "model" | "none"
    accepted: int  # how many of this step's tokens came from the draft


@dataclass(slots=True)
class SourceStats:
    drafted: int = 0  # tokens proposed by this source
    accepted: int = 0  # of them, tokens the target agreed with
    steps: int = 0  # verify steps that used this source

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        return {"drafted": self.drafted, "accepted": self.accepted, "steps": self.steps}


@dataclass(slots=True)
class Stats:
    """Counters for one request; the engine fills them in while streaming."""

    tokens: int = 0  # tokens generated (after stop-string truncation)
    target_forwards: int = 0  # target forward passes, prefill included
    prefill_tokens: int = 0  # context tokens the target had to compute (not reused from its KV cache)
    prefill_s: float = 0.0  # the target's prefill of the context (before the first token)
    draft_prefill_s: float = 0.0  # the draft model's pass over the prompt, just after the first token
    ttft_s: float = 0.0  # time to the first streamed text
    wall_s: float = 0.0
    draft_s: float = 0.0  # of the decode, the time the drafters took to propose
    by_source: dict[str, SourceStats] = field(default_factory=dict)
    # the same drafted and accepted tokens by where each came from (ORIGINS: Draft.origins, or the
    # draft's source for a draft model's); steps: verify steps that drafted a token from there
    by_origin: dict[str, SourceStats] = field(default_factory=dict)
    accepted_hist: dict[int, int] = field(default_factory=dict)  # accepted draft length -> verify steps
    stop_reason: str = ""  # "length" | "eos" | "stop" | "syntax" | "cancelled"
    forwards_saved_by_stop: int = 0  # estimated target forwards an early (syntax) stop avoided
    tree_steps: int = 0  # verify steps that checked a token tree (several continuations at once)
    tree_nodes: int = 0  # drafted tokens in those trees

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.by_source.values())

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.by_source.values())

    @property
    def decode_s(self) -> float:
        """The generation's time after the prompt's processing (the target's and the draft's)."""
        return max(self.wall_s - self.prefill_s - self.draft_prefill_s, 0.0)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def mean_accepted_len(self) -> float:
        """Mean tokens produced per verify step (accepted draft tokens plus the target's own token)."""
        steps = sum(self.accepted_hist.values())
        return (self.accepted + steps) / steps if steps else 0.0

    def source(self, name: str) -> SourceStats:
        return self.by_source.setdefault(name, SourceStats())

    def record_step(self, source: str, drafted: Sequence[str], kept: Sequence[str]) -> None:
        """Count one verify step: its drafted tokens' origins, and those of the ones the target kept."""
        if drafted:
            s = self.source(source)
            s.drafted += len(drafted)
            s.accepted += len(kept)
            s.steps += 1
        for origin in dict.fromkeys(drafted):
            s = self.by_origin.setdefault(origin, SourceStats())
            s.drafted += drafted.count(origin)
            s.accepted += kept.count(origin)
            s.steps += 1
        self.accepted_hist[len(kept)] = self.accepted_hist.get(len(kept), 0) + 1

    def as_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "target_forwards": self.target_forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "prefill_tokens": self.prefill_tokens,
            "prefill_s": round(self.prefill_s, 4),
            "draft_prefill_s": round(self.draft_prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "ttft_s": round(self.ttft_s, 4),
            "wall_s": round(self.wall_s, 4),
            "draft_s": round(self.draft_s, 4),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 2),
            "mean_accepted_len": round(self.mean_accepted_len, 3),
            "stop_reason": self.stop_reason,
            "forwards_saved_by_stop": self.forwards_saved_by_stop,
            "tree_steps": self.tree_steps,
            "tree_nodes": self.tree_nodes,
            "by_source": {name: s.as_dict() for name, s in sorted(self.by_source.items())},
            "by_origin": {name: s.as_dict() for name, s in sorted(self.by_origin.items())},
            "accepted_hist": {str(k): v for k, v in sorted(self.accepted_hist.items())},
        }
