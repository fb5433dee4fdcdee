"""Request-path guarantees through the Retriever: config errors are ours, configuration is
checked against the store at load, deadlines degrade instead of waiting, overload is shed.

Time is the subject of the deadline and overload tests, so they use an encoder gated by an
event: a search that would wait on it can only finish by the mechanism under test.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from polling import wait_until
from pydantic import ValidationError
from small_index import QUERIES, index_fixture, query_encoder_fixture  # noqa: F401

from retrieval import Retriever
from retrieval.cli import main as cli_main
from retrieval.errors import (
    ConfigError,
    InvalidQueryError,
    LimitExceededError,
    OverloadedError,
    RetrievalError,
)
from retrieval.features import CallableSource, Feature, FeatureView, LocalStore, materialize

VIEW = FeatureView(name="popularity", features=(Feature(name="clicks", dtype="float32",
                                                        default=0.0),))


class GatedEncoder:
    """The real query encoder behind a gate: ``encode`` waits until ``gate`` is set and
    signals ``entered`` first, so a test knows a search is inside the encoder."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)

    def close_gate(self) -> None:
        """From now on ``encode`` waits (load-time warm-up calls are forgotten)."""
        self.entered = threading.Semaphore(0)
        self.gate.clear()

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        self.entered.release()
        assert self.gate.wait(30), "the test never opened the gate"
        return self.inner.encode(list(texts))


@pytest.fixture(scope="module")
def store_dir(index, query_encoder, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("features")
    with Retriever.load(index, {"cache": {"backend": "none"}}, encoder=query_encoder) as plain:
        ids = plain.snapshot.docs.all_ids()
    rows = [{"doc_id": d, "clicks": float(i % 7)} for i, d in enumerate(ids)]
    materialize(VIEW, CallableSource(lambda: rows), LocalStore(directory), progress=False)
    return directory


def _features(location: Path, view: str = "popularity", weight_key: str = "clicks") -> dict:
    return {"feature_store": {"location": str(location)},
            "features": [{"view": view, "weights": {weight_key: 0.3}}]}


# -- config errors ----------------------------------------------------------------------------

@pytest.mark.parametrize(("config", "key", "fix"), [
    ({"candidates": 0}, "candidates", "greater than or equal to 1"),
    ({"candidats": 50}, "candidats", "did you mean 'candidates'"),
    ({"cache": {"backend": "redis"}}, "cache", "url is required"),
    ({"deadline_ms": -5}, "deadline_ms", "greater than 0"),
    ({"max_in_flight": 0}, "max_in_flight", "greater than or equal to 1"),
])
def test_invalid_config_is_a_config_error(index, config, key, fix) -> None:
    with pytest.raises(ConfigError, match=fix) as caught:
        Retriever.load(index, config)
    assert caught.value.key == key and not isinstance(caught.value, ValidationError)


def test_cli_prints_config_error_without_traceback(index, capsys) -> None:
    assert cli_main(["search", str(index), "boundary layer", "--candidates", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid RetrieverConfig: candidates")
    assert "Traceback" not in err


# -- configuration checked against the store at load ------------------------------------------

def test_misspelled_view_names_the_closest(index, query_encoder, store_dir) -> None:
    with pytest.raises(ConfigError, match="did you mean 'popularity'") as caught:
        Retriever.load(index, _features(store_dir, view="populrity"), encoder=query_encoder)
    assert caught.value.key == "features.0.view"


def test_weight_on_a_feature_the_view_lacks(index, query_encoder, store_dir) -> None:
    with pytest.raises(ConfigError, match="did you mean 'clicks'") as caught:
        Retriever.load(index, _features(store_dir, weight_key="clics"), encoder=query_encoder)
    assert caught.value.key == "features.0.weights.clics"


def test_missing_store_directory_is_unavailable_and_logged_once(
        index, query_encoder, store_dir, tmp_path, caplog) -> None:
    missing = tmp_path / "not-there"
    caplog.set_level(logging.WARNING, logger="retrieval.request_path.feature_stage")
    with Retriever.load(index, _features(missing), encoder=query_encoder) as retriever:
        results = [retriever.search(q, k=5) for q in QUERIES[:3]]
        assert [r.features_available for r in results] == [False, False, False]
        warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(warnings) == 1 and str(missing) in warnings[0].getMessage()
        # The store appears (a first nightly job): the next refresh brings features back.
        rows = [{"doc_id": d, "clicks": 1.0} for d in retriever.snapshot.docs.all_ids()]
        materialize(VIEW, CallableSource(lambda: rows), LocalStore(missing), progress=False)
        retriever._features.refresh()  # what the background refresher does every second
        assert retriever.search(QUERIES[4], k=5).features_available is True


# -- deadlines -------------------------------------------------------------------------------

def test_slow_encoder_past_the_deadline_ranks_by_bm25(index, query_encoder) -> None:
    gated = GatedEncoder(query_encoder)
    bm25_only = Retriever.load(index, {"vector_weight": 0.0, "cache": {"backend": "none"}},
                               encoder=query_encoder)
    with Retriever.load(index, {"cache": {"backend": "memory"}}, encoder=gated) as retriever:
        gated.close_gate()  # the encoder never answers while the searches run
        try:
            first = retriever.search(QUERIES[1], k=10, deadline_ms=10)
            again = retriever.search(QUERIES[1], k=10, deadline_ms=10)
        finally:
            gated.gate.set()
        expected = bm25_only.search(QUERIES[1], k=10)
        assert first.degraded == ["embed"]
        assert [h.doc_id for h in first.hits] == [h.doc_id for h in expected.hits]
        assert all(h.vector_score == 0.0 for h in first.hits)
        assert again.cache.result == "miss"  # a degraded result is never cached
        assert retriever.stats()["degraded"]["embed"] == 2
        healthy = retriever.search(QUERIES[1], k=10, deadline_ms=10_000)
        assert healthy.degraded == [] and healthy.hits[0].vector_score != 0.0
    bm25_only.close()


def test_config_deadline_applies_and_features_past_it_are_skipped(index, query_encoder,
                                                                  store_dir) -> None:
    gated = GatedEncoder(query_encoder)
    config = {"deadline_ms": 5, "cache": {"backend": "none"}, **_features(store_dir)}
    with Retriever.load(index, config, encoder=gated) as retriever:
        gated.close_gate()
        try:
            result = retriever.search(QUERIES[2], k=5)
        finally:
            gated.gate.set()
    # The encoder wait used the whole budget, so the feature read was skipped as well.
    assert result.degraded == ["embed", "features"] and result.features_available is None


@pytest.mark.parametrize("cache", ["memory", "none"])
@pytest.mark.parametrize("call", ["search_batch", "asearch_batch"])
def test_a_batch_past_its_deadline_ranks_every_query_by_bm25_and_caches_none(
        index, query_encoder, cache, call) -> None:
    """One budget for the whole batch: its one encoder call never answers, so every query
    stops waiting for it when the budget is spent and ranks by BM25 alone."""
    gated = GatedEncoder(query_encoder)
    queries = QUERIES[6:9]
    with Retriever.load(index, {"vector_weight": 0.0, "cache": {"backend": "none"}},
                        encoder=query_encoder) as bm25_only:
        expected = [[h.doc_id for h in bm25_only.search(q, k=10).hits] for q in queries]
    with Retriever.load(index, {"cache": {"backend": cache}}, encoder=gated) as retriever:
        gated.close_gate()
        try:
            late = (retriever.search_batch(queries, k=10, deadline_ms=10) if call == "search_batch"
                    else asyncio.run(retriever.asearch_batch(queries, k=10, deadline_ms=10)))
        finally:
            gated.gate.set()
        assert [r.degraded for r in late] == [["embed"]] * 3
        assert [[h.doc_id for h in r.hits] for r in late] == expected
        assert all(h.vector_score == 0.0 for r in late for h in r.hits)
        assert retriever.stats()["degraded"]["embed"] == 3
        retriever.flush_cache_writes()
        again = retriever.search_batch(queries, k=10)
    assert [r.degraded for r in again] == [[]] * 3
    if cache == "memory":  # neither the results nor the late encode's vectors were kept
        assert [(r.cache.result, r.cache.embedding) for r in again] == [("miss", "miss")] * 3


def test_a_batch_takes_the_config_deadline_and_skips_features_past_it(index, query_encoder,
                                                                     store_dir) -> None:
    gated = GatedEncoder(query_encoder)
    config = {"deadline_ms": 5, "cache": {"backend": "memory"}, **_features(store_dir)}
    with Retriever.load(index, config, encoder=gated) as retriever:
        gated.close_gate()
        try:
            results = retriever.search_batch(QUERIES[9:11], k=5)
        finally:
            gated.gate.set()
    assert [r.degraded for r in results] == [["embed", "features"]] * 2
    assert all(r.features_available is None and r.hits for r in results)


class TimingOutEncoder:
    """A remote model's client whose own call times out: an encoder failure, not a budget
    the search spent."""

    def __init__(self, inner) -> None:
        self.inner, self.answers = inner, True  # answers while the retriever loads
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim

    def encode(self, texts, *, batch_size: int = 64, progress: bool = False):
        if self.answers:
            return self.inner.encode(texts, batch_size=batch_size, progress=progress)
        raise TimeoutError("the model server did not answer in 5 s")


def test_an_encoder_timing_out_fails_the_search_within_its_deadline(index, query_encoder):
    """Its TimeoutError is the one a budget's wait raises: a search (or a batch) computing
    its embedding beside BM25 degraded to BM25 alone without a word."""
    timing_out = TimingOutEncoder(query_encoder)
    with Retriever.load(index, {"cache": {"backend": "none"}}, encoder=timing_out) as retriever:
        timing_out.answers = False
        for deadline_ms in (None, 60_000):
            with pytest.raises(TimeoutError, match="did not answer"):
                retriever.search_batch(QUERIES[:3], k=5, deadline_ms=deadline_ms)
            with pytest.raises(TimeoutError, match="did not answer"):
                retriever.search(QUERIES[3], k=5, deadline_ms=deadline_ms)


class NanEncoder(TimingOutEncoder):
    """A broken model: NaN for every query once the retriever has loaded."""

    def encode(self, texts, *, batch_size: int = 64, progress: bool = False):
        vectors = self.inner.encode(texts, batch_size=batch_size, progress=progress)
        return vectors if self.answers else np.full_like(vectors, np.nan)


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_an_encoder_giving_nan_fails_the_search_naming_it(index, query_encoder, cache):
    """NaN scored every document alike: no hits and no word uncached, and the cache's write
    of the embedding raised its own CacheValueError."""
    broken = NanEncoder(query_encoder)
    with Retriever.load(index, {"cache": {"backend": cache}}, encoder=broken) as retriever:
        broken.answers = False
        for deadline_ms in (None, 60_000):
            with pytest.raises(RetrievalError, match="gave NaN or infinity"):
                retriever.search(QUERIES[3], k=5, deadline_ms=deadline_ms)
            with pytest.raises(RetrievalError, match="gave NaN or infinity"):
                retriever.search_batch(QUERIES[:3], k=5, deadline_ms=deadline_ms)


@pytest.mark.parametrize("cache", ["memory", "none"])
def test_a_batch_within_its_deadline_equals_the_batch_without_one(index, query_encoder,
                                                                  cache) -> None:
    config = {"cache": {"backend": cache}}
    with Retriever.load(index, config, encoder=query_encoder) as plain, \
            Retriever.load(index, config, encoder=query_encoder) as timed:
        expected = plain.search_batch(QUERIES[:5], k=5)
        timely = timed.search_batch(QUERIES[:5], k=5, deadline_ms=60_000)
        assert asyncio.run(timed.asearch_batch(QUERIES[5:7], k=5, deadline_ms=60_000)
                           )[1].hits == plain.search_batch(QUERIES[5:7], k=5)[1].hits
    assert [r.degraded for r in timely] == [[]] * 5
    assert [r.hits for r in timely] == [r.hits for r in expected]
    assert [r.cache for r in timely] == [r.cache for r in expected]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "10", True, 9.3e12, 86_400_001])
def test_invalid_deadline_is_an_invalid_query(index, query_encoder, bad) -> None:
    """Also budgets past a day: 9.3e12 ms overflowed the thread timeout (a builtin
    OverflowError, a 500 over HTTP) before the limit."""
    with Retriever.load(index, {"cache": {"backend": "none"}}, encoder=query_encoder) as r:
        with pytest.raises(InvalidQueryError, match="deadline_ms"):
            r.search(QUERIES[0], deadline_ms=bad)
        with pytest.raises(InvalidQueryError, match="deadline_ms"):
            r.search_batch(QUERIES[:2], deadline_ms=bad)


# -- load shedding -----------------------------------------------------------------------------

def test_searches_past_max_in_flight_are_shed_at_once(index, query_encoder) -> None:
    gated = GatedEncoder(query_encoder)
    config = {"max_in_flight": 2, "cache": {"backend": "none"}}
    with Retriever.load(index, config, encoder=gated) as retriever, \
            ThreadPoolExecutor(2) as callers:
        gated.close_gate()
        try:
            running = [callers.submit(retriever.search, q, k=3) for q in QUERIES[:2]]
            for _ in running:  # both searches are inside the encoder: 2 in flight
                assert gated.entered.acquire(timeout=30)
            with pytest.raises(OverloadedError, match="max_in_flight=2"):
                retriever.search(QUERIES[3], k=3)
        finally:
            gated.gate.set()
        assert all(f.result(timeout=30).hits for f in running)
        assert retriever.stats()["shed"] == 1
        assert retriever.search(QUERIES[3], k=3).hits  # capacity is back


def test_a_batch_over_its_work_bounds_is_refused_before_any_work(index, query_encoder) -> None:
    """queries x k and queries x candidates are bounded per call (a 256 x k=1000 batch took
    44 s of CPU and GBs of memory before the bound), with a typed error saying which."""
    counting = GatedEncoder(query_encoder)
    config = {"cache": {"backend": "none"}, "limits": {"max_batch_hits": 100,
                                                       "max_batch_candidates": 3000}}
    with Retriever.load(index, config, encoder=counting) as retriever:
        counting.entered = threading.Semaphore(0)  # forget the load's warm-up encode
        with pytest.raises(LimitExceededError, match=r"queries x k.*max_batch_hits"):
            retriever.search_batch(QUERIES * 20, k=10)
        with pytest.raises(LimitExceededError, match="max_batch_candidates"):
            asyncio.run(retriever.asearch_batch(QUERIES[:4], k=5, candidates=1000))
        assert not counting.entered.acquire(blocking=False)  # refused before any encode
        assert len(retriever.search_batch(QUERIES[:5], k=10)) == 5
    config["limits"]["max_batch_hits"] = None
    with Retriever.load(index, config, encoder=counting) as retriever:  # candidates raised to k
        with pytest.raises(LimitExceededError, match="max_batch_candidates"):
            retriever.search_batch(QUERIES[:4], k=800, candidates=50)


def test_a_search_without_a_deadline_never_takes_a_degraded_result_from_a_shared_flight(
        index, query_encoder) -> None:
    """Identical concurrent misses share one computation; when the leader's deadline
    degraded it (BM25 alone), a follower with time to spare computes its own."""
    gated = GatedEncoder(query_encoder)
    with Retriever.load(index, {"cache": {"backend": "memory"}}, encoder=gated) as retriever, \
            ThreadPoolExecutor(2) as callers:
        gated.close_gate()
        try:
            leader = callers.submit(retriever.search, QUERIES[4], k=5, deadline_ms=2_000)
            assert gated.entered.acquire(timeout=30)  # the leader is inside the encoder
            follower = callers.submit(retriever.search, QUERIES[4], k=5)
            assert leader.result(timeout=30).degraded == ["embed"]
            assert retriever.stats()["cache"]["single_flight"]["shared"] == 1  # it joined
            assert gated.entered.acquire(timeout=30)  # and then encoded for itself
        finally:
            gated.gate.set()
        result = follower.result(timeout=30)
    assert result.degraded == [] and result.hits[0].vector_score != 0.0


def test_a_search_joining_a_slow_flight_waits_no_longer_than_its_own_deadline(
        index, query_encoder) -> None:
    """A follower with a deadline stops waiting for a leader without one when its budget
    ends, and ranks by what it has (BM25 alone), as if it had searched alone."""
    gated = GatedEncoder(query_encoder)
    with Retriever.load(index, {"cache": {"backend": "memory"}}, encoder=gated) as retriever, \
            ThreadPoolExecutor(2) as callers:
        gated.close_gate()
        try:
            leader = callers.submit(retriever.search, QUERIES[3], k=5)
            assert gated.entered.acquire(timeout=30)  # the leader is inside the encoder
            follower = callers.submit(retriever.search, QUERIES[3], k=5, deadline_ms=300)
            result = follower.result(timeout=20)  # the gate is still closed
            assert result.degraded == ["embed"] and result.hits
            assert retriever.stats()["cache"]["single_flight"]["shared"] == 1
        finally:
            gated.gate.set()
        assert leader.result(timeout=30).degraded == []


def test_a_search_joining_a_flight_gets_its_own_query_and_hit_list(index, query_encoder
                                                                   ) -> None:
    """The shared result is copied as a cache hit is: the follower's query text (the key
    collapses whitespace), timings and cache status, and a list of its own."""
    gated = GatedEncoder(query_encoder)
    spaced = QUERIES[2].replace(" ", "   ", 1)
    with Retriever.load(index, {"cache": {"backend": "memory"}}, encoder=gated) as retriever, \
            ThreadPoolExecutor(2) as callers:
        gated.close_gate()
        try:
            leader = callers.submit(retriever.search, QUERIES[2], k=5)
            assert gated.entered.acquire(timeout=30)
            follower = callers.submit(retriever.search, spaced, k=5)
            assert wait_until(lambda: retriever.stats()["cache"]["single_flight"]["shared"] == 1)
        finally:
            gated.gate.set()
        first, second = leader.result(timeout=30), follower.result(timeout=30)
    assert (first.query, second.query) == (QUERIES[2], spaced)
    assert second.cache.result == "hit" and first.cache.result == "miss"
    assert [h.doc_id for h in second.hits] == [h.doc_id for h in first.hits]
    first.hits.clear()
    assert len(second.hits) == 5


def test_a_degraded_batch_result_is_never_cached(index, query_encoder) -> None:
    """A layout that left a shard out (``partial:<shard>``, Ray with allow_partial) says so
    in the result; a batch must not serve that result to later searches, as one search
    does not."""
    with Retriever.load(index, {"cache": {"backend": "memory"}}, encoder=query_encoder) as r:
        snapshot = r.snapshot
        object.__setattr__(snapshot, "degradations", lambda: ["partial:1"])
        try:
            first = r.search_batch(QUERIES[5:7], k=3)
        finally:
            object.__delattr__(snapshot, "degradations")
        assert [result.degraded for result in first] == [["partial:1"], ["partial:1"]]
        r.flush_cache_writes()
        again = r.search_batch(QUERIES[5:7], k=3)
    assert [(a.cache.result, a.degraded) for a in again] == [("miss", []), ("miss", [])]


@pytest.mark.parametrize(("field", "says"), [("department", "a keyword field"),
                                             ("yeer", "no metadata field of this build.*"
                                                      "did you mean 'year'")])
def test_a_recency_field_that_is_no_date_is_refused_at_load(index, query_encoder, field,
                                                            says) -> None:
    """Accepted before, then every search raised a bare KeyError."""
    with pytest.raises(ConfigError, match=f"recency.field {field!r} is {says}") as caught:
        Retriever.load(index, {"recency": {"field": field}}, encoder=query_encoder)
    assert caught.value.key == "recency.field"
