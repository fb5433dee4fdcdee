"""Caches and the feature store through a password-protected, TLS-only (mutual TLS) Redis.

A wrong password, a missing password and an untrusted server certificate are each a
``ConfigError`` at load naming the redacted URL; an ACL user works like the default user.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from tls_redis import PASSWORD, TlsRedisProcess, make_certificates

from retrieval.cache import CacheConfig, RedisCache, make_cache
from retrieval.errors import ConfigError
from retrieval.features import (
    CallableSource,
    Feature,
    FeatureStoreConfig,
    FeatureView,
    RedisStore,
    make_store,
    materialize,
)

VIEW = FeatureView(name="quality", features=(Feature(name="score", dtype="float32",
                                                     default=0.0),))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedisProcess]:
    server = TlsRedisProcess(make_certificates(tmp_path_factory.mktemp("certs")))
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def _cache(server: TlsRedisProcess, url: str, ca: str = "ca") -> RedisCache:
    cache = make_cache(CacheConfig(backend="redis", url=url, socket_timeout_ms=500,
                                   connect_timeout_ms=500, **server.tls(ca)))
    assert isinstance(cache, RedisCache)
    return cache


def _store(server: TlsRedisProcess, url: str, ca: str = "ca") -> RedisStore:
    store = make_store(FeatureStoreConfig(location=url, socket_timeout_ms=500,
                                          connect_timeout_ms=500, **server.tls(ca)))
    assert isinstance(store, RedisStore)
    return store


def test_cache_round_trip_over_tls_with_password(tls_redis: TlsRedisProcess) -> None:
    with _cache(tls_redis, tls_redis.url_for()) as cache:
        assert cache.probe()
        cache.set_many({"k1": b"v1"}, 60)
        assert cache.flush_writes(5)
        assert cache.get_many(["k1", "absent"]) == [b"v1", None]
        assert cache.stats()["errors"] == 0


def test_feature_store_over_tls_with_password(tls_redis: TlsRedisProcess) -> None:
    rows = [{"doc_id": f"d{i}", "score": float(i)} for i in range(50)]
    with _store(tls_redis, tls_redis.url_for()) as store:
        assert store.probe()
        report = materialize(VIEW, CallableSource(lambda: rows), store, progress=False)
        batch = store.read("quality", ["d7", "nope"])
        assert batch.available and batch.snapshot_id == report.snapshot_id
        assert np.allclose(batch.values["score"], [7.0, 0.0])
        assert store.online_snapshot_id("quality") == report.snapshot_id
        assert store.online_view("quality") == VIEW


def test_acl_user_is_accepted(tls_redis: TlsRedisProcess) -> None:
    admin = tls_redis.client()
    try:
        admin.execute_command("ACL", "SETUSER", "app", "on", ">app-pass", "~*", "+@all")
    finally:
        admin.close()
    with _cache(tls_redis, tls_redis.url_for("app-pass", user="app")) as cache:
        assert cache.probe()


def test_wrong_password_is_a_config_error_naming_the_redacted_url(
        tls_redis: TlsRedisProcess) -> None:
    url = tls_redis.url_for("wrong-pass")
    for opened in (_cache(tls_redis, url), _store(tls_redis, url)):
        with pytest.raises(ConfigError, match="authentication failed") as caught:
            opened.probe()
        message = str(caught.value)
        assert f"127.0.0.1:{tls_redis.port}" in message
        assert "wrong-pass" not in message and PASSWORD not in message
        opened.close()


def test_untrusted_server_certificate_is_a_config_error(tls_redis: TlsRedisProcess) -> None:
    url = tls_redis.url_for()
    for opened in (_cache(tls_redis, url, ca="other-ca"), _store(tls_redis, url, ca="other-ca")):
        with pytest.raises(ConfigError, match="TLS handshake failed") as caught:
            opened.probe()
        assert PASSWORD not in str(caught.value) and "***" in str(caught.value)
        opened.close()


def test_failures_while_serving_fail_open(tls_redis: TlsRedisProcess) -> None:
    """Past load, the same mistakes are outages: misses and defaults, never exceptions."""
    url = tls_redis.url_for("wrong-pass")
    with _cache(tls_redis, url) as cache:
        assert cache.get_many(["k1"]) == [None] and cache.stats()["errors"] == 1
    with _store(tls_redis, url) as store:
        store.register(VIEW)
        batch = store.read("quality", ["d1"])
        assert not batch.available and batch.values["score"].tolist() == [0.0]
