"""RemoteWorker without Ray: fake deployment handles that stream, fail or hang on cue.

The e2e tests (tests/e2e/test_replicas.py) run the real thing; these pin the front end's rules
where timing cannot make them flaky: affinity, a retry after a replica failure, a clear error
after two, and nothing left counted against a replica afterwards.
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


class _Method:
    def __init__(self, call) -> None:
        self.remote = call


class FakeHandle:
    """Answers complete() with two partial texts and an outcome, or fails after the first one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dead = False
        self.calls: list[tuple] = []  # (request id, client, updates)
        self.cancelled: list[str] = []
        self.complete = _Method(self._complete)
        self.cancel = _Method(self._cancel)
        self.ping = _Method(self._ok)
        self.stats = _Method(self._stats)

    def options(self, stream: bool = False) -> FakeHandle:
        return self

    async def _complete(self, request_id, client, request, updates):
        self.calls.append((request_id, client, updates))
        yield {"text": "a"}
        if self.dead:
            raise ReplicaDied(f"{self.name} died")
        yield {"outcome": CompletionOutcome(f"ab from {self.name}", Stats(tokens=2, wall_s=0.01))}

    async def _cancel(self, request_id, reason):
        self.cancelled.append(request_id)
        return True

    async def _ok(self, *args):
        return 1

    async def _stats(self):
        return {}


def job(client: int, uri: str) -> CompletionJob:
    cursor = CursorContext("def f():\n    ", "", "    ")
    request = CompletionInput(uri, cursor, "python", "/x.py", CompletionOptions())
    return CompletionJob(client=client, input=request)


@pytest.fixture
def replicas():
    handles = {"r0": FakeHandle("r0"), "r1": FakeHandle("r1")}
    worker = RemoteWorker(handles, DocumentMirror(), ServerCounters(), queue_size=4)
    yield handles, worker
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
