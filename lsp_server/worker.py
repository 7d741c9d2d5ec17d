"""The one model worker: a thread that owns the engine and runs every client's completions in turn.

Clients submit jobs from the event loop; the worker takes them from a fair, bounded queue. A job
is cancelled through its Event, which the engine checks once per verify step, so a cancelled,
superseded or disconnected request frees the worker within one step. Results come back through a
concurrent Future; streamed text goes through the job's `on_text` callback.

Warm-ups: when the worker has nothing queued, it prefills the context that the next request at the
latest edit will need (`WarmJob`, one slot, the newest wins), so that request finds its KV prefix
ready. Any real request cancels a warm-up within one layer; what was done stays in the cache.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace

from completion_engine.completion import CompletionOptions, Cursor, build_prompt, complete
from completion_engine.types import Stats
from lsp_server.corpus import CorpusFeed
from lsp_server.documents import CursorContext
from lsp_server.fair_queue import FairQueue, QueueFull
from lsp_server.stats import ServerCounters

logger = logging.getLogger(__name__)


class ServerBusy(Exception):
    """The queue is full; the message says so and how full."""


@dataclass(frozen=True, slots=True)
class CompletionInput:
    """Everything the worker needs for one completion (a snapshot: later edits do not touch it)."""

    uri: str
    cursor: CursorContext
    language_id: str
    path: str
    settings: CompletionOptions
    seed: int = 0
    other_files: tuple[tuple[str, str], ...] = ()  # (path, text) of the client's other open documents


@dataclass(frozen=True, slots=True)
class CompletionOutcome:
    text: str
    stats: Stats
    cancelled: bool = False
    reason: str = ""  # why it was cancelled: "client" | "superseded" | "closed" | "disconnected"
    error: str = ""  # set when the engine failed


@dataclass(slots=True, eq=False)
class CompletionJob:
    client: int  # the connection that asked
    input: CompletionInput
    on_text: Callable[[str], None] | None = None  # worker thread: the visible completion so far
    cancel: threading.Event = field(default_factory=threading.Event)
    reason: str = ""
    result: Future = field(default_factory=Future)  # Future[CompletionOutcome]
    prefetch: bool = False  # started after an accept, before the editor asked: counted apart

    @property
    def key(self) -> tuple[int, str]:
        """Jobs with the same key supersede each other: one client's one document."""
        return self.client, self.input.uri

    def stop(self, reason: str) -> None:
        if not self.cancel.is_set():
            self.reason = reason
            self.cancel.set()

    @property
    def asked(self) -> str:
        """The counter this job adds to when it is asked for: "requests" or "prefetches"."""
        return "prefetches" if self.prefetch else "requests"

    @property
    def dropped(self) -> str:
        """The counter this job adds to when it is cancelled."""
        return "prefetches_cancelled" if self.prefetch else "cancelled"


@dataclass(slots=True, eq=False)
class WarmJob:
    """Prefill the context that a request with this input would use."""

    client: int
    input: CompletionInput  # as a completion at the edit would send it
    cancel: threading.Event = field(default_factory=threading.Event)


LOAD_INTERRUPT_WAIT_S = 60.0  # an interrupted load: how long to wait for the loading thread to finish


class ModelWorker:
    """Owns the engine; every engine call happens on this worker's thread.

    Build the engine on that thread too (`ModelWorker.loading`): torch's CPU ops run on OpenMP, and
    libgomp gives every thread that starts a parallel region a team of helper threads of its own.
    With the loading thread's team alive beside the worker's, libgomp counts more OpenMP threads
    than cores, cuts its spin-wait at barriers to about a thousand iterations, and every barrier
    sleeps in the kernel instead: measured on 2 cores, two threads, a 2k-token prefill took 7.5-8 s
    with the engine loaded on the main thread against 5.0 s with everything on one thread (about
    44,000 context switches against none).
    """

    def __init__(self, engine, corpus: CorpusFeed, counters: ServerCounters, queue_size: int) -> None:
        self.engine = engine
        self._build: Callable[[], object] | None = None  # set by `loading`: builds the engine first
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self.corpus = corpus
        self.counters = counters
        self._queue: FairQueue[CompletionJob] = FairQueue(queue_size)
        self._running: CompletionJob | None = None
        self._warm: WarmJob | None = None  # the pending warm-up
        self._warming: WarmJob | None = None  # the running one
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="model-worker", daemon=True)

    @classmethod
    def loading(
        cls, build: Callable[[], object], corpus: CorpusFeed, counters: ServerCounters, queue_size: int
    ) -> ModelWorker:
        """Start a worker whose thread first builds the engine with `build()`, then serves.

        Returns once the engine is built; raises what `build` raised (the thread has then ended).
        """
        worker = cls(None, corpus, counters, queue_size)
        worker._build = build
        worker.start()
        return worker

    def start(self) -> None:
        self._thread.start()
        if self._build is None:
            return
        try:
            self._loaded.wait()
        except BaseException:  # Ctrl-C while loading: let the thread leave torch before the process exits
            with self._wake:
                self._stopping = True  # it returns as soon as the engine is built
            self._thread.join(LOAD_INTERRUPT_WAIT_S)
            raise
        if self._load_error is not None:
            self._thread.join()
            raise self._load_error

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the running job (it ends within one verify step) and wait for the thread.

        Waiting matters: a process that exits while this thread is inside a torch call aborts.
        """
        with self._wake:
            self._stopping = True
            if self._running is not None:
                self._running.stop("shutdown")
            self._wake.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def warm(self, job: WarmJob) -> None:
        """Prefill for `job` when the worker is idle; replaces (and cancels) any earlier warm-up."""
        with self._wake:
            for old in (self._warm, self._warming):
                if old is not None:
                    old.cancel.set()
            self._warm = job
            self._wake.notify()

    def submit(self, job: CompletionJob) -> None:
        """Queue a job, superseding older jobs of the same client and document; ServerBusy when full."""
        self.counters.count(job.asked)
        with self._wake:
            # a real request goes first: the warm-up stops within one layer, a pending one is dropped
            for warm in (self._warm, self._warming):
                if warm is not None:
                    warm.cancel.set()
            self._warm = None
            for old in self._queue.remove(lambda queued: queued.key == job.key):
                old.stop("superseded")
                self._finish_cancelled(old)
            if self._running is not None and self._running.key == job.key:
                self._running.stop("superseded")
            try:
                self._queue.put(job.client, job)
            except QueueFull as full:
                self.counters.count("busy")
                raise ServerBusy(f"the server is busy: {full}; try again shortly") from None
            self._wake.notify()

    def cancel(self, predicate: Callable[[CompletionJob], bool], reason: str) -> None:
        """Cancel every queued or running job the predicate selects."""
        with self._wake:
            for job in self._queue.remove(predicate):
                job.stop(reason)
                self._finish_cancelled(job)
            if self._running is not None and predicate(self._running):
                self._running.stop(reason)

    # -- the worker thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        if self._build is not None:
            try:
                self.engine = self._build()
            except BaseException as error:  # handed to start(), which raises it where it was asked for
                self._load_error = error
                return
            finally:
                self._loaded.set()
        while True:
            with self._wake:
                while not self._stopping and len(self._queue) == 0 and self._warm is None:
                    self._wake.wait()
                if self._stopping:
                    return
                if len(self._queue) == 0:
                    self._warming, self._warm = self._warm, None
                    job = None
                else:
                    job = self._queue.pop()
                    self._running = job
            if job is None:
                self._run_warm(self._warming)
                with self._wake:
                    self._warming = None
                continue
            try:
                outcome = self._run(job)
            except Exception as error:  # a failed generation must not take the worker down
                logger.exception("completion for %s failed", job.input.uri)
                self.counters.count("errors")
                outcome = CompletionOutcome("", Stats(), error=f"{type(error).__name__}: {error}")
            with self._wake:
                self._running = None
            resolve_outcome(job, outcome)

    def _run(self, job: CompletionJob) -> CompletionOutcome:
        if job.cancel.is_set():
            self.counters.count(job.dropped)
            return CompletionOutcome("", Stats(), cancelled=True, reason=job.reason)
        engine = self.engine
        self.corpus.sync(engine, engine.corpus.set_document)
        request_input = job.input
        result = complete(
            engine,
            completion_cursor(request_input),
            replace(request_input.settings, seed=request_input.seed),
            cancel=job.cancel,
            on_text=job.on_text,
        )
        stats = result.stats
        self.counters.record(stats, request_input.uri, result.cancelled, user_facing=not job.prefetch)
        logger.info(
            "%s: %d tokens, prefill %d, ttft %.3fs, %.3fs, %s%s",
            request_input.uri,
            stats.tokens,
            stats.prefill_tokens,
            stats.ttft_s,
            stats.wall_s,
            stats.stop_reason,
            f" ({job.reason})" if result.cancelled else "",
        )
        if result.cancelled:
            self.counters.count(job.dropped)
            return CompletionOutcome(result.raw_text, stats, cancelled=True, reason=job.reason)
        return CompletionOutcome(result.text, stats)

    def _run_warm(self, warm: WarmJob) -> None:
        if warm.cancel.is_set():
            return
        try:
            # the open documents' tokens for the drafters too: the request then finds them indexed
            self.corpus.sync(self.engine, self.engine.corpus.set_document)
            # the very prompt a request with this input builds (healing, FIM and other files included)
            options = replace(warm.input.settings, seed=warm.input.seed)
            prompt = build_prompt(self.engine, completion_cursor(warm.input), options)
            computed = self.engine.warm(prompt.context, warm.cancel)
        except Exception:  # a failed warm-up costs only time: the request computes what it needs
            logger.exception("warm-up for %s failed", warm.input.uri)
            return
        self.counters.count_warmup(computed, cancelled=warm.cancel.is_set())

    def _finish_cancelled(self, job: CompletionJob) -> None:
        self.counters.count(job.dropped)
        resolve_outcome(job, CompletionOutcome("", Stats(), cancelled=True, reason=job.reason))


def completion_cursor(request_input: CompletionInput) -> Cursor:
    """The engine's cursor for a request: what `build_prompt` turns into the exact token context."""
    cursor = request_input.cursor
    return Cursor(
        cursor.prefix, cursor.suffix, request_input.path, request_input.language_id, request_input.other_files
    )


def resolve_outcome(job: CompletionJob, outcome: CompletionOutcome) -> None:
    """Hand the outcome over, unless the waiting side already gave up on it."""
    if job.result.done():
        return
    try:
        job.result.set_result(outcome)
    except InvalidStateError:
        pass
