"""The one Redis link below the cache and the feature store: each reports its own errors."""

from __future__ import annotations

import logging

import pytest
from redis_servers import free_port

from retrieval.cache import CacheConfigError, RedisCache
from retrieval.errors import ConfigError
from retrieval.features import Feature, FeatureConfigError, FeatureView, RedisStore
from retrieval.resilience import CircuitBreaker, redact_url

VIEW = FeatureView(name="quality", features=(Feature(name="score", dtype="float32",
                                                     default=0.5),))


def test_bad_urls_are_config_errors_of_their_own_component() -> None:
    with pytest.raises(FeatureConfigError, match="redis:// or rediss://") as store_error:
        RedisStore("http://127.0.0.1:6379")
    assert not isinstance(store_error.value, CacheConfigError)
    with pytest.raises(CacheConfigError, match="redis:// or rediss://") as cache_error:
        RedisCache("http://127.0.0.1:6379")
    assert isinstance(cache_error.value, ConfigError) and cache_error.value.key == "url"
    with pytest.raises(ConfigError, match="failures_to_open"):
        CircuitBreaker(failures_to_open=0)


def test_redaction_hides_the_password() -> None:
    assert redact_url("rediss://app:s3cret@h:6380/1") == "rediss://app:***@h:6380/1"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_outages_log_what_each_component_serves(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    caplog.set_level(logging.WARNING)
    with RedisStore(url, socket_timeout_ms=50, connect_timeout_ms=50, views=[VIEW]) as store:
        batch = store.read("quality", ["a", "b"])
        assert not batch.available and batch.values["score"].tolist() == [0.5, 0.5]
        assert not store.probe()  # unreachable is not a configuration error
    with RedisCache(url, socket_timeout_ms=50, connect_timeout_ms=50) as cache:
        assert cache.get_many(["k"]) == [None]
    store_logs = [r.getMessage() for r in caplog.records if r.name.endswith("redis_store")]
    cache_logs = [r.getMessage() for r in caplog.records if r.name.endswith("redis_backend")]
    assert store_logs and all("serving feature defaults" in m for m in store_logs)
    assert not any("cache" in m for m in store_logs)
    assert cache_logs and all("serving cache misses" in m for m in cache_logs)
