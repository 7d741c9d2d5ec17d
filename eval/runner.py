"""Run one case through every draft method (and the peers) and build its result row.

Per case:
1. The case's open documents replace the previous case's in the n-gram corpus.
2. A cold prefill (`max_new_tokens=1`) fills the target's KV cache: its time is the case's cold
   time to first token. Every method then reuses that cache, so each pays the same one-token
   prefill and their decode phases (wall - prefill) compare on equal terms.
3. `none` (plain greedy decoding) runs first, then the other methods, each with a fresh stop check.
4. Lossless check: under greedy decoding every method's text must equal `none`'s.
5. The suite's score function grades each method's text (it is the same text when lossless, but a
   mismatch is graded as what it is).
6. Peers, when loaded, generate as many tokens as `none` did on the same context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from completion_engine.drafters import DRAFT_METHODS, DRAFTERS, NEEDS_DRAFT_MODEL, needs_draft_model
from completion_engine.types import Request
from eval.cases import Case
from eval.metrics import decode_speedup, first_difference
from eval.stopping import make_stopper

Score = Callable[[Case, str], dict]  # (case, completion) -> metrics of the completion


@dataclass(frozen=True, slots=True)
class RunSettings:
    methods: tuple[str, ...]  # draft methods to run; "none" always first
    max_new_tokens: int = 64
    repeats: int = 1  # runs per method; the fastest counts (the least disturbed by other load)


def plan_methods(requested: Sequence[str], has_draft_model: bool) -> tuple[tuple[str, ...], dict[str, str]]:
    """The methods to run ("none" first, always included) and the skipped ones with the reason.

    >>> plan_methods(["ngram", "model"], False)
    (('none', 'ngram'), {'model': 'needs a draft model (--draft-model)'})
    """
    unknown = [m for m in requested if m not in DRAFTERS]
    if unknown:
        raise ValueError(
            f"unknown draft method(s) {', '.join(unknown)}; choose from {', '.join(DRAFT_METHODS)}"
        )
    methods, skipped = ["none"], {}
    for method in requested:
        if method in methods:
            continue
        if needs_draft_model(method) and not has_draft_model:
            skipped[method] = NEEDS_DRAFT_MODEL
            continue
        methods.append(method)
    return tuple(methods), skipped


def method_row(stats: dict, raw_text: str, text: str, tokens: list[int]) -> dict:
    """One method's output and speed on one case, from the engine's Stats.as_dict().

    raw_text: the generation as the stop check cut it; text: after the stopper's clean-up.
    """
    decode_s = max(stats["wall_s"] - stats["prefill_s"], 0.0)
    acceptance = {
        source: round(s["accepted"] / s["drafted"], 4) if s["drafted"] else 0.0
        for source, s in stats["by_source"].items()
    }
    return {
        "raw_text": raw_text,
        "text": text,
        "tokens": stats["tokens"],
        "token_ids": tokens,
        "decode_s": round(decode_s, 4),
        "decode_tokens_per_s": stats["decode_tokens_per_s"],
        "mean_accepted_len": stats["mean_accepted_len"],
        "acceptance_rate": acceptance,
        "forwards_per_token": round(stats["target_forwards"] / stats["tokens"], 4)
        if stats["tokens"]
        else None,
        "ttft_s": stats["ttft_s"],
        "stop_reason": stats["stop_reason"],
        "stats": stats,
    }


def tokens_agree(a: Sequence[int], b: Sequence[int]) -> bool:
    """One token list is a prefix of the other.

    A speculative method may verify a few tokens past the point where the stop check cut the
    text, tokens plain decoding never generated; up to the shorter length they must be the same.
    """
    n = min(len(a), len(b))
    return list(a[:n]) == list(b[:n])


def compare_to_plain(rows: dict[str, dict]) -> list[str]:
    """Mark each method identical or not to `none`; add its speedup; return the mismatching methods.

    Compared before any clean-up, which could map two different generations to the same text.
    """
    plain = rows["none"]
    mismatches = []
    for method, row in rows.items():
        same_text = row["raw_text"] == plain["raw_text"]
        row["tokens_agree"] = tokens_agree(row["token_ids"], plain["token_ids"])
        row["identical"] = same_text and row["tokens_agree"]
        row["first_difference"] = first_difference(plain["raw_text"], row["raw_text"])
        speedup = decode_speedup(plain["decode_s"], row["decode_s"])
        row["speedup"] = round(speedup, 3) if speedup is not None else None
        if not row["identical"]:
            mismatches.append(method)
    return mismatches


class CaseRunner:
    """Holds the engine (and peers) for a suite; `run(case)` returns the case's result row."""

    def __init__(self, engine, settings: RunSettings, score: Score, peers=None) -> None:
        self.engine = engine
        self.settings = settings
        self.score = score
        self.peers = peers
        self._documents: list[str] = []

    def run(self, case: Case) -> dict:
        engine = self.engine
        self._open_documents(case)
        context = engine.encode(case.prefix)[-engine.config.max_context :]
        cold = engine.complete(Request(context=context, max_new_tokens=1, draft="none")).stats
        results: dict[str, dict] = {}
        unrepeatable = []
        for method in self.settings.methods:
            results[method] = self._run_method(case, context, method)
            if not results[method].pop("repeats_agree"):
                unrepeatable.append(f"{method} (repeat)")  # greedy decoding must repeat itself exactly
        mismatches = compare_to_plain(results) + unrepeatable
        graded: dict[str, dict] = {}
        for row in results.values():
            if row["text"] not in graded:
                graded[row["text"]] = self.score(case, row["text"])
            row["metrics"] = graded[row["text"]]
        row = {
            "case_id": case.case_id,
            "kind": case.kind,
            "context_tokens": len(context),
            "cold_prefill_tokens": cold.prefill_tokens,
            "cold_ttft_s": round(cold.ttft_s, 4),
            "stopper": results["none"]["stopper"],
            "open_documents": sorted(case.open_documents),
            "reference": case.reference,
            "methods": results,
            "lossless": {"identical": not mismatches, "mismatches": mismatches},
        }
        if self.peers is not None:
            plain_tokens = results["none"]["token_ids"]
            row["peers"] = self.peers.run_case(context, len(plain_tokens), plain_tokens)
        return row

    def _run_method(self, case: Case, context: list[int], method: str) -> dict:
        """The method's fastest of `repeats` runs, each with a fresh stop check."""
        runs = []
        for _ in range(max(self.settings.repeats, 1)):
            stopper = make_stopper(case.prefix, case.suffix, case.language, case.stop_mode, case.min_indent)
            request = Request(context=context, max_new_tokens=self.settings.max_new_tokens, draft=method)
            generation = self.engine.complete(request, stop_check=stopper.stop_at)
            stats, raw_text = generation.stats.as_dict(), generation.text
            runs.append(method_row(stats, raw_text, stopper.finalize(raw_text), list(generation.tokens)))
        best = min(runs, key=lambda run: run["decode_s"])
        best["stopper"] = stopper.kind
        best["repeats_agree"] = all(run["raw_text"] == runs[0]["raw_text"] for run in runs)
        if len(runs) > 1:
            best["decode_s_repeats"] = [run["decode_s"] for run in runs]
        return best

    def _open_documents(self, case: Case) -> None:
        for doc_id in self._documents:
            self.engine.remove_document(doc_id)
        self._documents = list(case.open_documents)
        for doc_id, text in case.open_documents.items():
            self.engine.set_document(doc_id, text)
