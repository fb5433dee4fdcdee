"""One Retriever serving many threads and asyncio tasks; dynamic batching; spans and stats."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from indexes.corpus import read_corpus, read_queries
from indexes.demo_metadata import with_demo_metadata
from retrieval import InvalidQueryError, Retriever
from retrieval.request_path.batching import BatchingConfig, EncodeBatcher
from retrieval.request_path.validate import is_light_filter

NO_CACHE = {"backend": "none"}


class RecordingEncoder:
    """The real encoder, recording the size of every call (our Encoder interface, not a mock)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def encode(self, texts, *, batch_size=64, progress=False):
        with self._lock:
            self.batch_sizes.append(len(texts))
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)


@pytest.fixture(scope="module")
def root(dataset, encoder, tmp_path_factory, build_subset):
    docs = list(itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), 300))
    path = tmp_path_factory.mktemp("concurrency")
    build_subset(docs, path)
    return path


@pytest.fixture(scope="module")
def queries(dataset):
    return list(read_queries(dataset("scifact") / "queries.jsonl").values())[:48]


def _ids(result):
    return [(h.doc_id, h.score) for h in result.hits]


def assert_same_results(got: list, expected: list) -> None:
    """Same documents and scores; a batched (padded) encode differs from a single one by ~1e-6,
    so scores compare with a tolerance and near-ties may swap places."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert {d for d, _ in a} == {d for d, _ in b}
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-4)


def _serial(root, encoder, queries):
    serial = Retriever.load(root, {"cache": NO_CACHE, "batching": {"enabled": False},
                                   "parallel_stages": False}, encoder=encoder)
    return [_ids(serial.search(q, filters={"year": {"gte": 2000}}, k=10)) for q in queries]


@pytest.mark.parametrize("parallel_stages", [True, False])
def test_sixteen_threads_equal_serial_and_batching_batches(root, encoder, queries,
                                                           parallel_stages):
    expected = _serial(root, encoder, queries)
    recording = RecordingEncoder(encoder)
    shared = Retriever.load(root, {"cache": NO_CACHE, "parallel_stages": parallel_stages},
                            encoder=recording)
    recording.batch_sizes.clear()
    got: dict[int, list] = {}
    barrier = threading.Barrier(16)

    def worker(offset: int) -> None:
        barrier.wait()
        for i in range(offset, len(queries), 16):
            got[i] = _ids(shared.search(queries[i], filters={"year": {"gte": 2000}}, k=10))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert_same_results([got[i] for i in range(len(queries))], expected)
    assert max(recording.batch_sizes) > 1, recording.batch_sizes
    batching = shared.stats()["batching"]
    assert batching["largest_batch"] > 1  # auto: on for a torch encoder
    assert batching["workers"] == 1  # auto: an encoder without single_thread= gets one


def test_sixteen_asyncio_tasks_equal_serial(root, encoder, queries):
    expected = _serial(root, encoder, queries[:16])
    shared = Retriever.load(root, {"cache": NO_CACHE}, encoder=encoder)

    async def main() -> list:
        tasks = [shared.asearch(q, {"year": {"gte": 2000}}, 10) for q in queries[:16]]
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    assert_same_results([_ids(r) for r in results], expected)
    batch = asyncio.run(shared.asearch_batch(queries[:16], {"year": {"gte": 2000}}, 10))
    assert_same_results([_ids(r) for r in batch], expected)


def test_stats_report_rolling_percentiles_per_stage(root, encoder, queries):
    retriever = Retriever.load(root, encoder=encoder)
    for query in queries[:20]:
        retriever.search(query, k=5)
    latency = retriever.stats()["latency_ms"]
    for stage in ("validate", "cache", "filter", "bm25", "embed", "rerank", "hydrate", "total"):
        assert latency[stage]["n"] >= 1
        assert 0 <= latency[stage]["p50"] <= latency[stage]["p95"] <= latency[stage]["p99"]


def test_slow_query_log(root, encoder, caplog):
    retriever = Retriever.load(root, {"tracing": {"slow_query_ms": 0.001}}, encoder=encoder)
    with caplog.at_level(logging.WARNING, logger="retrieval.slow_queries"):
        retriever.search("stem cells", k=3)
    assert any("slow search" in r.getMessage() for r in caplog.records)
    assert not any("stem cells" in r.getMessage() for r in caplog.records)  # no user text


def test_spans_carry_stage_names(root, encoder):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    retriever = Retriever.load(root, {"tracing": {"enabled": True}, "cache": NO_CACHE},
                               encoder=encoder)
    retriever.search("protein folding", filters={"year": {"gte": 2000}}, k=3)
    spans = exporter.get_finished_spans()
    names = {s.name for s in spans}
    for stage in ("search", "validate", "filter", "bm25", "embed", "rerank", "fuse", "hydrate"):
        assert f"retrieval.{stage}" in names, names
    root_span = next(s for s in spans if s.name == "retrieval.search")
    assert root_span.attributes["retrieval.build_id"] == retriever.build_id
    assert root_span.attributes["retrieval.candidates"] > 0
    children = [s for s in spans if s.parent is not None]
    assert all(s.parent.span_id == root_span.context.span_id for s in children)
    # asearch runs in a thread: its search span still has the caller's span as its parent.
    exporter.clear()

    async def traced():
        with trace.get_tracer("app").start_as_current_span("http request") as request:
            await retriever.asearch("protein folding", k=3)
            return request

    request = asyncio.run(traced())
    search = next(s for s in exporter.get_finished_spans() if s.name == "retrieval.search")
    assert search.parent is not None and search.parent.span_id == request.context.span_id
    # A search that fails has its span too, an error; a degraded one says what it lacked.
    from opentelemetry.trace import StatusCode

    from retrieval import InvalidQueryError, SequenceNotReachedError, UnknownFieldError

    for failing, error in ((lambda: retriever.search("x", filters={"nope": 1}),
                            UnknownFieldError),
                           (lambda: retriever.search("x", min_seq=10**9),
                            SequenceNotReachedError),
                           (lambda: asyncio.run(retriever.asearch("x", min_seq=-1)),
                            InvalidQueryError)):
        exporter.clear()
        with pytest.raises(error):
            failing()
        (failed,) = [s for s in exporter.get_finished_spans() if s.name == "retrieval.search"]
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.attributes["retrieval.error"] == error.__name__
        assert failed.events[0].name == "exception"
    exporter.clear()
    degraded = retriever.search("protein folding", k=3, deadline_ms=1e-6)
    span = next(s for s in exporter.get_finished_spans() if s.name == "retrieval.search")
    assert degraded.degraded and list(span.attributes["retrieval.degraded"]) == degraded.degraded


def test_a_search_waiting_for_a_thread_counts_the_wait(root, encoder):
    """Without an in-process cache ``asearch`` runs whole in a thread; the wait for it was in
    neither the deadline nor the timings (the in-process cache's path counted it)."""
    from retrieval.request_path.deadline import Deadline

    assert Deadline(100, spent_ms=150).expired() and not Deadline(100, spent_ms=50).expired()
    retriever = Retriever.load(root, {"cache": NO_CACHE}, encoder=encoder)
    release = threading.Event()

    async def queued():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        blocker = loop.run_in_executor(None, release.wait)  # the one thread is busy
        search = asyncio.ensure_future(retriever.asearch("protein folding", k=3))
        await asyncio.sleep(0.3)
        release.set()
        await blocker
        return await search

    result = asyncio.run(queued())
    assert result.timings["queue"] >= 250 and result.timings["total"] >= result.timings["queue"]
    retriever.close()


def test_a_lone_search_encodes_on_every_core_and_searches_under_load_on_one(root, queries):
    """The default ONNX encoder: every core for a search running alone; one thread per query
    while other searches are in flight (their encodes queue in the pool)."""
    retriever = Retriever.load(root, {"cache": NO_CACHE})  # default onnx-int8 query encoder
    encoder = retriever.encoder
    filters = {"year": {"gte": 2000}}
    before = dict(encoder.calls)
    expected = [_ids(retriever.search(q, filters=filters, k=10)) for q in queries]
    assert encoder.calls["every_core"] - before["every_core"] == len(queries)
    got: dict[int, list] = {}
    barrier = threading.Barrier(8)

    def worker(offset: int) -> None:
        barrier.wait()
        for i in range(offset, len(queries), 8):
            got[i] = _ids(retriever.search(queries[i], filters=filters, k=10))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert encoder.calls["one_thread"] > before["one_thread"]
    assert_same_results([got[i] for i in range(len(queries))], expected)


class InMemoryEncoder:
    """Our Encoder interface in memory (no model): records whether each call was asked to
    stay on one thread; ``narrowable`` says whether encode takes ``single_thread=``."""

    encoder_id, model, dim = "in-memory:onnx:fp32:4", "in-memory", 4

    def __init__(self) -> None:
        self.single_thread: list[bool] = []

    def encode(self, texts, *, batch_size=64, progress=False, single_thread=False):
        self.single_thread.append(single_thread)
        return np.full((len(texts), self.dim), 0.5, dtype=np.float32)


class PlainEncoder(InMemoryEncoder):
    def encode(self, texts, *, batch_size=64, progress=False):
        return super().encode(texts)


@pytest.mark.parametrize(("encoder_type", "workers", "expected"), [
    (InMemoryEncoder, None, min(64, len(os.sched_getaffinity(0)))),
    (InMemoryEncoder, 3, 3),
    (InMemoryEncoder, 1, 1),
    (PlainEncoder, None, 1),
    (PlainEncoder, 3, 3),
])
def test_batching_workers_default_by_encoder_and_override(encoder_type, workers, expected):
    assert BatchingConfig().workers is None
    encoder = encoder_type()
    batcher = EncodeBatcher(encoder, BatchingConfig(enabled=True, workers=workers))
    try:
        assert batcher.stats()["workers"] == expected
        vector, _ = batcher.submit("query").result(timeout=10)
        assert vector.shape == (4,)
        # Several workers share the cores, so each call is kept to one thread when it can be.
        assert encoder.single_thread == [expected > 1 and encoder_type is InMemoryEncoder]
    finally:
        batcher.close()


class CountingExecutor(ThreadPoolExecutor):
    """A real thread pool that counts what the event loop hands it."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs):
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def _on_counting_loop(work):
    """Run ``work()`` (a coroutine factory) on a fresh loop whose default executor counts."""
    executor = CountingExecutor()

    async def main():
        asyncio.get_running_loop().set_default_executor(executor)
        return await work()

    try:
        return asyncio.run(main()), executor.submitted
    finally:
        executor.shutdown()


def test_asearch_serves_in_process_cache_hits_on_the_loop(root, encoder, queries):
    retriever = Retriever.load(root, encoder=encoder)  # the in-process cache (default)
    filters = {"year": {"gte": 2000}}
    expected = retriever.search(queries[0], filters, 5)
    missed, handed = _on_counting_loop(lambda: retriever.asearch(queries[1], filters, 5))
    assert handed == 1 and missed.cache.result == "miss"
    assert "queue" in missed.timings  # the wait for the thread, not another stage's time
    assert missed.hits == retriever.search(queries[1], filters, 5).hits  # now a hit
    hit, handed = _on_counting_loop(lambda: retriever.asearch(queries[0], filters, 5))
    assert handed == 0 and hit.cache.result == "hit"
    assert [(h.doc_id, h.score) for h in hit.hits] == _ids(expected)
    counters = retriever.stats()["cache"]
    assert (counters["result_hits"], counters["result_misses"]) == (2, 2)  # each counted once
    with pytest.raises(InvalidQueryError):  # refused on the loop like search refuses it
        _on_counting_loop(lambda: retriever.asearch(queries[0], filters, 0))


def test_asearch_hands_every_search_to_a_thread_without_an_in_process_cache(
        root, encoder, queries, redis_server):
    retriever = Retriever.load(root, {"cache": {"backend": "redis", "url": redis_server.url,
                                                "namespace": "asearch-loop"}}, encoder=encoder)
    try:
        for _ in range(2):  # a miss, then a Redis hit: both in a worker thread
            result, handed = _on_counting_loop(lambda: retriever.asearch(queries[2], k=5))
            assert handed == 1
            retriever.flush_cache_writes()
        assert result.cache.result == "hit"
        vector = encoder.encode([queries[3]])[0]
        _, handed = _on_counting_loop(lambda: retriever.asearch(queries[3], k=5,
                                                                query_vector=vector))
        assert handed == 1
    finally:
        retriever.close()


def test_a_misspelled_keyword_to_asearch_names_the_call_made(root, encoder, queries):
    """A typo passed on in ``**options`` was a TypeError naming the private ``_searched``."""
    retriever = Retriever.load(root, encoder=encoder)
    with pytest.raises(TypeError, match=r"^asearch\(\) got an unexpected keyword argument "
                                        r"'deadline'$"):
        asyncio.run(retriever.asearch(queries[0], k=3, deadline=50))
    with pytest.raises(TypeError, match=r"^asearch_batch\(\) got an unexpected keyword "
                                        r"argument 'query_vector'$"):
        asyncio.run(retriever.asearch_batch(queries[:2], k=3, query_vector=None))
    result = asyncio.run(retriever.asearch(queries[0], k=3, deadline_ms=5000, group_by=None))
    assert len(result.hits) == 3


def test_light_filter_counts_keys_and_list_items():
    assert is_light_filter(None) and is_light_filter("year >= 2010")
    assert is_light_filter({"year": {"gte": 2000}, "doc_type": {"in": ["a", "b"]}})
    assert is_light_filter({"doc_type": {"in": [str(i) for i in range(990)]}})
    assert not is_light_filter({"doc_type": {"in": [str(i) for i in range(1_001)]}})
    nested = {"$or": [{"year": {"gte": y}} for y in range(400)]}  # 400 x 3 entries
    assert not is_light_filter(nested)
    assert not is_light_filter("doc_type IN (" + ",".join(f"'{i}'" for i in range(5000)) + ")")


def test_asearch_validates_large_filters_in_a_thread_even_on_a_hit(root, encoder, queries):
    retriever = Retriever.load(root, encoder=encoder)
    large = {"doc_type": {"in": ["review", "trial", *(f"other-{i}" for i in range(5_000))]}}
    expected = retriever.search(queries[4], large, 5)  # now cached
    result, handed = _on_counting_loop(lambda: retriever.asearch(queries[4], large, 5))
    assert handed == 1 and result.cache.result == "hit"
    assert result.hits == expected.hits


class HeldEncoder:
    """The real encoder behind a gate (open until ``hold``): a call waits while it is
    closed (our Encoder interface, not a mock), counting the calls made while held."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.gate = threading.Event()
        self.gate.set()  # the retriever's warm-up encode at load passes
        self.calls = 0
        self._lock = threading.Lock()

    def hold(self) -> None:
        self.calls = 0
        self.gate.clear()

    def encode(self, texts, *, batch_size=64, progress=False):
        with self._lock:
            self.calls += 1
        self.gate.wait(30)
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)


@pytest.mark.parametrize("batching", [False, True])
def test_an_encode_no_search_waits_for_is_never_run(root, encoder, batching):
    """Searches past their deadline left their encodes queued: after a burst, every later
    search waited behind encodes nobody wanted, and was degraded too."""
    held = HeldEncoder(encoder)
    retriever = Retriever.load(root, {"cache": NO_CACHE, "batching": {"enabled": batching,
                                      "workers": 1}}, encoder=held)
    workers = retriever._path._pool._max_workers  # encodes that can be running at once
    held.hold()
    searches = workers + 6
    with ThreadPoolExecutor(searches) as pool:
        results = list(pool.map(lambda i: retriever.search(f"cell {i}", k=3, deadline_ms=50),
                                range(searches)))
    assert all(r.degraded == ["embed"] for r in results)
    held.gate.set()
    later = retriever.search("cell biology", k=3, deadline_ms=30_000)
    assert later.degraded == [] and later.hits
    # Those running when their deadlines passed (one a worker, the batcher's too) and the last.
    assert held.calls <= workers + 2, (held.calls, searches)
    retriever.close()


def test_a_closed_retriever_refuses_searches_and_finishes_those_queued(root, encoder):
    """``close`` with searches in flight left them waiting forever on the batcher, and later
    searches raised the thread pool's bare RuntimeError."""
    from retrieval import RetrieverClosedError

    held = HeldEncoder(encoder)
    retriever = Retriever.load(root, {"cache": NO_CACHE, "batching": {"enabled": True}},
                               encoder=held)
    held.hold()
    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(retriever.search, f"cell {i}", k=3) for i in range(4)]
        while held.calls == 0:
            threading.Event().wait(0.01)
        retriever.close()
        held.gate.set()
        assert all(f.result(timeout=60).hits for f in running)
    with pytest.raises(RetrieverClosedError, match="load a new one"):
        retriever.search("cell", k=3)
    with pytest.raises(RetrieverClosedError):
        retriever.search_batch(["cell"], k=3)
