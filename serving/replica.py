"""One engine replica: a Ray Serve deployment that owns a CompletionEngine and its model worker.

The replica runs the same ModelWorker as the single-process server (fair queue, superseding,
cancellation once per verify step, warm-ups), fed by the front end instead of by LSP sessions:
each call carries the document updates of the sessions routed here, which this replica's n-gram
corpus applies before the request runs. Completions stream back as messages:

    {"text": "the visible completion so far"}   zero or more, newest text only
    {"outcome": CompletionOutcome}              exactly one, last

Cancelling the stream (the front end's request was cancelled or superseded) cancels the job; so
does `cancel(request_id, reason)`, which also carries the reason back in the outcome.

All replicas are one deployment, and every call names the replica it is meant for (`replica=`, see
serving/affinity.py). A replica that gets a call meant for another (which Serve had just removed)
refuses it with ReplicaMismatch, so the front end never believes a replica holds documents it was
never sent.
"""

from __future__ import annotations

import asyncio
import os
import threading
from dataclasses import dataclass

from ray import serve

from completion_engine.config import EngineConfig
from completion_engine.types import Stats
from lsp_server.worker import CompletionInput, CompletionJob, CompletionOutcome, ServerBusy, WarmJob

CANCELLED_EARLY_KEPT = 1024
DocumentUpdate = tuple[str, str | None]  # (doc_id, latest text or None when it was closed)


class ReplicaMismatch(RuntimeError):
    """A call meant for another replica reached this one."""


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    engine: EngineConfig
    queue_size: int
    corpus_tokens: int


# The front end cancels its requests before it stops the deployment: a replica need not wait the
# default 20 s for them to drain.
@serve.deployment(
    max_ongoing_requests=256,
    health_check_period_s=1.0,
    health_check_timeout_s=30.0,
    graceful_shutdown_timeout_s=5.0,
)
class EngineReplica:
    def __init__(self, config: ReplicaConfig) -> None:
        from completion_engine.engine import CompletionEngine  # torch loads here, in the replica
        from lsp_server.corpus import CorpusFeed
        from lsp_server.stats import ServerCounters
        from lsp_server.worker import ModelWorker

        self.counters = ServerCounters()
        self.corpus = CorpusFeed(config.corpus_tokens)
        # built on the worker's thread, which makes every torch call (ModelWorker says why)
        self.worker = ModelWorker.loading(
            lambda: CompletionEngine.from_config(config.engine), self.corpus, self.counters, config.queue_size
        )
        self.jobs: dict[str, CompletionJob] = {}
        self.cancelled_early: dict[str, str] = {}  # request id -> reason: the cancel overtook the request
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    def _check(self, replica: str | None) -> None:
        if replica is not None and replica != self.replica_id:
            raise ReplicaMismatch(f"a call for replica {replica} reached replica {self.replica_id}")

    def _apply(self, updates: list[DocumentUpdate]) -> None:
        for doc_id, text in updates:
            if text is None:
                self.corpus.remove(doc_id)
            else:
                self.corpus.update(doc_id, text)

    async def complete(
        self,
        request_id: str,
        client: int,
        request: CompletionInput,
        updates: list[DocumentUpdate],
        *,
        replica: str,
    ):
        self._check(replica)
        self._apply(updates)
        if request_id in self.cancelled_early:
            self.counters.count("cancelled")
            reason = self.cancelled_early.pop(request_id)
            yield {"outcome": CompletionOutcome("", Stats(), cancelled=True, reason=reason)}
            return
        loop = asyncio.get_running_loop()
        grown = asyncio.Event()
        latest: list[str] = [""]

        def on_text(text: str) -> None:  # the model worker's thread
            latest[0] = text
            loop.call_soon_threadsafe(grown.set)

        job = CompletionJob(client=client, input=request, on_text=on_text)
        try:
            self.worker.submit(job)
        except ServerBusy as busy:
            yield {"outcome": CompletionOutcome("", Stats(), error=f"busy: {busy}")}
            return
        self.jobs[request_id] = job
        result = asyncio.wrap_future(job.result)
        sent = ""
        try:
            while not result.done():
                waiter = asyncio.ensure_future(grown.wait())
                await asyncio.wait({waiter, result}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                grown.clear()
                if latest[0] != sent and not result.done():
                    sent = latest[0]
                    yield {"text": sent}
            yield {"outcome": result.result()}
        finally:  # the stream ended early (cancelled by the caller): stop the generation here too
            self.jobs.pop(request_id, None)
            if not job.result.done():
                self.worker.cancel(lambda running: running is job, "client")

    def cancel(self, request_id: str, reason: str, *, replica: str) -> bool:
        self._check(replica)
        job = self.jobs.get(request_id)
        if job is None:  # not arrived yet (calls may overtake each other), or already answered
            self.cancelled_early[request_id] = reason
            while len(self.cancelled_early) > CANCELLED_EARLY_KEPT:
                del self.cancelled_early[next(iter(self.cancelled_early))]
            return False
        self.worker.cancel(lambda running: running is job, reason)
        return True

    def warm(
        self, client: int, completion_input: CompletionInput, updates: list[DocumentUpdate], *, replica: str
    ) -> None:
        self._check(replica)
        self._apply(updates)
        self.worker.warm(WarmJob(client, completion_input))

    def forget(self, updates: list[DocumentUpdate], *, replica: str) -> None:
        """Closed documents: take them out of the corpus."""
        self._check(replica)
        self._apply(updates)

    def stats(self, *, replica: str) -> dict:
        self._check(replica)
        return self.counters.snapshot(
            {
                "queued": self.worker.queued,
                "running": len(self.jobs),
                "pid": os.getpid(),
                "threads": threading.active_count(),
                "corpus_documents": self.corpus.documents,
                "corpus_tokens": self.corpus.total_tokens,
                "max_rss_kb": _max_rss_kb(),
            }
        )

    def ping(self, *, replica: str | None = None) -> int:
        """This replica's pid; `replica=None` asks any replica (the front end's first call)."""
        self._check(replica)
        return os.getpid()

    def __del__(self) -> None:
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.stop(timeout_s=5.0)


def _max_rss_kb() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
