"""The one Redis link below the cache and the feature store: each reports its own errors."""

from __future__ import annotations

import logging
import time

import pytest
from polling import wait_until
from redis_servers import RedisProcess, free_port

from retrieval.cache import CacheConfig, CacheConfigError, RedisCache, make_cache
from retrieval.errors import ConfigError
from retrieval.features import (
    Feature,
    FeatureConfigError,
    FeatureStoreConfig,
    FeatureView,
    RedisStore,
    make_store,
)
from retrieval.resilience import CircuitBreaker, LinkSettings, RedisLink, redact_url
from retrieval.resilience.redis_link import DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_SOCKET_TIMEOUT_MS

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
    # redis-py authenticates with a password given as a query option too
    assert redact_url("redis://h:1/0?password=s3cret&socket_timeout=1") == \
        "redis://h:1/0?password=***&socket_timeout=1"


def test_outages_log_what_each_component_serves(caplog: pytest.LogCaptureFixture) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?password=s3cret"  # nothing listens there
    caplog.set_level(logging.INFO)  # too few failures to open a breaker: INFO lines
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
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize("section", ["cache", "feature_store"])
def test_breaker_opening_logs_one_warning_per_outage_naming_the_setting(
        section: str, caplog: pytest.LogCaptureFixture) -> None:
    """Two outages (SIGSTOPped server: reads time out), each with a failed half-open probe
    that re-opens the breaker: one WARNING per outage, naming the timeout setting to raise."""
    server = RedisProcess()
    server.start()
    cache = RedisCache(server.url, breaker_failures=3, breaker_cooldown_seconds=0.2)
    store = RedisStore(server.url, views=[VIEW], breaker_failures=3,
                       breaker_cooldown_seconds=0.2)  # both with the default timeouts
    link = cache.link if section == "cache" else store.link

    def call() -> object:
        return cache.get_many(["k"]) if section == "cache" else store.read("quality", ["a"])

    caplog.set_level(logging.INFO)
    try:
        assert wait_until(lambda: (call(), link.breaker.state == "closed")[1], 10.0)
        for _ in range(2):
            server.pause()
            try:
                for _ in range(3):
                    call()
                assert link.breaker.state == "open"
                time.sleep(0.25)  # past the cool-down: the probe times out, the breaker re-opens
                call()
                assert link.breaker.state == "open"
            finally:
                server.resume()
            assert wait_until(lambda: (call(), link.breaker.state == "closed")[1], 10.0)
    finally:
        cache.close()
        store.close()
        server.cleanup()
    assert link.breaker.opens == 4  # 2 trips + 2 re-opens
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    component = "redis cache" if section == "cache" else "feature store"
    for message in warnings:
        assert message.startswith(f"{component} {server.url} unavailable (timeout after "
                                  f"{DEFAULT_SOCKET_TIMEOUT_MS:.1f} ms, 3 failures in a row)")
        assert message.endswith(f"raise {section}.socket_timeout_ms "
                                f"(now {DEFAULT_SOCKET_TIMEOUT_MS:.1f})")
    assert sum("recovered" in r.getMessage() for r in caplog.records) == 2


def test_refused_connection_opening_names_no_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """A server that is down is no busy host: the line says so instead of naming a timeout."""
    caplog.set_level(logging.WARNING)
    with RedisCache(f"redis://127.0.0.1:{free_port()}/0", breaker_failures=1) as cache:
        assert cache.get_many(["k"]) == [None]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "not a timeout: check that Redis is up" in messages[0]
    assert "timeout_ms" not in messages[0]


def test_default_timeouts_reach_both_links() -> None:
    """Configs without the timeout keys, the classes and the link itself agree on the defaults
    chosen by benchmarks.redis_timeouts (benchmarks/README.md); nothing here needs a server."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    expected = (DEFAULT_SOCKET_TIMEOUT_MS / 1000, DEFAULT_CONNECT_TIMEOUT_MS / 1000)
    owners = [make_cache(CacheConfig(backend="redis", url=url)),
              make_store(FeatureStoreConfig(location=url)), RedisCache(url), RedisStore(url)]
    links = [owner.link for owner in owners if isinstance(owner, RedisCache | RedisStore)]
    links.append(RedisLink(url, LinkSettings(), logger=logging.getLogger("t"), what="t",
                           fallback="t", section="t"))
    assert [link.timeouts for link in links] == [expected] * 5
    for owner in owners:
        if owner is not None:
            owner.close()
    assert (DEFAULT_SOCKET_TIMEOUT_MS, DEFAULT_CONNECT_TIMEOUT_MS) == (50.0, 100.0)
