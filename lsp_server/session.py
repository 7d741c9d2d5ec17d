"""One client's connection: its settings, its open documents, and its completion requests.

The handlers in server.py call these methods; every engine call goes through the shared model
worker. Methods run on the event loop's thread except where noted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from lsprotocol import types
from pygls.uris import to_fs_path

from completion_engine.completion import CompletionOptions
from completion_engine.drafters import needs_draft_model
from completion_engine.types import Stats
from lsp_server.corpus import CorpusFeed
from lsp_server.documents import (
    CursorContext,
    DocumentLimits,
    DocumentStore,
    TextChange,
    cursor_context,
    index_of_units,
    offset_at,
    units_of,
)
from lsp_server.settings import InvalidOptions, ServerLimits, apply_languages, apply_options, language_enabled
from lsp_server.stats import RecentRequests, ServerCounters
from lsp_server.suggestions import (
    CursorState,
    Hit,
    Suggestion,
    SuggestionCache,
    cursor_state,
    remainder,
    typed_since,
)
from lsp_server.worker import (
    CompletionInput,
    CompletionJob,
    CompletionOutcome,
    ModelWorker,
    ServerBusy,
    WarmJob,
)

logger = logging.getLogger(__name__)

WARM_IDLE_S = 0.3  # after an edit, a warm-up starts once the documents have not changed for this long
# after didOpen: only long enough to gather a burst of opens (an editor restoring its tabs sends them
# together); the newest wins. Every 0.1 s waited here is some 40 context tokens a request right after
# opening a file must prefill itself (`python eval/bench_ttft.py`, "idle" rows)
WARM_OPEN_IDLE_S = 0.05

CANCEL_REASONS = {
    "superseded": "superseded by a newer completion request for the same document",
    "closed": "the document was closed",
    "disconnected": "the client disconnected",
    "shutdown": "the server is shutting down",
    "edited": "the document was edited elsewhere than by typing the completion",
}


@dataclass(slots=True)
class SharedState:
    """What every connection of one server shares: the model worker, the corpus and the counters."""

    worker: ModelWorker
    corpus: CorpusFeed
    counters: ServerCounters
    limits: ServerLimits
    defaults: CompletionOptions
    model: dict  # target, draft model, device: reported by specComplete/stats
    draft_model_loaded: bool
    clients: itertools.count = field(default_factory=lambda: itertools.count(1))
    live_clients: set[int] = field(default_factory=set)

    def stats(self, client: ClientSession) -> dict:
        """Totals over all clients, and `client`'s own documents and requests: never another's."""
        extra = {
            "queued": self.worker.queued,
            "clients": len(self.live_clients),
            "corpus_documents": self.corpus.documents,
            "corpus_tokens": self.corpus.total_tokens,
            "model": self.model,
            "recent": client.recent.snapshot(),
            "client": {
                "documents": len(client.documents.uris),
                "bytes": client.documents.total_bytes,
                "limits": dict(client.limits_hit),
            },
        }
        return self.counters.snapshot(extra)


@dataclass(frozen=True, slots=True)
class Completion:
    """The answer to one completion request."""

    text: str
    cursor: CursorContext
    position: types.Position  # the cursor, clamped to its line
    suggestion: str = ""  # the id the editor reports shows and accepts by ("" for partial results)
    skipped: int = 0  # code units of that suggestion typed through already (they come before `text`)


class SuggestionError(ValueError):
    """A report about a suggestion that cannot be right (an accepted length beyond its text)."""


@dataclass(slots=True, eq=False)
class _Running:
    """The model completion in flight for one document (the worker lets a newer one supersede it)."""

    job: CompletionJob
    state: CursorState  # where it was asked
    streamed: str = ""  # the completion so far (written by the worker thread)
    kept: bool = False  # runs to its end for the cache whoever cancels: a prefetch, or typed through
    waiters: int = 0  # requests waiting on it besides the one that started it
    finished: bool = False
    suggestion: Suggestion | None = None  # what it answered, once finished with text


class CompletionCancelled(Exception):
    """The server dropped the request; `reason` is one of CANCEL_REASONS."""

    def __init__(self, reason: str) -> None:
        super().__init__(CANCEL_REASONS.get(reason, reason or "cancelled"))
        self.reason = reason


class CompletionFailed(Exception):
    """The engine failed on this request."""


class ClientSession:
    def __init__(self, shared: SharedState) -> None:
        self.shared = shared
        self.id = next(shared.clients)
        self.settings = shared.defaults
        limits = shared.limits
        self.documents = DocumentStore(
            DocumentLimits(
                limits.max_document_bytes, limits.max_client_bytes, limits.max_documents, limits.max_changes
            ),
            on_limit=self._limit_hit,
        )
        self.limits_hit: dict[str, int] = {}  # refusals by limit, this client's
        self.recent = RecentRequests()
        self.languages: dict[str, bool] = {}  # language id -> completions wanted ("*": the rest)
        self.suggestions = SuggestionCache()
        self._running: dict[str, _Running] = {}  # uri -> its completion in flight
        self._accepted: dict[str, tuple[Suggestion, int]] = {}  # uri -> an accept whose edit has not come
        self._told_full = False  # "too many documents" was told and no document closed since
        self._seeds = itertools.count()
        self._warm_timer: asyncio.TimerHandle | None = None
        shared.live_clients.add(self.id)

    def doc_id(self, uri: str) -> str:
        return f"{self.id}:{uri}"

    # -- lifecycle -------------------------------------------------------------------------------

    def configure(self, options: object, position_encoding: str | None = None) -> None:
        """Apply initializationOptions (or a configuration change); raises InvalidOptions."""
        settings = apply_options(self.settings, options)
        languages = apply_languages(self.languages, options)
        if needs_draft_model(settings.draft) and not self.shared.draft_model_loaded:
            raise InvalidOptions(
                f"draft {settings.draft!r} needs a draft model; this server was started without --draft-model"
            )
        self.settings = settings
        self.languages = languages
        if position_encoding:
            self.documents.encoding = position_encoding

    def disconnect(self) -> None:
        """The connection is gone: cancel its requests and take its documents out of the corpus."""
        if self._warm_timer is not None:
            self._warm_timer.cancel()
        self.shared.worker.cancel(lambda job: job.client == self.id, "disconnected")
        for uri in self.documents.uris:
            self.shared.corpus.remove(self.doc_id(uri))
            self.documents.close(uri)
        self.shared.live_clients.discard(self.id)

    # -- documents -------------------------------------------------------------------------------

    def open(self, uri: str, text: str, version: int, language_id: str) -> str | None:
        """Returns why the document was refused, to tell the client, or None.

        "Too many documents" is told once until a document closes: a client opening thousands
        must not get thousands of messages back.
        """
        full_before = self.limits_hit.get("documents", 0)
        refused = self.documents.open(uri, text, version, language_id)
        self._feed(uri, refused)
        if refused is None:
            # no cursor yet: the whole file, whose prefixes later requests reuse
            self._schedule_warm(uri, None, WARM_OPEN_IDLE_S)
        if refused and self.limits_hit.get("documents", 0) > full_before:
            if self._told_full:
                return None
            self._told_full = True
        return refused

    def change(self, uri: str, version: int, changes: list[TextChange]) -> str | None:
        was_refused = self.documents.is_refused(uri)
        refused = self.documents.change(uri, version, changes)
        self._feed(uri, refused)
        if refused is None and changes:
            cursor = self._edit_end(uri, changes[-1])
            self._schedule_warm(uri, cursor, WARM_IDLE_S)
            self._follow_edit(uri, cursor)
        return refused if refused and not was_refused else None

    def close(self, uri: str) -> None:
        self._told_full = False
        self.shared.worker.cancel(lambda job: job.key == (self.id, uri), "closed")
        self.suggestions.forget(uri)
        self._running.pop(uri, None)
        self._accepted.pop(uri, None)
        self.documents.close(uri)
        self.shared.corpus.remove(self.doc_id(uri))

    def refuse(self, uri: str, reason: str) -> None:
        """The client's message for `uri` was dropped: answer completions there with `reason`."""
        self.shared.worker.cancel(lambda job: job.key == (self.id, uri), "closed")
        self.documents.refuse(uri, reason)
        self.shared.corpus.remove(self.doc_id(uri))

    def _limit_hit(self, name: str) -> None:
        self.limits_hit[name] = self.limits_hit.get(name, 0) + 1
        self.shared.counters.count_limit(name)

    def _feed(self, uri: str, refused: str | None) -> None:
        if refused is None:
            self.shared.corpus.update(self.doc_id(uri), self.documents.get(uri).text)
        else:
            self.shared.corpus.remove(self.doc_id(uri))

    # -- warm-ups: prefill while the user types or reads ---------------------------------------------

    def _edit_end(self, uri: str, change: TextChange) -> int | None:
        """Offset just after the inserted text: where the cursor is after an edit (None: whole file)."""
        if change.range is None:
            return None
        (line, character), _ = change.range
        text = self.documents.get(uri).text  # text before the change's start is the same as before it
        return offset_at(text, line, character, self.documents.encoding, clamp_line=True) + len(change.text)

    def _schedule_warm(self, uri: str, cursor: int | None, idle_s: float) -> None:
        """Warm up once the documents settle for `idle_s`: each open or edit restarts the idle timer."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the server's loop (a unit test): nothing to schedule
            return
        if self._warm_timer is not None:
            self._warm_timer.cancel()
        self._warm_timer = loop.call_later(idle_s, self._warm, uri, cursor)

    def _warm(self, uri: str, cursor: int | None) -> None:
        self._warm_timer = None
        if uri not in self.documents or self.documents.is_refused(uri):
            return
        text = self.documents.get(uri).text
        offset = len(text) if cursor is None else min(cursor, len(text))
        self.shared.worker.warm(WarmJob(self.id, self._input(uri, _cursor_at(text, offset), seed=0)))

    def _input(self, uri: str, cursor: CursorContext, seed: int) -> CompletionInput:
        """What the worker needs for a completion at `cursor` (a warm-up builds the same)."""
        doc = self.documents.get(uri)
        return CompletionInput(
            uri=uri,
            cursor=cursor,
            language_id=doc.language_id,
            path=to_fs_path(uri) or uri,
            settings=self.settings,
            seed=seed,
            other_files=self._other_files(uri, doc.language_id),
        )

    # -- completions -----------------------------------------------------------------------------

    async def complete(
        self, uri: str, position: types.Position, on_text: Callable[[Completion], None] | None = None
    ) -> Completion:
        """The completion at a position: from the cache when an earlier completion answers it, else
        from a completion in flight that the user is typing through, else from the model.

        Raises DocumentError, ServerBusy, CompletionCancelled or CompletionFailed.

        on_text, when given, receives the completion so far as it grows (on the event loop's thread).
        """
        started = time.perf_counter()
        doc = self.documents.get(uri)
        cursor = cursor_context(doc.text, position.line, position.character, self.documents.encoding)
        clamped = types.Position(position.line, units_of(cursor.line_prefix, self.documents.encoding))
        if not language_enabled(self.languages, doc.language_id):
            return Completion("", cursor, clamped)
        request = self._input(uri, cursor, seed=next(self._seeds))
        state = cursor_state(request)
        hit = self.suggestions.lookup(uri, cursor.prefix, state)
        if hit is not None:
            return self._answer(uri, hit, cursor, clamped, started)
        running = self._running.get(uri)
        if running is not None and not running.finished:
            typed = typed_since(running.state, cursor.prefix, state)
            if typed is not None and running.streamed.startswith(typed):
                answer = await self._wait_on(uri, running, typed, cursor, clamped, started)
                if answer is not None:
                    return answer
        reporter = None
        if on_text is not None:
            reporter = _LatestText(
                asyncio.get_running_loop(), lambda text: on_text(Completion(text, cursor, clamped))
            )
        job = CompletionJob(client=self.id, input=request)
        running = self._start(uri, job, state, reporter.offer if reporter else None)
        try:
            # shielded: a client's cancel must not cancel job.result, whose outcome (with the stopped
            # run's stats) still reaches _remember
            outcome: CompletionOutcome = await asyncio.shield(asyncio.wrap_future(job.result))
        except asyncio.CancelledError:
            if not running.kept and running.waiters == 0:  # nobody else wants its result
                self.shared.worker.cancel(lambda queued: queued is job, "client")
            raise
        if outcome.error:
            raise CompletionFailed(f"the completion failed: {outcome.error}")
        if outcome.cancelled:
            raise CompletionCancelled(outcome.reason)
        if reporter is not None:
            reporter.finish(outcome.text)
        self._finished(uri, running, job.result)
        suggestion = running.suggestion.id if running.suggestion is not None else ""
        return Completion(outcome.text, cursor, clamped, suggestion)

    def _start(
        self, uri: str, job: CompletionJob, state: CursorState, forward: Callable[[str], None] | None
    ) -> _Running:
        """Submit a model job for `uri` and follow it: its text so far, and its result into the cache."""
        running = _Running(job, state, kept=job.prefetch)

        def on_text(text: str) -> None:  # worker thread
            running.streamed = text
            if forward is not None:
                forward(text)

        job.on_text = on_text
        loop = asyncio.get_running_loop()
        job.result.add_done_callback(lambda done: self._remember(uri, done, job.prefetch))
        job.result.add_done_callback(lambda done: _call_soon(loop, self._finished, uri, running, done))
        self.shared.worker.submit(job)
        self._running[uri] = running
        return running

    def _finished(self, uri: str, running: _Running, done: Future) -> None:
        """A job ended (event loop): keep its completion for later requests. Safe to call twice."""
        if running.finished:
            return
        running.finished = True
        if self._running.get(uri) is running:
            del self._running[uri]
        if done.cancelled() or done.exception() is not None or uri not in self.documents:
            return
        outcome: CompletionOutcome = done.result()
        if outcome.text and not outcome.cancelled and not outcome.error:
            request = running.job.input
            running.suggestion = self.suggestions.add(
                uri, running.state, outcome.text, request.settings.draft, request.language_id
            )

    async def _wait_on(
        self,
        uri: str,
        running: _Running,
        typed: str,
        cursor: CursorContext,
        clamped: types.Position,
        started: float,
    ) -> Completion | None:
        """Answer with the rest of a completion in flight once it ends; None if it did not go on as
        typed (then the model is asked anew)."""
        running.waiters += 1
        try:
            await asyncio.shield(asyncio.wrap_future(running.job.result))
        finally:
            running.waiters -= 1
        self._finished(uri, running, running.job.result)
        if running.suggestion is None or remainder(running.suggestion.text, typed) is None:
            return None
        return self._answer(uri, Hit(running.suggestion, typed), cursor, clamped, started)

    def _answer(
        self, uri: str, hit: Hit, cursor: CursorContext, clamped: types.Position, started: float
    ) -> Completion:
        """Answer from an earlier completion: no model call (counted in cache_hits)."""
        self.shared.counters.count("cache_hits")
        elapsed = time.perf_counter() - started
        self.recent.add(uri, Stats(ttft_s=elapsed, wall_s=elapsed), kind="cache")
        skipped = units_of(hit.typed, self.documents.encoding)
        return Completion(hit.text, cursor, clamped, hit.suggestion.id, skipped)

    def _follow_edit(self, uri: str, cursor: int | None) -> None:
        """After an edit: a completion in flight that the edit types through is kept running (for the
        request that will follow); a kept one that the edit does not type through is cancelled. An
        accept whose edit had not arrived is tried again."""
        running = self._running.get(uri)
        if running is not None and not running.finished:
            typed = None
            if cursor is not None:
                text = self.documents.get(uri).text
                around = _cursor_at(text, min(cursor, len(text)))
                state = cursor_state(self._input(uri, around, seed=0))
                typed = typed_since(running.state, around.prefix, state)
            if typed is not None and running.streamed.startswith(typed):
                running.kept = running.kept or bool(typed)
            elif running.kept:
                job = running.job
                self.shared.worker.cancel(lambda queued: queued is job, "edited")
        accepted = self._accepted.pop(uri, None)
        if accepted is not None:
            self._prefetch_after(*accepted, retry=False)

    # -- what the editor reports about suggestions ---------------------------------------------------

    def shown(self, suggestion_id: str) -> None:
        """The editor showed a suggestion (counted once, however often it is shown again)."""
        suggestion = self.suggestions.get(suggestion_id)
        if suggestion is None or suggestion.shown:
            return
        suggestion.shown = True
        self.shared.counters.count_suggestion("shown", suggestion.draft, suggestion.language_id)

    def accepted(self, suggestion_id: str, skipped: int, accepted_length: int | None = None) -> None:
        """The user accepted a suggestion: wholly (accepted_length None), or its first `skipped` +
        `accepted_length` code units. Then the next completion starts at the new cursor (prefetch).

        Raises SuggestionError when the lengths run past the suggestion's text.
        """
        suggestion = self.suggestions.get(suggestion_id)
        if suggestion is None:  # an old one, dropped from the cache: nothing to count or start
            return
        counters = self.shared.counters
        if accepted_length is None:
            chars = len(suggestion.text)
            if not suggestion.accepted:
                suggestion.accepted = True
                counters.count_suggestion("accepted", suggestion.draft, suggestion.language_id)
        else:
            units = skipped + accepted_length
            if units > units_of(suggestion.text, self.documents.encoding):
                raise SuggestionError(
                    f"skipped + acceptedLength ({skipped} + {accepted_length}) is longer than the suggestion "
                    f"({units_of(suggestion.text, self.documents.encoding)} code units)"
                )
            chars = index_of_units(suggestion.text, units, self.documents.encoding)
            gained = chars - suggestion.accepted_chars
            if gained > 0:
                event = "partially_accepted" if suggestion.accepted_chars == 0 else ""
                suggestion.accepted_chars = chars
                counters.count_suggestion(event, suggestion.draft, suggestion.language_id, gained)
        self._prefetch_after(suggestion, chars)

    def _prefetch_after(self, suggestion: Suggestion, chars: int, retry: bool = True) -> None:
        """Start the completion after the first `chars` of an accepted suggestion, at once, on the KV
        prefix its own generation left warm; the result is kept for the request that follows.

        The document must read as the suggestion's state with those characters inserted; if the
        edit has not arrived yet, this is tried once more after the next one.
        """
        uri = suggestion.uri
        if uri not in self.documents or self.documents.is_refused(uri):
            return
        text = self.documents.get(uri).text
        known = suggestion.state
        offset = known.prefix_len + chars
        if not (
            len(text) == offset + known.suffix_len
            and text[known.prefix_len : offset] == suggestion.text[:chars]
            and hash(text[offset:]) == known.suffix_hash
            and hash(text[: known.prefix_len]) == known.prefix_hash
        ):
            if retry:
                self._accepted[uri] = (suggestion, chars)
            return
        cursor = _cursor_at(text, offset)
        request = self._input(uri, cursor, seed=next(self._seeds))
        state = cursor_state(request)
        running = self._running.get(uri)
        if self.suggestions.lookup(uri, cursor.prefix, state) is not None or (
            running is not None and not running.finished and running.state == state
        ):
            return  # already known (after a partial accept, the rest of the suggestion) or under way
        try:
            self._start(uri, CompletionJob(client=self.id, input=request, prefetch=True), state, None)
        except ServerBusy:
            pass  # the queue is full of real requests: they go first

    def _remember(self, uri: str, done: Future, prefetch: bool) -> None:  # worker thread
        if not done.cancelled() and done.exception() is None and done.result().stats != Stats():
            self.recent.add(uri, done.result().stats, "prefetch" if prefetch else "model")

    def _other_files(self, uri: str, language_id: str) -> tuple[tuple[str, str], ...]:
        """The client's other open documents of the same language, when cross-file context is on."""
        if self.settings.cross_file_tokens <= 0:
            return ()
        others = []
        for other in self.documents.uris:
            if other != uri and not self.documents.is_refused(other):
                document = self.documents.get(other)
                if document.language_id == language_id:
                    others.append((to_fs_path(other) or other, document.text))
        return tuple(others)


def _cursor_at(text: str, offset: int) -> CursorContext:
    line_start = text.rfind("\n", 0, offset) + 1
    return CursorContext(prefix=text[:offset], suffix=text[offset:], line_prefix=text[line_start:offset])


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable, *args) -> None:
    """Run `callback` on the loop's thread (from any thread); nothing when the loop is closed."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass


class _LatestText:
    """Carries the growing completion from the worker thread to the event loop, latest first.

    The worker offers text after every verify step; the loop sends only the newest it has not sent
    (a slow client gets fewer, larger steps, never a backlog). `finish` sends the final text when it
    differs from the last one sent, so the last partial result always has the final result's text.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[str], None]) -> None:
        self._loop = loop
        self._send = send
        self._lock = threading.Lock()
        self._latest: str | None = None
        self._scheduled = False
        self.sent: str | None = None

    def offer(self, text: str) -> None:  # worker thread
        with self._lock:
            self._latest = text
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _flush(self) -> None:
        with self._lock:
            text, self._scheduled = self._latest, False
        if text is not None and text != self.sent:
            self.sent = text
            self._send(text)

    def finish(self, final: str) -> None:
        if self.sent is not None and final != self.sent:
            self.sent = final
            self._send(final)
