"""Result and embedding caching in the Retriever, against real Redis servers and the real model."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest
from redis_servers import RedisProcess

from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.docstore import Document
from indexes.restore import log_id, restore_snapshot
from indexes.snapshot import take_snapshot
from indexes.writer import IndexWriter
from retrieval import Retriever

QUERIES = ["cell differentiation in tissue", "cancer risk and diet", "protein signalling pathway",
           "immune response", "gene expression in tumors", "blood pressure treatment"]
FILTER = {"department": {"in": ["cardiology", "oncology", "genetics"]}, "year": {"gte": 2000}}
SAME_FILTER_REORDERED = {"year": {"gte": 2000},
                         "department": {"in": ["genetics", "oncology", "cardiology"]}}


class CountingEncoder:
    """Wraps the real encoder and counts calls (our own Encoder interface; not a mock)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.calls = 0
        self._lock = threading.Lock()

    def encode(self, texts, *, batch_size=64, progress=False):
        with self._lock:
            self.calls += 1
        time.sleep(0.05)  # widen the window in which concurrent identical misses overlap
        return self.inner.encode(texts, batch_size=batch_size, progress=progress)


@pytest.fixture(scope="module")
def small_docs(dataset):
    return list(itertools.islice(with_demo_metadata(read_corpus(dataset("scifact"))), 300))


@pytest.fixture(scope="module")
def root(small_docs, encoder, tmp_path_factory, build_subset):
    path = tmp_path_factory.mktemp("cached")
    build_subset(small_docs, path)
    return path


def _ids(result):
    return [(h.doc_id, round(h.score, 6)) for h in result.hits]


def _cache_config(kind: str, request) -> dict:
    if kind == "memory":
        return {"backend": "memory"}
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        return {"backend": "redis", "url": server.url, "socket_timeout_ms": 500,
                "connect_timeout_ms": 500, "namespace": f"t{time.monotonic_ns()}"}
    cluster = request.getfixturevalue("redis_cluster")
    return {"backend": "redis", "url": cluster.url, "cluster": True, "socket_timeout_ms": 500,
            "connect_timeout_ms": 500, "namespace": f"t{time.monotonic_ns()}"}


@pytest.mark.parametrize("kind", ["memory", "redis", "cluster"])
def test_cache_contract(kind, request, root, encoder):
    cached = Retriever.load(root, {"cache": _cache_config(kind, request)}, encoder=encoder)
    plain = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    try:
        for query in QUERIES:
            first = cached.search(query, filters=FILTER, k=5)
            assert (first.cache.result, first.cache.embedding) == ("miss", "miss")
            cached.flush_cache_writes()
            second = cached.search(query, filters=SAME_FILTER_REORDERED, k=5)
            assert (second.cache.result, second.cache.embedding) == ("hit", "skipped")
            assert _ids(second) == _ids(first) == _ids(plain.search(query, filters=FILTER, k=5))
            # A different k or filter is a different result, but reuses the embedding.
            other_k = cached.search(query, filters=FILTER, k=3)
            assert (other_k.cache.result, other_k.cache.embedding) == ("miss", "hit")
            assert _ids(other_k) == _ids(first)[:3]
            other_filter = cached.search(query, filters={"year": {"gte": 2001}}, k=5)
            assert other_filter.cache.result == "miss"
            cached.flush_cache_writes()
        stats = cached.stats()["cache"]
        assert stats["result_hits"] == len(QUERIES)
        assert stats["embedding_hits"] == 2 * len(QUERIES)
    finally:
        cached.close()


def test_different_config_never_shares_results(root, encoder, redis_server):
    config = {
        "backend": "redis", "url": redis_server.url, "namespace": "shared-config-test",
        "socket_timeout_ms": 500, "connect_timeout_ms": 500}
    a = Retriever.load(root, {"cache": config}, encoder=encoder)
    b = Retriever.load(root, {"cache": config, "vector_weight": 0.2}, encoder=encoder)
    a.search(QUERIES[0], k=5)
    a.flush_cache_writes()
    assert a.search(QUERIES[0], k=5).cache.result == "hit"
    other = b.search(QUERIES[0], k=5)
    assert other.cache.result == "miss" and other.cache.embedding == "hit"
    assert a.search(QUERIES[0], k=5, candidates=20).cache.result == "miss"


def test_result_cached_before_a_rebuild_is_not_served_after(small_docs, encoder, redis_server,
                                                            tmp_path, build_subset):
    config = {"cache": {"backend": "redis", "url": redis_server.url, "namespace": "rebuild",
                        "socket_timeout_ms": 500, "connect_timeout_ms": 500}}
    build_subset(small_docs[:100], tmp_path)
    old = Retriever.load(tmp_path, config, encoder=encoder)
    before = old.search(QUERIES[1], k=5)
    old.flush_cache_writes()
    assert old.search(QUERIES[1], k=5).cache.result == "hit"
    target = before.hits[0].doc_id
    changed = [d if d.id != target else Document(d.id, "unrelated text about astronomy", "stars",
                                                 d.metadata) for d in small_docs[:100]]
    build_subset(changed, tmp_path)
    new = Retriever.load(tmp_path, config, encoder=encoder)
    after = new.search(QUERIES[1], k=5)
    assert after.cache.result == "miss" and after.build_id == new.build_id != before.build_id
    assert target not in [h.doc_id for h in after.hits]


def test_a_restored_root_and_its_source_never_share_results(small_docs, encoder, redis_server,
                                                           tmp_path, build_subset):
    """A restored root keeps its source's build id and numbers its writes on from the same
    seqs: after one write each, both served build ``<build>+1``, and sharing one Redis the
    restored root was served its source's cached result, a document it does not hold first.
    Each restore now gives the root's log an id of its own, which the served build id (and so
    every result key) carries; two retrievers of one root still share their entries."""
    build_subset(small_docs[:100], tmp_path / "prod")
    take_snapshot(tmp_path / "prod", tmp_path / "snap.tar")
    restore_snapshot(tmp_path / "snap.tar", tmp_path / "staging")
    restore_snapshot(tmp_path / "snap.tar", tmp_path / "staging-2")
    assert log_id(tmp_path / "prod") == ""
    assert "" != log_id(tmp_path / "staging") != log_id(tmp_path / "staging-2") != ""
    query = "zeppelin mooring mast for the airship fleet"
    for name in ("prod", "staging"):
        with IndexWriter(tmp_path / name, encoder) as writer:
            writer.upsert([Document(f"{name}-only", f"{query} of {name}")])
    config = {"cache": {"backend": "redis", "url": redis_server.url, "namespace": "restored",
                        "socket_timeout_ms": 500, "connect_timeout_ms": 500},
              "live_lag_seconds": None}
    with Retriever.load(tmp_path / "prod", config, encoder=encoder) as prod:
        source = prod.search(query, k=3)
        prod.flush_cache_writes()
    assert source.hits[0].doc_id == "prod-only"
    with Retriever.load(tmp_path / "staging", config, encoder=encoder) as staging:
        restored = staging.search(query, k=3)
        staging.flush_cache_writes()
    assert restored.cache.result == "miss" and restored.build_id != source.build_id
    assert restored.hits[0].doc_id == "staging-only"
    assert "prod-only" not in [h.doc_id for h in restored.hits]
    with Retriever.load(tmp_path / "staging", config, encoder=encoder) as another_worker:
        again = another_worker.search(query, k=3)
    assert again.cache.result == "hit" and _ids(again) == _ids(restored)


def test_redis_stopped_mid_run_fails_open_and_recovers(root, encoder):
    server = RedisProcess()
    server.start()
    config = {"cache": {"backend": "redis", "url": server.url, "socket_timeout_ms": 50,
                        "connect_timeout_ms": 50, "breaker_failures": 2,
                        "breaker_cooldown_seconds": 0.3}}
    cached = Retriever.load(root, config, encoder=encoder)
    plain = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    try:
        for query in QUERIES[:3]:
            cached.search(query, k=5)
        cached.flush_cache_writes()
        server.stop()
        for query in QUERIES * 2:
            result = cached.search(query, k=5)
            assert _ids(result) == _ids(plain.search(query, k=5))
        stats = cached.stats()["cache"]["backend"]
        assert stats["errors"] >= 2 and stats["breaker_state"] == "open"
        server.start()
        time.sleep(0.4)  # the breaker's cool-down, then one probe closes it
        deadline = time.monotonic() + 10
        while cached.search(QUERIES[0], k=5).cache.result != "hit":
            cached.flush_cache_writes()
            assert time.monotonic() < deadline, cached.stats()
            time.sleep(0.1)
        assert cached.stats()["cache"]["backend"]["breaker_state"] == "closed"
    finally:
        cached.close()
        server.cleanup()


def test_paused_redis_does_not_hang_searches(root, encoder):
    server = RedisProcess()
    server.start()
    config = {"cache": {"backend": "redis", "url": server.url}}  # default (short) timeouts
    cached = Retriever.load(root, config, encoder=encoder)
    plain = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    try:
        cached.search(QUERIES[0], k=5)
        server.pause()
        for query in QUERIES:
            started = time.monotonic()
            result = cached.search(query, k=5)
            # A hang check, not a latency assertion: a hung socket would take forever.
            assert time.monotonic() - started < 2.0
            assert _ids(result) == _ids(plain.search(query, k=5))
        server.resume()
    finally:
        cached.close()
        server.cleanup()


def test_corrupt_or_foreign_values_are_misses(root, encoder, redis_server):
    config = {"cache": {"backend": "redis", "url": redis_server.url, "namespace": "corrupt",
                        "socket_timeout_ms": 500, "connect_timeout_ms": 500}}
    cached = Retriever.load(root, config, encoder=encoder)
    plain = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    query = QUERIES[2]
    cached.search(query, k=5)
    cached.flush_cache_writes()
    client = redis_server.client()
    keys = [k for k in client.keys("corrupt:*")]
    assert len(keys) == 2  # the result and the embedding
    for junk in (b"\x00garbage", b'{"hits": "not a list"}', b"RQEM" + b"\x01" * 40,
                 np.ones(384, dtype=np.float64).tobytes()):
        for key in keys:
            client.set(key, junk)
        result = cached.search(query, k=5)
        assert result.cache.result == "miss"
        assert _ids(result) == _ids(plain.search(query, k=5))
        cached.flush_cache_writes()
    assert cached.stats()["cache"]["corrupt"] >= 4


def test_concurrent_identical_misses_compute_once(root, encoder):
    counting = CountingEncoder(encoder)
    retriever = Retriever.load(root, encoder=counting)  # in-process cache (the default)
    counting.calls = 0
    barrier = threading.Barrier(16)
    results = []

    def worker() -> None:
        barrier.wait()
        results.append(retriever.search("a brand new question about stem cells", k=5))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 16 and len({tuple(_ids(r)) for r in results}) == 1
    assert counting.calls == 1
    assert retriever.stats()["cache"]["single_flight"]["shared"] >= 1


def test_hits_of_results_computed_here_skip_parsing(root, encoder, redis_server):
    """A miss remembers its result decoded: this process's hits on it parse no JSON, and a
    caller reordering its own hit list changes nothing for later hits. Another process (here
    a second retriever, with its own memory) parses the shared entry once."""
    config = {"backend": "redis", "url": redis_server.url, "namespace": f"t{time.monotonic_ns()}",
              "socket_timeout_ms": 500, "connect_timeout_ms": 500}
    writer = Retriever.load(root, {"cache": config}, encoder=encoder)
    reader = Retriever.load(root, {"cache": config}, encoder=encoder)
    try:
        first = writer.search(QUERIES[0], filters=FILTER, k=5)
        expected = _ids(first)
        first.hits.reverse()
        writer.flush_cache_writes()
        again = writer.search(QUERIES[0], filters=FILTER, k=5)
        assert again.cache.result == "hit" and _ids(again) == expected
        assert writer.stats()["cache"]["results_parsed"] == 0
        with pytest.raises(ValueError):
            again.hits[0].score = 0.0  # hits are shared with the cache: immutable
        elsewhere = [reader.search(QUERIES[0], filters=FILTER, k=5) for _ in range(3)]
        assert all(_ids(r) == expected for r in elsewhere)
        assert reader.stats()["cache"]["results_parsed"] == 1
    finally:
        writer.close()
        reader.close()


def test_results_kept_decoded_stay_within_the_caches_bytes(root, encoder):
    """The decoded results were bounded by count alone: with a 64 KiB cache, 40 searches at
    k=20 kept every result decoded (over a MB of JSON), though the cache held two or so."""
    bound = 64 * 1024
    with Retriever.load(root, {"cache": {"backend": "memory", "max_bytes": bound}},
                        encoder=encoder) as cached:
        for i, query in enumerate(itertools.islice(itertools.cycle(QUERIES), 40)):
            cached.search(f"{query} {i}", k=20)
        decoded = cached.stats()["cache"]["decoded"]
    assert 0 < decoded["json_bytes"] <= bound and decoded["results"] < 40


def test_a_result_written_by_an_older_release_is_a_miss(root, encoder, redis_server):
    """A result model gains fields from release to release (a hit's ``relevance``, the
    result's ``corrections``): a value an older worker wrote parsed with those at their
    defaults and was served as a hit, hits without relevance, so ``min_score`` kept none."""
    import json

    namespace = f"older{time.monotonic_ns()}"
    config = {"cache": {"backend": "redis", "url": redis_server.url, "namespace": namespace,
                        "socket_timeout_ms": 500, "connect_timeout_ms": 500}}
    writer = Retriever.load(root, config, encoder=encoder)
    query = QUERIES[1]
    expected = _ids(writer.search(query, k=5))
    writer.flush_cache_writes()
    writer.close()
    client = redis_server.client()
    [key] = [k for k in client.keys(f"{namespace}:*") if b":res:" in k]
    older = json.loads(client.get(key))
    for hit in older["hits"]:
        del hit["relevance"]
    client.set(key, json.dumps(older))
    reader = Retriever.load(root, config, encoder=encoder)  # a fresh worker: nothing decoded
    try:
        result = reader.search(query, k=5)
        assert result.cache.result == "miss"
        assert _ids(result) == expected
        assert all(hit.relevance is not None for hit in result.hits)
    finally:
        reader.close()


def test_what_a_caller_does_to_its_result_reaches_no_later_hit(root, encoder):
    """A result's lists were the cached result's own: a caller appending a note to the
    warnings of the result it got (the miss that stored it, or a hit) made every later hit
    of that entry carry the note."""
    cached = Retriever.load(root, {"cache": {"backend": "memory"}}, encoder=encoder)
    try:
        query = QUERIES[3]
        first = cached.search(query, k=5)
        first.warnings.append("the caller's own note")
        first.degraded.append("the caller's own flag")
        first.hits.reverse()
        hit = cached.search(query, k=5)
        assert hit.cache.result == "hit"
        assert (hit.warnings, hit.degraded) == ([], [])
        hit.warnings.append("another note")
        hit.corrections["x"] = "y"
        again = cached.search(query, k=5)
        assert (again.warnings, again.corrections) == ([], {})
        assert _ids(again) == _ids(hit) == list(reversed(_ids(first)))
    finally:
        cached.close()
