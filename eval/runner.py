"""Run one case through every draft method (and the peers) and build its result row.

Per case:
1. The case's open documents replace the previous case's in the n-gram corpus.
2. A cold prefill (`max_new_tokens=1`) fills the target's KV cache: its time is the case's cold
   time to first token. Every method then reuses that cache (the last logits included), so none
   pays a prefill and their decode phases (wall - prefill - a draft model's catch-up over the
   prompt: Stats.decode_s) compare on equal terms.
3. `none` (plain greedy decoding) runs first, then the other methods, each through the one completion
   path the CLI and the server use (`completion_engine.completion.complete`): same prompt, same stop
   policy, same final clean-up.
4. Lossless check: under greedy decoding every method's text must equal `none`'s.
5. The suite's score function grades each method's text (it is the same text when lossless, but a
   mismatch is graded as what it is).
6. A one-character edit: the first character of the reference is typed at the cursor, and a
   one-token request measures the time to first token with the KV prefix reused (the case's
   `edit_ttft_s`), as the language server sees it while the user types.
7. Peers, when loaded (stock HF, and vLLM when installed), generate as many tokens as `none` did on
   the same context, and time the same one-character edit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace

from completion_engine.completion import CompletionOptions, Cursor, Prompt, build_prompt, complete
from completion_engine.drafters import DRAFT_METHODS, DRAFTERS, NEEDS_DRAFT_MODEL, needs_draft_model
from completion_engine.types import Request
from eval.cases import Case
from eval.metrics import decode_speedup, first_difference

Score = Callable[[Case, str], dict]  # (case, completion) -> metrics of the completion


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


def case_cursor(case: Case) -> Cursor:
    """The case as a cursor: the suffix follows the reference; its open documents are the other files."""
    return Cursor(
        case.prefix,
        case.suffix,
        path=case.case_id.split(":")[0],
        language_id=case.language,
        other_files=tuple(case.open_documents.items()),
    )


def method_row(stats: dict, raw_text: str, text: str, tokens: list[int]) -> dict:
    """One method's output and speed on one case, from the engine's Stats.as_dict().

    raw_text: the generation as the stop check cut it; text: after the stopper's clean-up.
    """
    decode_s = stats["decode_s"]
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

    def __init__(
        self,
        engine,
        options: CompletionOptions,
        methods: tuple[str, ...],
        score: Score,
        peers: Sequence = (),
        repeats: int = 1,
        variants: dict[str, dict] | None = None,
    ) -> None:
        self.engine = engine
        self.options = options
        self.methods = methods  # draft methods to run; "none" always first
        self.repeats = repeats  # runs per method; the fastest counts (the least disturbed by other load)
        self.variants = variants or {}  # name -> CompletionOptions overrides, graded with plain decoding
        self.score = score
        self.peers = list(peers or ())  # HfPeers, VllmPeers: each has run_case(...) -> {name: row}
        self._documents: list[str] = []

    def run(self, case: Case) -> dict:
        engine = self.engine
        self._open_documents(case)
        cursor = case_cursor(case)
        prompt = build_prompt(engine, cursor, self.options)
        context = prompt.context
        cold = engine.complete(Request(context=context, max_new_tokens=1, draft="none")).stats
        results: dict[str, dict] = {}
        unrepeatable = []
        for method in self.methods:
            results[method] = self._run_method(cursor, prompt, method)
            if not results[method].pop("repeats_agree"):
                unrepeatable.append(f"{method} (repeat)")  # greedy decoding must repeat itself exactly
        mismatches = compare_to_plain(results) + unrepeatable
        edit_context = self._one_char_edit(case, cursor)
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
            "cold_prefill_s": round(cold.prefill_s, 6),
            "cold_ttft_s": round(cold.ttft_s, 6),
            **self._after_one_char_edit(edit_context),
            "stopper": results["none"]["stopper"],
            "open_documents": sorted(case.open_documents),
            "reference": case.reference,
            "methods": results,
            "lossless": {"identical": not mismatches, "mismatches": mismatches},
        }
        if self.variants:
            row["variants"] = {
                "default": {"text": results["none"]["text"], "metrics": results["none"]["metrics"]}
            }
            for name, overrides in self.variants.items():
                options = replace(self.options, draft="none", **overrides)
                text = complete(engine, cursor, options).text
                row["variants"][name] = {"text": text, "metrics": graded.get(text) or self.score(case, text)}
        if self.peers:
            plain_tokens = results["none"]["token_ids"]
            row["peers"] = {}
            for peers in self.peers:
                row["peers"].update(peers.run_case(context, len(plain_tokens), plain_tokens, edit_context))
        return row

    def _one_char_edit(self, case: Case, cursor: Cursor) -> list[int]:
        """The prompt's context after typing the reference's first character at the cursor."""
        typed = (case.reference or " ")[0]
        return build_prompt(self.engine, replace(cursor, prefix=cursor.prefix + typed), self.options).context

    def _after_one_char_edit(self, context: list[int]) -> dict:
        stats = self.engine.complete(Request(context=context, max_new_tokens=1, draft="none")).stats
        return {"edit_ttft_s": round(stats.ttft_s, 6), "edit_prefill_tokens": stats.prefill_tokens}

    def _run_method(self, cursor: Cursor, prompt: Prompt, method: str) -> dict:
        """The method's fastest of `repeats` runs."""
        options = replace(self.options, draft=method)
        runs, stoppers = [], set()
        for _ in range(max(self.repeats, 1)):
            # no method may draft from what an earlier one wrote on this case (or a repeat from itself)
            self.engine.forget_outputs()
            result = complete(self.engine, cursor, options, prompt=prompt)
            runs.append(method_row(result.stats.as_dict(), result.raw_text, result.text, result.tokens))
            stoppers.add(result.stopper)
        best = min(runs, key=lambda run: run["decode_s"])
        best["stopper"] = "/".join(sorted(stoppers))
        # what the draft budget priced a verify row and a draft token at, after these runs
        best["prices"] = asdict(self.engine.budget.prices(len(prompt.context)))
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
