"""The speculative loop: draft -> verify -> accept -> stream."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from completion_engine.config import EngineConfig
from completion_engine.defaults import EAGLE_NAME
from completion_engine.draft_budget import (
    MODEL,
    DraftBudget,
    RowCost,
    best_time,
    measure_row_cost,
    measure_row_shape,
)
from completion_engine.drafters import DrafterParts, draft_problem, drafter_spec, needs_draft_model
from completion_engine.drafting import DocumentCorpus, Drafter, ModelDrafter, NgramDrafter
from completion_engine.drafting.eagle import EagleDrafter, EagleWeights, TreeSettings
from completion_engine.drafting.tree import first_chain
from completion_engine.healing import TokenTable, ends_in_blank, remaining_heal, strip_heal
from completion_engine.kv import PANEL
from completion_engine.models import LoadedModel, check_compatible
from completion_engine.runner import DECODE_ROWS, DecoderRunner
from completion_engine.sampling import Sampler
from completion_engine.threads import choose_threads
from completion_engine.token_tree import tree_depth
from completion_engine.types import OUTPUTS, Chunk, Draft, Request, Stats
from completion_engine.verify import greedy_accept, greedy_accept_tree, greedy_choices, rejection_sample

logger = logging.getLogger(__name__)

StopCheck = Callable[[str], "int | None"]  # completion so far -> None (go on) or chars to keep (stop)

GENERATION_ROOM = 512  # cache positions kept free beyond max_context for generated and drafted tokens
PROBE_CONTEXT = 256  # tokens before the forwards that time a step (and, with PROBE_LONG, a verify row)
PROBE_LONG = 2048  # at most this many before the second timing of a verify row (its prefill is paid at load)
PROBE_SPAN = 512  # fewer tokens between the two timings: one timing, one price (noise would set the slope)
# the price of a verify row where rows cost time (DecoderRunner.rows_cost_time), yet the load timed
# them free: timings another process disturbed (a price of 0 would stay 0, the decode steps' timings
# correct a price by a factor); the steps' timings correct this one (the embedded model timed
# 0.11-0.20 on two AVX2 cores, 0.016-0.037 with AMX), though as one price at every context length
UNTIMED_ROW = 0.05
# Earlier completions stay in the n-gram corpus (EngineConfig.kept_outputs of them), each with the
# context tokens just before it, so a request superseded while the user types through it, or asked
# again, drafts from what it wrote.
OUTPUT_PREFIX = "@output/"  # document ids of the kept completions
OUTPUT_LEAD = 16  # context tokens kept before each output (what a later tail matches against)


@dataclass(slots=True)
class _Progress:
    """Mutable state of one generation."""

    tokens: list[int] = field(default_factory=list)  # generated tokens kept so far
    emitted: str = ""  # text already streamed
    text: str = ""  # the completion so far, after stop strings and the stop check cut it
    done: bool = False


class Generation:
    """Iterate for chunks; afterwards `text` and `stats` hold the result."""

    def __init__(self, chunks: Iterator[Chunk], stats: Stats, progress: _Progress) -> None:
        self._chunks = chunks
        self._progress = progress
        self.stats = stats

    @property
    def text(self) -> str:
        """The completion (final once iteration ends). A stop string may cut text already streamed."""
        return self._progress.text

    @property
    def tokens(self) -> list[int]:
        return self._progress.tokens

    def __iter__(self) -> Iterator[Chunk]:
        yield from self._chunks

    def run(self) -> Generation:
        """Consume every chunk; return self."""
        for _ in self:
            pass
        return self


class CompletionEngine:
    """Owns the target (and optional draft) model with their KV caches and the open-document corpus.

    Not thread-safe: one thread runs generations (the language server has one model worker).
    """

    def __init__(
        self, config: EngineConfig, target: LoadedModel, draft: LoadedModel | EagleWeights | None = None
    ) -> None:
        """draft: a small model with its own cache, or an EAGLE head that reads the target's features."""
        if config.exact and config.max_draft > DECODE_ROWS - 1:
            raise ValueError(f"max_draft is at most {DECODE_ROWS - 1} in exact mode (one verify block)")
        self.config = config
        self.target = target
        self.draft = draft
        capacity = config.max_context + GENERATION_ROOM
        eagle = isinstance(draft, EagleWeights)
        if config.eagle_tree and not eagle:
            raise ValueError(
                f"eagle_tree (--eagle-tree) needs an EAGLE draft head as the draft model ({EAGLE_NAME} "
                "or a head's folder)"
            )
        self.target_runner = DecoderRunner(
            target.weights,
            exact=config.exact,
            capacity=capacity,
            keep_features=eagle,
            # the head looks no further back: its window, rounded down to a panel (EagleHead.view_start),
            # and one more (a warm-up's catch-up ends a slot earlier)
            feature_window=draft.window + PANEL if eagle and draft.window is not None else None,
            feature_layers=draft.feature_layers if eagle else (),
        )
        self.threads = choose_threads(self._probe_step) if self.target_runner.device.type == "cpu" else 0
        row_cost: float | RowCost | None = config.row_cost
        if config.max_draft < 1:
            row_cost = 0.0  # nothing is drafted: nothing to time
        elif row_cost is None:
            row_cost = self._time_row_cost(min(DECODE_ROWS, config.max_draft + 1))
        # its draft_cost is timed below, once a model drafter exists; prices timed at load are corrected
        # by the decode steps' own timings (step_costs.py), prices given in the config are taken as given
        self.budget = DraftBudget(
            row_cost, learn=config.row_cost is None, learn_draft=config.draft_cost is None
        )
        self.corpus = DocumentCorpus(config.ngram_min)
        self._ngram = NgramDrafter(self.corpus, config.ngram_min, config.ngram_max)
        self._model_drafter: ModelDrafter | EagleDrafter | None = None
        self._token_table: TokenTable | None = None
        self._outputs = 0  # completions kept in the corpus so far (see _keep_output)
        if eagle:
            trees = config.exact and config.eagle_tree is not False  # None: trees (the exact verifier)
            # on the kernel a tree is one verify call a layer, whatever its leaves
            one_call = self.target_runner.any_schedule
            tree = TreeSettings.for_verifier(one_call) if trees else None
            self._model_drafter = EagleDrafter(
                self.target_runner,
                draft,
                config.draft_min_prob,
                tree,
                self.budget.plan,
                # a node past k costs one verify row where the tree is one call (off the kernel a new
                # leaf is a chain of attention calls more: no nodes past k there)
                self.budget.extra_nodes if trees and one_call else None,
            )
        elif draft is not None:
            check_compatible(target, draft)
            # where the target runs on the row-invariant kernel, so does the draft: one kernel call a
            # layer and no padding there, a cheaper draft token than torch's ops; elsewhere torch's
            # unpadded forward (a draft's bits never matter, only its speed)
            draft_runner = DecoderRunner(
                draft.weights, exact=self.target_runner.any_schedule, capacity=capacity
            )
            self._model_drafter = ModelDrafter(
                draft_runner, config.draft_min_prob, draft.vocab_map, target.vocab_size, self.budget.plan
            )
        if self._model_drafter is not None and config.max_draft > 0:
            draft_cost = config.draft_cost
            if draft_cost is None:
                step = best_time(lambda: self._probe_forward(1))
                draft_cost = self._model_drafter.token_seconds() / step
                self.target_runner.truncate(0)
                logger.info("a draft-model token costs %.2f of a 1-row target step", draft_cost)
            self.budget.draft_cost = max(draft_cost, 0.0)

    def _time_row_cost(self, rows: int) -> RowCost:
        """The cost of one more verify row, timed after a short context and after max_context tokens
        (at most PROBE_LONG: RowCost goes on in a straight line past it, as attention's cost does),
        and after the longer one the shape of a forward's cost in its rows (measure_row_shape)."""
        runner = self.target_runner
        short_len = min(PROBE_CONTEXT, runner.capacity - DECODE_ROWS)
        long_len = min(self.config.max_context, PROBE_LONG, runner.capacity - DECODE_ROWS)
        if long_len - short_len < PROBE_SPAN:
            ratio, shape = measure_row_shape(lambda n: self._probe_forward(n, short_len), rows)
            cost = RowCost(ratio, shape=shape)
        else:
            short = measure_row_cost(lambda n: self._probe_forward(n, short_len), rows)
            ratio, shape = measure_row_shape(lambda n: self._probe_forward(n, long_len), rows)
            cost = RowCost(short, ratio, short_len, long_len, shape)
        runner.truncate(0)
        if cost.at(long_len) <= 0.0 and runner.rows_cost_time(rows):
            logger.warning(
                "verify rows timed free (%.3f after %d tokens, %.3f after %d) where rows cost time "
                "(timings disturbed by other work?): a row priced at %.2f of a step until the decode "
                "steps' timings correct it",
                cost.short,
                short_len,
                cost.long,
                long_len,
                UNTIMED_ROW,
            )
            return RowCost(UNTIMED_ROW)
        logger.info(
            "verify forwards: one more row costs %.3f of a 1-row step after %d tokens, %.3f after %d; "
            "forwards of 1 to %d rows there: %s",
            cost.at(short_len),
            short_len,
            cost.at(long_len),
            long_len,
            rows,
            " ".join(f"{1.0 + cost.at(long_len) * x:.2f}" for x in cost.shape) or "a straight line",
        )
        return cost

    def _probe_forward(self, rows: int, length: int = PROBE_CONTEXT) -> None:
        """One decode forward of `rows` rows after `length` tokens (at most what fits): what the draft
        budget is timed on."""
        runner = self.target_runner
        length = min(length, runner.capacity - DECODE_ROWS)
        if len(runner) != length:
            runner.prefill([0] * length)
        runner.extend([0] * rows, all_logits=True)  # as a verify block: every row's logits
        if runner.device.type == "cuda":
            torch.cuda.synchronize()  # time the work, not its launch
        runner.truncate(length)

    def _probe_step(self) -> None:
        """A decode step after a short context: what the thread count is chosen for."""
        runner = self.target_runner
        runner.prefill([0] * 64)
        runner.extend([0])
        runner.truncate(0)

    @classmethod
    def from_config(cls, config: EngineConfig, progress: bool = True) -> CompletionEngine:
        from completion_engine.distilled import DISTILLED_NAME, distilled_draft
        from completion_engine.eagle import is_eagle_head, load_eagle
        from completion_engine.models import load_model

        target = load_model(config.target, config.device, config.dtype, progress=progress)
        draft: LoadedModel | EagleWeights | None
        if config.draft_model == DISTILLED_NAME:
            draft = distilled_draft(target)
        elif config.draft_model and is_eagle_head(config.draft_model):
            draft = load_eagle(target.weights, config.draft_model)
        elif config.draft_model:
            draft = load_model(config.draft_model, config.device, config.dtype, progress=progress)
        else:
            draft = None
        engine = cls(config, target, draft)
        _ = engine.token_table  # build it now (about a second for a 49k vocabulary), not on the first request
        settle_heap()
        return engine

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, text: str) -> list[int]:
        return self.target.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, tokens: list[int]) -> str:
        return self.target.tokenizer.decode(
            tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def set_document(self, doc_id: str, text: str) -> None:
        """Add or replace an open document in the n-gram corpus."""
        self.corpus.set_document(doc_id, self.encode(text))

    def remove_document(self, doc_id: str) -> None:
        self.corpus.remove_document(doc_id)

    def drafter_for(self, method: str) -> Drafter | None:
        """The registry's drafter for this method; ValueError for an unknown one or a missing draft model."""
        spec = drafter_spec(method)
        problem = draft_problem(method, self._model_drafter is not None)
        if problem:
            raise ValueError(problem)
        return spec.factory(DrafterParts(self._ngram, self._model_drafter, self.config.hybrid_min_match))

    def stream(
        self, request: Request, cancel: threading.Event | None = None, stop_check: StopCheck | None = None
    ) -> Generation:
        drafter = self.drafter_for(request.draft)  # raise on a bad method before anything streams
        stats, progress = Stats(), _Progress()
        return Generation(
            self._generate(request, drafter, stats, progress, cancel, stop_check), stats, progress
        )

    def complete(self, request: Request, stop_check: StopCheck | None = None) -> Generation:
        return self.stream(request, stop_check=stop_check).run()

    # -- the loop ---------------------------------------------------------------------------

    def _generate(
        self,
        request: Request,
        drafter: Drafter | None,
        stats: Stats,
        progress: _Progress,
        cancel: threading.Event | None,
        stop_check: StopCheck | None,
    ) -> Iterator[Chunk]:
        started = time.perf_counter()
        runner = self.target_runner
        forwards_before = runner.forwards
        context = self._fit_context(list(request.context))
        budget = min(request.max_new_tokens, runner.capacity - len(context) - DECODE_ROWS)
        sampler = (
            Sampler.seeded(request.temperature, request.top_p, request.seed)
            if request.temperature > 0
            else None
        )
        try:
            if budget <= 0:
                stats.stop_reason = "length"
                return
            logits = self._prefill(context, stats)
            stats.prefill_s = time.perf_counter() - started
            pending = self._choose(self._constrain(request.heal, [], [], logits[:1])[0], sampler)
            chunk = self._accept(request, [pending], "none", 0, progress, stats, budget, stop_check)
            stats.ttft_s = time.perf_counter() - started
            if chunk is not None:
                yield chunk
            first_k = min(self.config.max_draft, budget - len(progress.tokens) - 1)  # the loop's first k
            if not progress.done and first_k > 0 and needs_draft_model(request.draft):
                # the draft's own pass over the prompt (what warm() left to do), after the first
                # token and apart from the decode time: else the first draft paid it as decode (an EAGLE
                # head's catch-up, ~10 ms at 2,000 tokens), and a method run right after another on
                # the same prompt did not
                catching_up = time.perf_counter()
                try:
                    self._model_drafter.warm(context, cancel)
                finally:
                    stats.draft_prefill_s = time.perf_counter() - catching_up
            while not progress.done:
                if cancel is not None and cancel.is_set():
                    stats.stop_reason = "cancelled"
                    break
                k = min(self.config.max_draft, budget - len(progress.tokens) - 1)
                self.budget.at_context(len(runner))  # a verify row costs more after more tokens
                drafting = time.perf_counter()
                draft = drafter.propose(context + progress.tokens, k, sampler) if drafter and k > 0 else None
                verifying = time.perf_counter()
                stats.draft_s += verifying - drafting
                if draft is not None and draft.source == MODEL and draft.tokens:
                    self.budget.observe_drafting(verifying - drafting)  # what the model's plan cost
                if draft is not None:
                    draft = self.budget.trim(draft)  # the size that pays at this machine's verify cost
                drafted = draft.tokens if draft else []
                origins = (draft.origins or [draft.source] * len(drafted)) if draft else []
                source = draft.source if draft and drafted else "none"
                tree = draft is not None and draft.parents is not None
                if tree and (sampler is not None or self._healing(request.heal, progress.tokens)):
                    chain = first_chain(draft.parents)  # these check chains
                    drafted, origins = [drafted[i] for i in chain], [origins[i] for i in chain]
                    tree = False
                if tree:
                    nodes, pending = self._verify_tree(pending, draft)
                    kept, kept_origins = [drafted[i] for i in nodes], [origins[i] for i in nodes]
                    stats.tree_steps += 1
                    stats.tree_nodes += len(drafted)
                else:
                    base = len(runner)
                    target_logits = runner.extend([pending, *drafted], all_logits=True)  # [1 + n, vocab]
                    target_logits = self._constrain(request.heal, progress.tokens, drafted, target_logits)
                    if sampler is None:
                        accepted, pending = greedy_accept(drafted, target_logits)
                    else:
                        probs = sampler.probs(target_logits)
                        accepted, pending = rejection_sample(
                            drafted, draft.probs if draft else None, probs, sampler
                        )
                    # keep [pending, accepted drafts]: the rest was rejected
                    runner.truncate(base + 1 + accepted)
                    kept, kept_origins = drafted[:accepted], origins[:accepted]
                # what the draft's size changed: its verify forward's seconds, with the acceptance and
                # the cache's trim (not streaming the kept tokens: the same text whatever the size)
                self.budget.observe_step(1 + len(drafted), time.perf_counter() - verifying)
                accepted = len(kept)
                stats.record_step(source, origins, kept_origins)
                if drafted:
                    # a tree's nodes sit at depths: what was tried is its depth, as for a chain's tokens
                    self.budget.observe(draft, tree_depth(draft.parents) if tree else len(drafted), accepted)
                chunk = self._accept(
                    request,
                    [*kept, pending],
                    source,
                    accepted,
                    progress,
                    stats,
                    budget,
                    stop_check,
                )
                if chunk is not None:
                    yield chunk
        finally:
            stats.target_forwards = runner.forwards - forwards_before
            stats.tokens = len(progress.tokens)
            stats.wall_s = time.perf_counter() - started
            self._keep_output(context, progress.tokens)

    def warm(self, context: Sequence[int], cancel: threading.Event | None = None) -> int:
        """Prefill ahead of a request for `context`, so that it finds its KV prefix ready.

        Runs the very prefill the request would run (same positions, same row buckets), so the
        request's output is unchanged; a set `cancel` stops it within one layer, keeping what is
        done. Returns the context tokens computed.
        """
        context = self._fit_context(list(context))
        logits, computed = self.target_runner.prefill(context, cancel)
        if self._model_drafter is not None and logits is not None:
            # after the target (an EAGLE head reads its features); cancelled like it, within a block
            self._model_drafter.warm(context, cancel)
        return computed

    def forget_outputs(self) -> None:
        """Drop the kept completions from the corpus (benchmarks: each method drafts from the same text)."""
        for slot in range(self.config.kept_outputs):
            self.corpus.remove_document(f"{OUTPUT_PREFIX}{slot}")

    def _keep_output(self, context: list[int], tokens: list[int]) -> None:
        """Put a completion into the corpus as an "output" document, replacing the oldest kept one."""
        if len(tokens) < 2 or self.config.kept_outputs <= 0:
            return
        self._outputs += 1
        slot = self._outputs % self.config.kept_outputs
        self.corpus.set_document(f"{OUTPUT_PREFIX}{slot}", context[-OUTPUT_LEAD:] + tokens, OUTPUTS)

    def _verify_tree(self, pending: int, draft: Draft) -> tuple[list[int], int]:
        """Verify a token tree after the pending token; keep the path greedy decoding takes.

        Returns (the kept drafted nodes, indices into draft.tokens in path order; the target's next token).
        """
        tokens = [pending, *draft.tokens]
        parents = [-1, *(parent + 1 for parent in draft.parents)]
        logits = self.target_runner.verify_tree(tokens, parents)  # [1 + n, vocab]
        path, next_token = greedy_accept_tree(tokens, parents, logits)
        self.target_runner.accept_path(path)
        return [node - 1 for node in path[1:]], next_token

    def _fit_context(self, context: list[int]) -> list[int]:
        if not context:
            bos = self.target.tokenizer.bos_token_id
            if bos is None:
                raise ValueError("empty context and the tokenizer has no BOS token to start from")
            context = [bos]
        return context[-self.config.max_context :]

    def _prefill(self, context: list[int], stats: Stats) -> torch.Tensor:
        """Reuse the cached prefix, compute the rest; return the logits after the last context token."""
        logits, stats.prefill_tokens = self.target_runner.prefill(context)
        return logits

    @property
    def token_table(self) -> TokenTable:
        """Each token's text, for token healing (built on first use)."""
        if self._token_table is None:
            self._token_table = TokenTable.from_tokenizer(self.target.tokenizer, self.target.vocab_size)
        return self._token_table

    def _healing(self, heal: str, generated: list[int]) -> bool:
        """Is the healed text still being spelt (so the first tokens are constrained)?"""
        return bool(heal) and remaining_heal(heal, self.decode(generated)) is not None

    def _constrain(
        self, heal: str, generated: list[int], drafted: list[int], logits: torch.Tensor
    ) -> torch.Tensor:
        """Token healing: while `heal` is not spelt yet, only tokens that go on spelling it may win.

        logits: [rows, vocab]; row i predicts the token after generated + drafted[:i]. Plain decoding
        and verification both choose through this mask, so they choose alike.
        """
        if not self._healing(heal, generated):
            return logits
        masked = logits.clone()
        for row in range(logits.shape[0]):
            remaining = remaining_heal(heal, self.decode([*generated, *drafted[:row]]))
            if remaining is None:
                break  # the text only grows: later rows are free too
            allowed = self.token_table.allowed(remaining, ends_in_blank(heal))
            keep = torch.tensor(allowed, dtype=torch.long)
            masked[row] = float("-inf")
            masked[row, keep] = logits[row, keep]
        return masked

    def _choose(self, logits: torch.Tensor, sampler: Sampler | None) -> int:
        if sampler is None:
            return greedy_choices(logits.view(1, -1))[0]
        return sampler.sample(sampler.probs(logits))

    def _accept(
        self,
        request: Request,
        new_tokens: list[int],
        source: str,
        accepted: int,
        progress: _Progress,
        stats: Stats,
        budget: int,
        stop_check: StopCheck | None,
    ) -> Chunk | None:
        """Add a step's tokens; apply EOS, length, stop strings and the stop check; return the text delta."""
        kept: list[int] = []
        for token in new_tokens:
            if token in self.target.eos_token_ids or token in request.stop_tokens:
                progress.done, stats.stop_reason = True, "eos"
                break
            kept.append(token)
            if len(progress.tokens) + len(kept) >= budget:
                progress.done, stats.stop_reason = True, "length"
                break
        progress.tokens.extend(kept)
        # Plain decoding checks the stops after every token, so a step of several tokens checks them
        # after each in turn and ends at the first that stops, with that text and those tokens (a
        # check may fire on a shorter text and not on a longer one: a line that ends like the
        # suffix's start, then goes on)
        base = len(progress.tokens) - len(kept)
        checks = bool(request.stop) or stop_check is not None
        stop, text = None, ""
        for count in range(1, len(kept) + 1) if checks and len(kept) > 1 else (len(kept),):
            text = strip_heal(self.decode(progress.tokens[: base + count]), request.heal)
            stop = _stop(text, request.stop, stop_check)
            if stop is not None:
                if count < len(kept):  # what came after it (an EOS, the length) was not reached
                    del progress.tokens[base + count :]
                    kept, progress.done = kept[:count], False
                break
        if stop is not None:
            reason, keep = stop
            if reason == "syntax" and not progress.done:
                stats.forwards_saved_by_stop = _forwards_for(budget - len(progress.tokens), stats)
            text, progress.done, stats.stop_reason = text[:keep], True, reason
        progress.text = text
        visible = text if progress.done else text.rstrip("\ufffd")  # hold back a half-decoded character
        delta = visible[len(progress.emitted) :] if visible.startswith(progress.emitted) else ""
        progress.emitted += delta
        if not delta and not kept:
            return None
        return Chunk(text=delta, tokens=kept, source=source, accepted=min(accepted, len(kept)))


def settle_heap() -> None:
    """Collect, then move every object alive now out of the cyclic collector's reach (gc.freeze).

    A loaded engine is some 370,000 long-lived Python objects (the tokenizer's, torch's, the
    libraries'). Python's full collection walks all of them whenever enough new objects have
    survived; during decoding that fired about once in 8 completions and stalled that one for
    ~120 ms (a 64-token completion decodes in ~0.5 s). Frozen objects are still freed when nothing
    refers to them, but no cycle through them is ever collected, so each load first unfreezes what
    earlier loads froze: an engine dropped before another loads is collected like any garbage.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _stop(text: str, stops: tuple[str, ...], stop_check: StopCheck | None) -> tuple[str, int] | None:
    """Why and where the completion `text` stops: ("stop", cut) at a stop string, ("syntax", keep) by
    the stop check; None to go on."""
    cut = _first_stop(text, stops)
    if cut is not None:
        return "stop", cut
    keep = stop_check(text) if stop_check is not None else None
    return None if keep is None else ("syntax", keep)


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def _forwards_for(tokens: int, stats: Stats) -> int:
    """Target forwards that `tokens` more tokens would have cost at this request's mean accepted length."""
    per_forward = stats.mean_accepted_len or 1.0
    return int(-(-tokens // per_forward)) if tokens > 0 else 0
