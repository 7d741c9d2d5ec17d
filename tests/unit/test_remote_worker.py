"""RemoteWorker without Ray: fake deployment handles that stream, fail or hang on cue.

The e2e tests (tests/e2e/test_replicas.py, test_autoscaling.py) run the real thing; these pin the
front end's rules where timing cannot make them flaky: affinity, a retry after a replica failure, a
clear error after two, nothing left counted against a replica afterwards, and replicas appearing
and disappearing as Serve scales.
"""

from __future__ import annotations

import asyncio

import pytest

from completion_engine.completion import CompletionOptions
from completion_engine.types import Stats
from lsp_server.documents import CursorContext
from lsp_server.stats import ServerCounters
from lsp_server.worker import CompletionInput, CompletionJob, CompletionOutcome
from serving.front import DocumentMirror, RemoteWorker

pytest.importorskip("prometheus_client")


class ReplicaDied(Exception):
    """What Ray raises when a replica's process is gone (ActorDiedError and friends)."""


class ReplicaMismatch(Exception):
    """What a replica answers a call meant for another (one Serve removed): serving/replica.py."""


class FakeReplica:
    """Answers complete() with two partial texts and an outcome, or fails after the first one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dead = False
        self.calls: list[tuple] = []  # (request id, client, updates)
        self.cancelled: list[str] = []
        self.release: asyncio.Event | None = None  # complete() waits for it before answering
        self.entered = asyncio.Event()  # complete() was called
        self.stream_cancelled = False

    def stream(self, *args) -> FakeStream:
        return FakeStream(self, self.complete(*args))

    async def complete(self, request_id, client, request, updates):
        self.calls.append((request_id, client, updates))
        self.entered.set()
        yield {"text": "a"}
        if self.release is not None:
            await self.release.wait()
        if self.dead:
            raise ReplicaDied(f"{self.name} died")
        yield {"outcome": CompletionOutcome(f"ab from {self.name}", Stats(tokens=2, wall_s=0.01))}

    async def cancel(self, request_id, reason):
        self.cancelled.append(request_id)
        return True


class FakeStream:
    """Ray's streaming response: iterate it, or cancel it (which reaches the replica directly)."""

    def __init__(self, replica: FakeReplica, messages) -> None:
        self.replica = replica
        self.messages = messages

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> dict:
        return await self.messages.__anext__()

    def cancel(self) -> None:
        self.replica.stream_cancelled = True


class _Method:
    def __init__(self, call) -> None:
        self.remote = call


class FakeDeployment:
    """One handle for all replicas, as Serve's: each call goes to the replica named by `replica=`.

    A call for a replica that is gone reaches another, which refuses it (as serving/affinity.py and
    serving/replica.py do).
    """

    def __init__(self, *names: str) -> None:
        self.replicas = {name: FakeReplica(name) for name in names}
        self.complete = _Method(lambda *args, replica: self._to(replica).stream(*args))
        self.cancel = _Method(lambda *args, replica: self._to(replica).cancel(*args))
        self.ping = _Method(self._ping)
        self.stats = _Method(self._stats)

    def options(self, stream: bool = False) -> FakeDeployment:
        return self

    def _to(self, name: str) -> FakeReplica:
        if name not in self.replicas:
            raise ReplicaMismatch(f"a call for replica {name} reached another")
        return self.replicas[name]

    async def _ping(self, replica):
        self._to(replica)
        return 1

    async def _stats(self, replica):
        self._to(replica)
        return {}


def job(client: int, uri: str) -> CompletionJob:
    cursor = CursorContext("def f():\n    ", "", "    ")
    request = CompletionInput(uri, cursor, "python", "/x.py", CompletionOptions())
    return CompletionJob(client=client, input=request)


@pytest.fixture
def replicas():
    deployment = FakeDeployment("r0", "r1")
    worker = RemoteWorker(deployment, DocumentMirror(), ServerCounters(), queue_size=4)
    worker.replicas_changed(frozenset(deployment.replicas))  # Serve's router reports them at start
    yield deployment.replicas, worker
    worker.stop()


async def answer(worker: RemoteWorker, submitted: CompletionJob) -> CompletionOutcome:
    worker.submit(submitted)
    return await asyncio.wait_for(asyncio.wrap_future(submitted.result), 10)


async def test_a_session_stays_and_its_documents_go_once(replicas):
    handles, worker = replicas
    worker.mirror.update("1:file:///a.py", "a = 1")
    for _ in range(3):
        assert (await answer(worker, job(1, "file:///a.py"))).text == "ab from r0"
    assert len(handles["r0"].calls) == 3 and handles["r1"].calls == []
    assert [call[2] for call in handles["r0"].calls] == [[("1:file:///a.py", "a = 1")], [], []]
    assert (await answer(worker, job(2, "file:///b.py"))).text == "ab from r1"  # a second session
    assert worker.queued == 0


async def test_a_request_on_a_dying_replica_is_retried_on_the_other(replicas):
    handles, worker = replicas
    worker.mirror.update("1:file:///a.py", "a = 1")
    await answer(worker, job(1, "file:///a.py"))
    handles["r0"].dead = True
    outcome = await answer(worker, job(1, "file:///a.py"))
    assert outcome.text == "ab from r1" and worker.retried == 1
    assert handles["r1"].calls[0][2] == [("1:file:///a.py", "a = 1")]  # the documents follow the session
    assert worker.queued == 0


async def test_two_failures_answer_with_an_error_naming_the_replicas(replicas):
    handles, worker = replicas
    handles["r0"].dead = handles["r1"].dead = True
    outcome = await answer(worker, job(1, "file:///a.py"))
    assert outcome.error.startswith("the engine replica failed") and "r0" in outcome.error
    assert "r1" in outcome.error
    assert worker.queued == 0 and worker.counters.snapshot()["errors"] == 1


async def test_a_job_cancelled_before_it_is_sent_never_reaches_a_replica(replicas):
    handles, worker = replicas
    first = job(1, "file:///a.py")
    worker.submit(first)
    worker.cancel(lambda queued: queued is first, "client")  # before the task sending it has run
    outcome = await asyncio.wait_for(asyncio.wrap_future(first.result), 10)
    assert outcome.cancelled and outcome.reason == "client"
    assert handles["r0"].calls == [] and worker.queued == 0


async def test_a_new_replica_takes_new_sessions_and_a_removed_ones_sessions_move(replicas):
    handles, worker = replicas
    for client in (1, 2):
        worker.mirror.update(f"{client}:file:///a.py", f"a = {client}")
        await answer(worker, job(client, "file:///a.py"))  # client 1 on r0, client 2 on r1
    handles["r2"] = FakeReplica("r2")
    worker.replicas_changed(frozenset(handles))  # Serve scaled up
    assert (await answer(worker, job(3, "file:///a.py"))).text == "ab from r2"  # the idle newcomer

    # Serve scales r0 down while a request of client 1 runs there: that request finishes on r0
    r0 = handles["r0"]
    r0.release = asyncio.Event()
    running = job(1, "file:///a.py")
    worker.submit(running)
    await asyncio.wait_for(r0.entered.wait(), 10)
    del handles["r0"]  # gone from Serve's router: calls naming it reach another replica
    worker.replicas_changed(frozenset(handles))
    worker.mirror.update("1:file:///b.py", "b = 1")
    elsewhere = await answer(worker, job(1, "file:///b.py"))  # a new session never goes to r0
    assert elsewhere.text in ("ab from r1", "ab from r2") and worker.table.members == ["r1", "r2"]
    r0.release.set()
    assert (await asyncio.wait_for(asyncio.wrap_future(running.result), 10)).text == "ab from r0"

    # client 1's first session lost its place: it moves, and its new replica gets the documents again
    moved = await answer(worker, job(1, "file:///a.py"))
    home = handles[moved.text.removeprefix("ab from ")]
    assert ("1:file:///a.py", "a = 1") in home.calls[-1][2]
    assert worker.queued == 0 and "r0" not in worker.table.outstanding


async def test_cancelling_a_request_on_a_removed_replica_stops_its_stream(replicas):
    handles, worker = replicas
    r0 = handles["r0"]
    r0.release = asyncio.Event()  # never set: the request runs until cancelled
    running = job(1, "file:///a.py")
    worker.submit(running)
    await asyncio.wait_for(r0.entered.wait(), 10)
    del handles["r0"]
    worker.replicas_changed(frozenset(handles))  # Serve's router no longer reaches r0 by name
    worker.cancel(lambda queued: queued is running, "client")
    outcome = await asyncio.wait_for(asyncio.wrap_future(running.result), 10)
    assert outcome.cancelled and outcome.reason == "client"
    assert r0.stream_cancelled and worker.queued == 0


async def test_a_replica_that_stops_sending_is_left_for_the_other():
    deployment = FakeDeployment("r0", "r1")
    worker = RemoteWorker(deployment, DocumentMirror(), ServerCounters(), queue_size=4, stall_s=0.2)
    worker.replicas_changed(frozenset(deployment.replicas))
    try:
        first = await answer(worker, job(1, "file:///a.py"))
        hung = deployment.replicas[first.text.removeprefix("ab from ")]
        hung.release = asyncio.Event()  # it sends its first text, then nothing, ever
        outcome = await answer(worker, job(1, "file:///a.py"))
        assert outcome.text.startswith("ab from r") and hung.name not in outcome.text
        assert hung.stream_cancelled and worker.retried == 1 and worker.queued == 0
    finally:
        worker.stop()
