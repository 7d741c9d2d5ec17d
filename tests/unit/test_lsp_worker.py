"""The model worker with a fake engine whose steps the test releases one by one."""

import threading
from types import SimpleNamespace

import pytest

from completion_engine.completion import CompletionOptions
from completion_engine.healing import TokenTable
from completion_engine.types import Chunk, Stats
from lsp_server.corpus import CorpusFeed
from lsp_server.documents import CursorContext
from lsp_server.fair_queue import FairQueue, QueueFull
from lsp_server.stats import ServerCounters
from lsp_server.worker import CompletionInput, CompletionJob, ModelWorker, ServerBusy, WarmJob

WAIT = 10  # seconds: generous on a busy machine; nothing here sleeps


class FakeGeneration:
    def __init__(self, engine, request, cancel):
        self.engine, self.request, self.cancel = engine, request, cancel
        self.stats = Stats()
        self.text = ""
        self.tokens: list[int] = []

    def __iter__(self):
        self.engine.started.put(self.request.context)
        for step in range(self.request.max_new_tokens):
            if step and not self.engine.steps.acquire(timeout=WAIT):
                raise AssertionError("the test never released this step")
            if self.cancel is not None and self.cancel.is_set():
                self.stats.stop_reason = "cancelled"
                return
            if self.engine.fail:
                raise RuntimeError("boom")
            self.text += "x"
            self.tokens.append(1)
            self.stats.tokens += 1
            yield Chunk(text="x", tokens=[1], source="none", accepted=0)
        self.stats.stop_reason = "length"


class FakeEngine:
    def __init__(self):
        import queue

        self.config = SimpleNamespace(max_context=4096)
        self.token_table = TokenTable.from_texts([chr(i) for i in range(256)])  # no token extends another
        self.corpus = SimpleNamespace(
            set_document=lambda doc_id, tokens: self.documents.__setitem__(doc_id, tokens)
        )
        self.documents: dict[str, list[int]] = {}
        self.steps = threading.Semaphore(0)
        self.started = queue.Queue()
        self.warm_steps = threading.Semaphore(0)
        self.warming = queue.Queue()
        self.warmed = queue.Queue()
        self.fail = False

    def encode(self, text):
        return [ord(c) for c in text]

    def remove_document(self, doc_id):
        self.documents.pop(doc_id, None)

    def stream(self, request, cancel=None, stop_check=None):
        return FakeGeneration(self, request, cancel)

    def warm(self, context, cancel=None):
        """A prefill of one 'forward' per token that the test lets run or cancels."""
        self.warming.put(context)
        for done in range(len(context)):
            if cancel is not None and cancel.is_set():
                self.warmed.put((context, done))
                return done
            if not self.warm_steps.acquire(timeout=WAIT):
                raise AssertionError("the test never released this warm-up step")
        self.warmed.put((context, len(context)))
        return len(context)


@pytest.fixture
def worker():
    engine = FakeEngine()
    worker = ModelWorker(engine, CorpusFeed(1000), ServerCounters(), queue_size=2)
    worker.start()
    yield worker
    for _ in range(100):  # let a job blocked on its next step see the stop at once
        engine.steps.release()
        engine.warm_steps.release()
    worker.stop()


def job(client: int, uri: str, tokens: int = 3) -> CompletionJob:
    settings = CompletionOptions(max_new_tokens=tokens, syntax=False)
    cursor = CursorContext(prefix=f"{uri}:", suffix="", line_prefix="")
    return CompletionJob(client=client, input=CompletionInput(uri, cursor, "python", "/x.py", settings))


def warm_job(prefix: str) -> WarmJob:
    """A warm-up for a completion after `prefix` in a.py (healing off: the context is the prefix's)."""
    settings = CompletionOptions(max_new_tokens=3, syntax=False, healing=False)
    cursor = CursorContext(prefix=prefix, suffix="", line_prefix=prefix)
    return WarmJob(1, CompletionInput("a.py", cursor, "python", "/a.py", settings))


def test_a_job_runs_to_the_end(worker):
    first = job(1, "a", tokens=2)
    worker.submit(first)
    worker.engine.steps.release()
    outcome = first.result.result(WAIT)
    assert outcome.text == "xx" and not outcome.cancelled


def test_a_new_job_for_the_same_document_supersedes_the_running_one(worker):
    old, new = job(1, "a", tokens=50), job(1, "a", tokens=1)
    worker.submit(old)
    worker.engine.started.get(timeout=WAIT)
    worker.submit(new)
    worker.engine.steps.release()  # the old job's next step sees its cancel
    outcome = old.result.result(WAIT)
    assert outcome.cancelled and outcome.reason == "superseded"
    assert new.result.result(WAIT).text == "x"


def test_queued_jobs_are_superseded_at_once(worker):
    running, queued, newer = job(1, "a", tokens=50), job(1, "b"), job(1, "b", tokens=1)
    worker.submit(running)
    worker.engine.started.get(timeout=WAIT)
    worker.submit(queued)
    worker.submit(newer)
    assert queued.result.result(WAIT).reason == "superseded"  # answered without waiting for the model
    worker.cancel(lambda j: j is running, "client")
    worker.engine.steps.release()
    assert running.result.result(WAIT).cancelled
    assert newer.result.result(WAIT).text == "x"


def test_a_full_queue_is_busy(worker):
    worker.submit(job(1, "a", tokens=50))
    worker.engine.started.get(timeout=WAIT)
    worker.submit(job(1, "b"))
    worker.submit(job(2, "c"))
    with pytest.raises(ServerBusy, match="busy"):
        worker.submit(job(3, "d"))
    assert worker.counters.snapshot()["busy"] == 1


def test_disconnecting_cancels_every_job_of_that_client(worker):
    running, queued, other = job(1, "a", tokens=50), job(1, "b"), job(2, "c", tokens=1)
    worker.submit(running)
    worker.engine.started.get(timeout=WAIT)
    worker.submit(queued)
    worker.submit(other)
    worker.cancel(lambda j: j.client == 1, "disconnected")
    assert queued.result.result(WAIT).reason == "disconnected"
    worker.engine.steps.release()
    assert running.result.result(WAIT).reason == "disconnected"
    assert other.result.result(WAIT).text == "x"
    assert worker.counters.snapshot()["cancelled"] == 2


def test_an_engine_failure_is_reported_and_the_worker_goes_on(worker):
    worker.engine.fail = True
    failing = job(1, "a")
    worker.submit(failing)
    assert "boom" in failing.result.result(WAIT).error
    worker.engine.fail = False
    after = job(1, "b", tokens=1)
    worker.submit(after)
    assert after.result.result(WAIT).text == "x"


def test_a_loading_worker_builds_its_engine_on_the_thread_that_runs_the_jobs():
    # one thread makes every torch call: a second OpenMP team slows every forward (ModelWorker)
    threads = []

    def build():
        threads.append(threading.current_thread())
        return FakeEngine()

    worker = ModelWorker.loading(build, CorpusFeed(1000), ServerCounters(), queue_size=2)
    try:
        assert isinstance(worker.engine, FakeEngine)
        first = job(1, "a", tokens=1)
        worker.submit(first)
        assert first.result.result(WAIT).text == "x"
        assert threads == [worker._thread] and threads[0] is not threading.current_thread()
    finally:
        worker.stop()


def test_a_failed_load_is_raised_to_the_caller():
    def build():
        raise RuntimeError("no weights here")

    with pytest.raises(RuntimeError, match="no weights here"):
        ModelWorker.loading(build, CorpusFeed(1000), ServerCounters(), queue_size=2)


def test_fair_queue_takes_turns_and_is_bounded():
    queue = FairQueue(capacity=4)
    for item in ("a1", "a2", "a3"):
        queue.put("a", item)
    queue.put("b", "b1")
    with pytest.raises(QueueFull):
        queue.put("c", "c1")
    assert [queue.pop() for _ in range(4)] == ["a1", "b1", "a2", "a3"]
    assert queue.pop() is None and len(queue) == 0
    queue.put("a", "x")
    queue.put("b", "y")
    assert queue.remove(lambda item: item == "x") == ["x"]
    assert len(queue) == 1 and queue.pop() == "y"


def test_corpus_feed_is_lazy_and_bounded():
    engine = FakeEngine()
    feed = CorpusFeed(max_tokens=10)
    feed.update("a", "aaaa")
    feed.update("a", "aaaaa")  # only the latest text is tokenised
    feed.update("b", "bbbb")
    assert engine.documents == {}
    feed.sync(engine, engine.corpus.set_document)
    assert set(engine.documents) == {"a", "b"} and feed.total_tokens == 9
    feed.update("c", "cc")  # over the cap: the least recently edited ("a") goes
    feed.sync(engine, engine.corpus.set_document)
    assert set(engine.documents) == {"b", "c"}
    feed.remove("b")
    feed.update("huge", "h" * 11)  # larger than the whole budget: never indexed
    feed.sync(engine, engine.corpus.set_document)
    assert set(engine.documents) == {"c"}


def test_an_idle_worker_warms_up_the_context_of_the_next_request(worker):
    engine = worker.engine
    worker.warm(warm_job("abc"))
    assert engine.warming.get(timeout=WAIT) == [ord(c) for c in "abc"]  # the context a request would use
    for _ in range(3):
        engine.warm_steps.release()
    assert engine.warmed.get(timeout=WAIT) == ([97, 98, 99], 3)
    snapshot = worker.counters.snapshot()
    assert (snapshot["warmups"], snapshot["warm_tokens"], snapshot["warmups_cancelled"]) == (1, 3, 0)


def test_a_request_cancels_a_running_warm_up_and_runs_first(worker):
    engine = worker.engine
    worker.warm(warm_job("abcdef"))
    engine.warming.get(timeout=WAIT)
    engine.warm_steps.release()  # one 'forward' done
    running = job(2, "b.py", tokens=1)
    worker.submit(running)
    engine.warm_steps.release()  # the warm-up sees the cancel before its next forward
    context, done = engine.warmed.get(timeout=WAIT)
    assert 1 <= done < 6
    assert running.result.result(timeout=WAIT).text == "x"
    assert worker.counters.snapshot()["warmups_cancelled"] == 1


def test_a_newer_warm_up_replaces_a_pending_one(worker):
    engine = worker.engine
    blocker = job(1, "busy.py", tokens=2)
    worker.submit(blocker)
    engine.started.get(timeout=WAIT)  # the worker is busy: warm-ups wait
    worker.warm(warm_job("old"))
    worker.warm(warm_job("new!"))
    engine.steps.release()
    blocker.result.result(timeout=WAIT)
    assert engine.warming.get(timeout=WAIT) == [ord(c) for c in "new!"]


def test_a_document_being_edited_is_re_read_only_once_its_edits_pause():
    engine = FakeEngine()
    now = [0.0]
    feed = CorpusFeed(max_tokens=100, quiet_s=2.0, clock=lambda: now[0])
    feed.update("big", "aaaa")
    feed.sync(engine, engine.corpus.set_document)  # new: taken at once
    assert len(engine.documents["big"]) == 4
    for step in range(5):  # edits keep coming: every other client's sync skips the re-read
        now[0] += 1.0
        feed.update("big", "a" * (5 + step))
        feed.sync(engine, engine.corpus.set_document)
        assert len(engine.documents["big"]) == 4
    now[0] += 2.0  # the edits paused
    feed.sync(engine, engine.corpus.set_document)
    assert len(engine.documents["big"]) == 9
    feed.remove("big")  # a close is taken at once
    feed.sync(engine, engine.corpus.set_document)
    assert "big" not in engine.documents
