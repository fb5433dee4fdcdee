"""The fault matrix, through the ``Retriever``: result cache {memory, redis} x the Redis behind
the cache and the feature store {down, paused (SIGSTOP), slow (+50 ms), answering garbage}.

Every cell: no search fails, none hangs, results say ``features_available=False`` and the
Redis result cache (when used) reports misses with its errors counted. Latency per cell is
recorded (printed with ``-s``); its bound against the configured timeouts is measured by
``python -m benchmarks.soak``, not asserted here (shared, noisy machine).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_proxy import FaultProxy
from redis_servers import RedisProcess
from small_index import QUERIES, index_fixture, query_encoder_fixture  # noqa: F401

from retrieval import Retriever
from retrieval.features import CallableSource, Feature, FeatureView, RedisStore, materialize

VIEW = FeatureView(name="popularity", features=(Feature(name="clicks", dtype="float32",
                                                        default=0.0),))
FEATURE_TIMEOUT_MS = 20.0
CACHE_TIMEOUT_MS = 5.0
HANG = 2.0  # seconds: far above every timeout; only a search that waits on a dead peer gets here


@pytest.fixture(scope="module")
def redis_behind_proxy(index: Path) -> Iterator[tuple[RedisProcess, FaultProxy]]:
    server = RedisProcess()
    server.start()
    proxy = FaultProxy(server.port)
    try:
        plain = Retriever.load(index, {"cache": {"backend": "none"}}, encoder=None)
        ids = plain.snapshot.docs.all_ids()
        plain.close()
        rows = [{"doc_id": d, "clicks": float(i % 17)} for i, d in enumerate(ids)]
        with RedisStore(server.url) as store:
            materialize(VIEW, CallableSource(lambda: rows), store, progress=False)
        yield server, proxy
    finally:
        proxy.close()
        server.cleanup()


def _config(proxy: FaultProxy, cache: str) -> dict:
    cache_config: dict = {"backend": cache}
    if cache == "redis":
        cache_config.update(url=proxy.url, socket_timeout_ms=CACHE_TIMEOUT_MS,
                            connect_timeout_ms=CACHE_TIMEOUT_MS)
    return {
        "cache": cache_config,
        "feature_store": {"location": proxy.url, "socket_timeout_ms": FEATURE_TIMEOUT_MS,
                          "connect_timeout_ms": FEATURE_TIMEOUT_MS},
        "features": [{"view": "popularity", "weights": {"clicks": 0.2}}],
    }


def _healthy(retriever: Retriever, within: float = 5.0) -> bool:
    """The precondition of a cell: features reach the results. A busy machine may miss a
    20 ms timeout, the load-time probe's too, and then every search says features are
    unavailable until the next background probe (every second): tries for a few seconds do."""
    give_up = time.monotonic() + within
    while not retriever.search(QUERIES[0], k=5).features_available:
        if time.monotonic() > give_up:
            return False
        time.sleep(0.05)
    return True


def _inject(fault: str, server: RedisProcess, proxy: FaultProxy) -> None:
    if fault == "paused":
        server.pause()
    else:
        proxy.set_mode(fault)  # type: ignore[arg-type]


def _heal(server: RedisProcess, proxy: FaultProxy) -> None:
    server.resume()
    proxy.set_mode("pass")


@pytest.mark.parametrize("fault", ["down", "paused", "slow", "garbage"])
@pytest.mark.parametrize("cache", ["memory", "redis"])
def test_fault_cell(index, query_encoder, redis_behind_proxy, cache: str, fault: str) -> None:
    server, proxy = redis_behind_proxy
    retriever = Retriever.load(index, _config(proxy, cache), encoder=query_encoder)
    try:
        assert _healthy(retriever)
        hits_before = (retriever.stats()["cache"] or {}).get("result_hits", 0)
        _inject(fault, server, proxy)
        worst, slowest = 0.0, {}
        for query in [*QUERIES[1:], QUERIES[0]]:  # fresh queries, then the healthy one again
            started = time.perf_counter()
            result = retriever.search(query, k=5)
            took = time.perf_counter() - started
            worst, slowest = max((worst, slowest), (took, result.timings))
            assert result.hits, query
            if result.cache.result != "hit":
                assert result.features_available is False, (cache, fault, query)
        assert worst < HANG, f"a search took {worst:.3f} s with the Redis {fault}"
        print(f"\n{cache:6s} x {fault:8s}: worst search {worst * 1e3:.1f} ms "
              f"{ {k: round(v, 1) for k, v in slowest.items()} }")
        stats = retriever.stats()
        features = retriever._features.store.stats()  # type: ignore[union-attr]
        assert features["errors"] + features["short_circuits"] > 0
        if cache == "redis":
            backend = stats["cache"]["backend"]
            assert backend["errors"] + backend["short_circuits"] > 0
            assert stats["cache"]["result_hits"] == hits_before  # nothing readable while sick
    finally:
        _heal(server, proxy)
        retriever.close()


def test_a_result_ranked_without_features_is_not_served_once_the_store_answers(
        index, query_encoder, redis_behind_proxy) -> None:
    """While the store is down the snapshot key still names the good snapshot, so a result
    ranked on defaults was cached under the healthy key and served for the whole TTL."""
    server, proxy = redis_behind_proxy
    with Retriever.load(index, _config(proxy, "memory"), encoder=query_encoder) as retriever:
        assert _healthy(retriever)
        _inject("down", server, proxy)
        try:
            assert retriever.search(QUERIES[2], k=5).features_available is False
        finally:
            _heal(server, proxy)
        retriever._features.refresh()  # what the background refresher does every second
        assert _healthy(retriever)
        again = retriever.search(QUERIES[2], k=5)
    assert (again.cache.result, again.features_available) == ("miss", True)
