"""The one Redis link below the cache and the feature store: each reports its own errors."""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable

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


class TcpPeer:
    """A loopback TCP server that hands each connection to ``serve`` in a thread: a server
    that never answers, or one that drips its replies. ``close`` hangs up on everyone."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self._serve = serve
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            self.accepted.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for conn in self.accepted:
            with contextlib.suppress(OSError):  # its handler may have closed it already
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


def _never_answer(conn: socket.socket) -> None:
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


def _waiting_in_client(thread: threading.Thread) -> bool:
    """Whether ``thread`` waits on an event inside ``RedisLink.client`` (for another's connect)."""
    frame = sys._current_frames().get(thread.ident or -1)
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return {"client", "wait"} <= names


def test_callers_share_one_cluster_connect_attempt() -> None:
    """The Cluster client contacts the cluster when it is built. Callers used to queue on the
    lock held by that build, then each made its own failed attempt: 32 searches against a
    paused cluster waited up to 1.7 s. Now callers arriving during the build wait for it
    alone: when it fails they skip Redis (a short circuit), and it is the one failure."""
    peer = TcpPeer(_never_answer)  # accepts, never answers: a paused node
    cache = RedisCache(peer.url, cluster=True, socket_timeout_ms=30_000, breaker_failures=5)
    first = threading.Thread(target=cache.get_many, args=(["k"],), daemon=True)
    second_got: list[object] = []
    second = threading.Thread(target=lambda: second_got.append(cache.get_many(["k"])),
                              daemon=True)
    try:
        first.start()
        assert wait_until(lambda: len(peer.accepted) == 1, 10.0)  # building, waiting on a read
        second.start()
        assert wait_until(lambda: _waiting_in_client(second), 10.0), \
            "not waiting for the connect under way (queued for a connect of its own?)"
    finally:
        peer.close()  # the build fails now; the listener is gone, so a retry is refused
        first.join(10.0)
        second.join(10.0)
        cache.close()
    assert second_got == [[None]]
    stats = cache.stats()
    assert (stats["errors"], stats["short_circuits"], stats["breaker_state"]) == (1, 1, "closed")


def test_a_skipped_half_open_probe_hands_its_turn_back() -> None:
    """A half-open probe that found a connect in progress used Redis for nothing: the breaker
    goes back to open, past its cool-down, so the next caller probes (it is not left half
    open, which would short-circuit every call for good)."""
    now = [0.0]
    breaker = CircuitBreaker(failures_to_open=1, cooldown_seconds=1.0, clock=lambda: now[0])
    breaker.record_failure()
    now[0] = 1.0
    assert breaker.allow() and breaker.state == "half_open"
    breaker.record_skip()
    assert breaker.state == "open" and breaker.short_circuits == 1
    assert breaker.allow() and breaker.state == "half_open"
    # Another caller's skip (let in while the breaker was closed, its wait ending now) leaves
    # the probe in flight: handing it back let a second probe in beside it.
    other = threading.Thread(target=breaker.record_skip)
    other.start()
    other.join()
    assert breaker.state == "half_open" and not breaker.allow()


def test_a_probe_never_ends_an_outage_nor_clears_its_failures() -> None:
    """``FeatureStage`` probes every refresh period. A PING's answer closed the breaker,
    ending each cool-down early; on a Cluster the PING goes to the default node, so reads
    went on waiting on the dead node holding the data. Now only a call (the half-open one)
    closes the breaker, and an answered PING does not reset the count of failed calls."""
    server = RedisProcess()
    server.start()
    store = RedisStore(server.url, views=[VIEW], breaker_failures=2,
                       breaker_cooldown_seconds=60.0)
    link = store.link
    try:
        assert wait_until(lambda: (store.read("quality", ["a"]), link.breaker.state)[1]
                          == "closed", 10.0)
        server.pause()
        store.read("quality", ["a"])  # times out: one failure of two
        server.resume()
        assert store.probe()  # answered, yet says nothing of the failed read
        server.pause()
        store.read("quality", ["a"])  # the second failure in a row
        server.resume()
        assert link.breaker.state == "open"
        assert not store.probe()  # an outage in progress: no PING ends it
        assert link.breaker.state == "open"
    finally:
        store.close()
        server.cleanup()


VALUE = b"v" * 60


def _drip_replies(conn: socket.socket) -> None:
    """Answer each command (one MGET of one key, or PING) a byte every 20 ms."""
    with conn:
        try:
            while command := conn.recv(65536):
                reply = (b"+PONG\r\n" if b"PING" in command.upper()
                         else b"*1\r\n$%d\r\n%s\r\n" % (len(VALUE), VALUE))
                for byte in reply:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.02)
        except OSError:
            pass


def test_a_reply_dripped_past_the_call_budget_counts_as_a_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    """``socket_timeout_ms`` bounds each read, not the call: a server dripping a 71-byte
    reply a byte per 20 ms (each read well inside 100 ms) was waited on for 1.4 s and counted
    a success, call after call. Now a call past its budget (1.05 s here) counts as a timeout
    and opens the breaker; its answer, correct and already paid for, is still used."""
    peer = TcpPeer(_drip_replies)
    caplog.set_level(logging.WARNING)
    cache = RedisCache(peer.url, socket_timeout_ms=100, connect_timeout_ms=50,
                       breaker_failures=1)
    try:
        assert cache.get_many(["k"]) == [VALUE]
        assert cache.link.breaker.state == "open"
        assert cache.link.call_budget_s == pytest.approx(1.05)
        assert cache.get_many(["k"]) == [None]  # skipped during the cool-down
    finally:
        cache.close()
        peer.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "(slow answer: answered after " in warnings[0]
    assert warnings[0].endswith("raise cache.socket_timeout_ms (now 100.0)")
