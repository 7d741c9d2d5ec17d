"""The front end's side of the replicas: a worker with ModelWorker's interface that runs jobs remotely.

ClientSession calls `submit`, `cancel`, `warm` and reads `queued` exactly as it does with the local
ModelWorker; RemoteWorker routes each job by its session (client, document) through a SessionTable,
sends the replica the document updates of that client it has not seen yet (DocumentMirror), and
streams the answer back over the deployment handle. Everything here runs on the event loop's
thread, and nothing imports torch.

The replicas are one Ray Serve deployment reached through one handle; every call names its replica
(serving/affinity.py). Which replicas exist changes as Serve scales the deployment or replaces a dead
replica: Serve's router reports each change (`replicas_changed`, from its own thread), a new replica
takes new sessions at once, and a removed one's sessions move on their next request, their new
replica getting the client's documents from the mirror. Requests already running on a removed
replica finish there (Serve stops a replica once its requests are done, or after its graceful
shutdown timeout, which fails them over like a crash).

Failures: a replica that errors at the Ray level (its process died, it is being replaced, it was
removed and refused a call meant for it) is marked down; its sessions move on their next request,
and the request in flight is retried once on another replica (which gets the client's documents
first). A second failure answers the request with an error that says so. A replica marked down comes
back once it answers a ping again, unless Serve removed it meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from completion_engine.types import Stats
from lsp_server.stats import ServerCounters
from lsp_server.worker import CompletionJob, CompletionOutcome, ServerBusy, WarmJob, resolve_outcome
from serving.routing import OVERLOAD_AT, SessionTable

logger = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.5  # how often a replica marked down is pinged
PROBE_TIMEOUT_S = 5.0
STATS_INTERVAL_S = 2.0  # how often replica-side stats (pid, queue, memory) are fetched
# A replica that sends nothing on a request (no text, no answer) for this long is treated as failed:
# the request is retried once on another replica. Generous: a request may wait in the replica's
# queue behind others, and a cold 4k-token prefill takes some 20 s on one CPU core.
STALL_S = 300.0


def client_of(doc_id: str) -> int:
    """doc ids are "client:uri" (ClientSession.doc_id).

    >>> client_of("3:file:///a.py")
    3
    """
    return int(doc_id.split(":", 1)[0])


class DocumentMirror:
    """The latest text of every open document, and which version each replica was sent.

    Plays CorpusFeed's part in SharedState (update/remove from the sessions); `updates_for` is what a
    replica must apply before serving a client: that client's new or changed documents, plus every
    removal the replica has not heard of.
    """

    def __init__(self) -> None:
        self._texts: dict[str, tuple[int, str]] = {}  # doc_id -> (version, text)
        self._sent: dict[str, dict[str, int]] = {}  # replica -> doc_id -> version sent
        self._versions = itertools.count(1)
        self.on_removed: Callable[[str], None] | None = None

    @property
    def documents(self) -> int:
        return len(self._texts)

    @property
    def total_tokens(self) -> int | None:  # counted by the replicas, not here
        return None

    def update(self, doc_id: str, text: str) -> None:
        self._texts[doc_id] = (next(self._versions), text)

    def remove(self, doc_id: str) -> None:
        self._texts.pop(doc_id, None)
        if self.on_removed is not None:
            self.on_removed(doc_id)

    def updates_for(self, replica: str, client: int) -> list[tuple[str, str | None]]:
        sent = self._sent.setdefault(replica, {})
        updates: list[tuple[str, str | None]] = [
            (doc_id, None) for doc_id in sent if doc_id not in self._texts
        ]
        for doc_id, _ in updates:
            del sent[doc_id]
        for doc_id, (version, text) in self._texts.items():
            if client_of(doc_id) == client and sent.get(doc_id) != version:
                updates.append((doc_id, text))
                sent[doc_id] = version
        return updates

    def forget(self, replica: str) -> None:
        """The replica lost its state (it died): send it everything again."""
        self._sent.pop(replica, None)


class ReplicaStalled(Exception):
    """A replica sent nothing on a request for RemoteWorker.stall_s: treated as a failed replica."""


class RemoteWorker:
    def __init__(
        self,
        handle,  # the replicas' DeploymentHandle; which replicas exist comes through replicas_changed
        mirror: DocumentMirror,
        counters: ServerCounters,
        queue_size: int,
        overload_at: int = OVERLOAD_AT,
        on_stop: Callable[[], None] | None = None,
        stall_s: float = STALL_S,
    ) -> None:
        self.handle = handle
        self.stall_s = stall_s  # a replica silent this long on a request counts as failed
        self.mirror = mirror
        self.counters = counters  # totals over every replica
        self.queue_size = queue_size
        self.table = SessionTable((), overload_at)
        self.per_replica: dict[str, ServerCounters] = {}
        self.remote_stats: dict[str, dict] = {}
        from serving.metrics import ReplicaMetrics  # prometheus_client: the serve extra

        self.metrics = ReplicaMetrics()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reported: frozenset[str] | None = None  # the latest set Serve reported, not yet applied
        self._report_lock = threading.Lock()
        self._inflight: dict[CompletionJob, tuple[str, str]] = {}  # job -> (replica, request id)
        self._runs: dict[CompletionJob, asyncio.Task] = {}  # job -> the task running it
        self._tasks: set[asyncio.Task] = set()
        self._probing: set[str] = set()
        self._request_ids = itertools.count(1)
        self._on_stop = on_stop
        self._stats_task: asyncio.Task | None = None
        self.retried = 0  # requests sent again after their replica failed
        mirror.on_removed = self._document_closed

    # -- ModelWorker's interface -------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return sum(self.table.outstanding.values())

    def submit(self, job: CompletionJob) -> None:
        """Send the job to its session's replica; ServerBusy when no replica can take it."""
        self._attach()
        self.counters.count(job.asked)
        self.cancel(lambda other: other.key == job.key, "superseded")
        replica = self.table.route(job.key)
        if replica is None:
            self.counters.count("busy")
            raise ServerBusy(
                "no engine replica is available right now (all are restarting); try again shortly"
            )
        if self.table.outstanding[replica] > self.queue_size:
            self.counters.count("busy")
            raise ServerBusy(
                f"the server is busy: {self.table.outstanding[replica]} requests are waiting on {replica} "
                f"(the limit is {self.queue_size}); try again shortly"
            )
        self._begin(job, replica)
        self._runs[job] = self._spawn(self._run(job, replica))

    def cancel(self, predicate: Callable[[CompletionJob], bool], reason: str) -> None:
        for job, (replica, request_id) in list(self._inflight.items()):
            if predicate(job) and not job.cancel.is_set():
                job.stop(reason)
                self._spawn(self._cancel_remote(job, replica, request_id, reason))

    def warm(self, job: WarmJob) -> None:
        self._attach()
        replica = self.table.route((job.client, job.input.uri))
        if replica is None:
            return
        updates = self.mirror.updates_for(replica, job.client)
        self._spawn(self._call(replica, "warm", job.client, job.input, updates))

    def stop(self, timeout_s: float = 30.0) -> None:
        for job in list(self._inflight):
            job.stop("shutdown")
        for task in [*self._tasks, self._stats_task]:
            if task is not None and not task.get_loop().is_closed():
                task.cancel()
        if self._on_stop is not None:
            self._on_stop()

    # -- one request -------------------------------------------------------------------------------

    async def _run(self, job: CompletionJob, replica: str) -> None:
        """Run the job, retrying once on another replica if the first fails at the Ray level."""
        try:
            await self._attempts(job, replica)
        finally:
            self._runs.pop(job, None)

    async def _attempts(self, job: CompletionJob, replica: str) -> None:
        failures: list[str] = []
        for attempt in range(2):
            try:
                outcome = await self._stream(job, replica)
            except asyncio.CancelledError:
                cancelled = CompletionOutcome("", Stats(), cancelled=True, reason=job.reason or "shutdown")
                resolve_outcome(job, cancelled)
                raise
            except Exception as error:  # the replica died or is being replaced
                logger.warning("replica %s failed during a request: %s", replica, _short(error))
                failures.append(f"{replica}: {_short(error)}")
                self._mark_down(replica)
                if job.cancel.is_set():
                    self._finish(
                        job, replica, CompletionOutcome("", Stats(), cancelled=True, reason=job.reason)
                    )
                    return
                replica = self.table.route(job.key) if attempt == 0 else None
                if replica is None:
                    break
                self.retried += 1
                self._begin(job, replica)
                continue
            self._finish(job, replica, outcome)
            return
        self.counters.count("errors")
        reason = "; ".join(failures) or "no replica is available"
        resolve_outcome(job, CompletionOutcome("", Stats(), error=f"the engine replica failed ({reason})"))

    def _begin(self, job: CompletionJob, replica: str) -> None:
        """Count the job against its replica at once (routing reads it) and make it cancellable."""
        self._inflight[job] = (replica, f"r{next(self._request_ids)}")
        self.table.begin(replica)
        self.per_replica[replica].count(job.asked)
        self.metrics.queue(replica, self.table.outstanding[replica])

    async def _stream(self, job: CompletionJob, replica: str) -> CompletionOutcome:
        _, request_id = self._inflight[job]
        outcome = stream = None
        try:
            if job.cancel.is_set():  # cancelled before it was sent
                return CompletionOutcome("", Stats(), cancelled=True, reason=job.reason)
            updates = self.mirror.updates_for(replica, job.client)
            stream = self.handle.options(stream=True).complete.remote(
                request_id, job.client, job.input, updates, replica=replica
            )
            messages = aiter(stream)
            while True:
                try:  # a replica that hangs must not hold the request (and its client) forever
                    async with asyncio.timeout(self.stall_s):
                        message = await anext(messages)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    stream.cancel()
                    raise ReplicaStalled(f"sent nothing for {self.stall_s:g} s") from None
                if "text" in message and job.on_text is not None:
                    job.on_text(message["text"])
                elif "outcome" in message:
                    outcome = message["outcome"]
        except asyncio.CancelledError:
            if stream is not None:
                stream.cancel()
            raise
        finally:
            self._inflight.pop(job, None)
            self.table.end(replica)
            self.metrics.queue(replica, self.table.outstanding.get(replica, 0))
        if outcome is None:
            raise RuntimeError("the replica's stream ended without an answer")
        return outcome

    def _finish(self, job: CompletionJob, replica: str, outcome: CompletionOutcome) -> None:
        if outcome.cancelled and job.reason:  # the front end knows why (superseded, closed, ...)
            outcome = replace(outcome, reason=job.reason)
        # a replica Serve removed while this ran has no counters left: the totals still count it
        counted = [self.counters, *([self.per_replica[replica]] if replica in self.per_replica else [])]
        for counters in counted:
            if outcome.cancelled:
                counters.count(job.dropped)
            elif outcome.error:
                counters.count("errors")
        if outcome.stats.tokens or outcome.stats.wall_s:
            for counters in counted:
                counters.record(outcome.stats, job.input.uri, outcome.cancelled, user_facing=not job.prefetch)
            self.metrics.record(replica, outcome.stats, outcome.cancelled)
        resolve_outcome(job, outcome)

    # -- replicas appearing and disappearing (Serve scaled the deployment or replaced a replica) ----------

    def replicas_changed(self, replicas: frozenset[str]) -> None:
        """Serve's router reports the running replicas (from its own thread); applied on the event loop."""
        with self._report_lock:
            self._reported = replicas
            loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._apply_reported)

    def _apply_reported(self) -> None:
        with self._report_lock:
            reported, self._reported = self._reported, None
        if reported is not None:
            self._apply_members(reported)

    def _apply_members(self, replicas: frozenset[str]) -> None:
        change = self.table.set_members(replicas)
        for replica in change.added:
            self.per_replica[replica] = ServerCounters()
            self.remote_stats[replica] = {}
            self.metrics.healthy(replica, True)
            self.metrics.queue(replica, self.table.outstanding[replica])
        for replica in change.removed:
            self.mirror.forget(replica)
            self.remote_stats.pop(replica, None)
            self.metrics.healthy(replica, False)
        if change.added or change.removed:
            logger.warning(
                "replicas now %s (+%s, -%s); %d sessions move",
                sorted(replicas),
                change.added,
                change.removed,
                len(change.moved),
            )

    def _attach(self) -> None:
        """Bind to the running event loop, and apply the change Serve reported last, if not yet done."""
        if self._loop is None:
            with self._report_lock:
                self._loop = asyncio.get_running_loop()
        self._apply_reported()

    # -- replicas going down and coming back ---------------------------------------------------------

    def _mark_down(self, replica: str) -> None:
        if not self.table.healthy.get(replica):  # already down, or removed by Serve
            return
        moved = self.table.mark_down(replica)
        self.mirror.forget(replica)
        self.metrics.healthy(replica, False)
        logger.warning("replica %s is down; %d sessions move", replica, len(moved))
        if replica not in self._probing:
            self._probing.add(replica)
            self._spawn(self._probe(replica))

    async def _probe(self, replica: str) -> None:
        """Ping until the replica answers again, or Serve removes it (a daemon loop of the server)."""
        try:
            while replica in self.table.healthy:
                try:
                    async with asyncio.timeout(PROBE_TIMEOUT_S):
                        await self.handle.ping.remote(replica=replica)
                    break
                except Exception:
                    await asyncio.sleep(PROBE_INTERVAL_S)
            else:
                return
            self.mirror.forget(replica)  # a fresh process: it holds no documents
            self.table.mark_up(replica)
            self.metrics.healthy(replica, True)
            logger.warning("replica %s is back", replica)
        finally:
            self._probing.discard(replica)

    def _document_closed(self, doc_id: str) -> None:
        client, _, uri = doc_id.partition(":")
        self.table.forget((int(client), uri))
        for replica, healthy in self.table.healthy.items():
            if healthy:
                updates = self.mirror.updates_for(replica, -1)  # removals only
                if updates:
                    self._spawn(self._call(replica, "forget", updates))

    async def _call(self, replica: str, method: str, *args) -> None:
        try:
            await getattr(self.handle, method).remote(*args, replica=replica)
        except Exception as error:
            logger.warning("replica %s failed a %s call: %s", replica, method, _short(error))
            self._mark_down(replica)

    async def _cancel_remote(self, job: CompletionJob, replica: str, request_id: str, reason: str) -> None:
        """Cancel on the replica, which reports the reason back; else cancel the stream itself.

        The call fails when the replica died (the stream reports that) or when Serve removed it and
        its router no longer reaches it by name while it finishes its requests: then cancelling the
        stream still reaches it, and the job ends cancelled at once.
        """
        try:
            await self.handle.cancel.remote(request_id, reason, replica=replica)
        except Exception as error:
            logger.info("cancel on %s failed (%s): cancelling the stream", replica, _short(error))
            if job in self._runs:
                self._runs[job].cancel()

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._stats_task is None:
            self._stats_task = asyncio.get_running_loop().create_task(self._poll_stats())
        return task

    # -- stats --------------------------------------------------------------------------------------

    async def _poll_stats(self) -> None:
        """Replica-side figures (pid, queue, memory, warm-ups) for specComplete/stats and /metrics."""
        while True:
            for replica in self.table.members:
                if not self.table.healthy.get(replica):
                    continue
                try:
                    async with asyncio.timeout(PROBE_TIMEOUT_S):  # not wait_for: 3.11's can eat a cancel
                        stats = await self.handle.stats.remote(replica=replica)
                    if replica in self.remote_stats:  # not removed while it answered
                        self.remote_stats[replica] = stats
                except Exception:
                    pass  # the request path notices a dead replica
            await asyncio.sleep(STATS_INTERVAL_S)

    def replica_stats(self) -> list[dict]:
        self._attach()
        loads = self.table.loads()
        entries = []
        for name in self.table.members:
            local = self.per_replica[name].snapshot()
            remote = self.remote_stats.get(name, {})
            entries.append(
                {
                    "name": name,
                    "healthy": loads[name].healthy,
                    "sessions": loads[name].sessions,
                    "queue": loads[name].outstanding,
                    "requests": local["requests"],
                    "cancelled": local["cancelled"],
                    "tokens": local["tokens"],
                    "ttft_p50_s": local["ttft_p50_s"],
                    "ttft_p95_s": local["ttft_p95_s"],
                    "tokens_per_s": local["tokens_per_s"],
                    "acceptance": local["acceptance"],
                    "pid": remote.get("pid"),
                    "replica_queued": remote.get("queued"),
                    "warmups": remote.get("warmups"),
                    "corpus_documents": remote.get("corpus_documents"),
                    "max_rss_kb": remote.get("max_rss_kb"),
                }
            )
        return entries


def _short(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first[:200]}"
