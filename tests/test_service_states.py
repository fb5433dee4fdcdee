"""The service's states that the end-to-end server test cannot time: loading, a failed load,
and a cache server that dies under it.

The real app (``create_app``) is driven in this process through Starlette's test client, which
runs its lifespan; the retriever is a real one over the small Cranfield index, and the cache a
real ``redis-server`` this test starts and stops.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis_servers import RedisProcess
from small_index import index_fixture, query_encoder_fixture  # noqa: F401 (fixtures)
from starlette.testclient import TestClient

from retrieval import Retriever, RetrieverConfig
from retrieval.service.app import create_app
from retrieval.service.settings import ServeConfig

LOAD_TIMEOUT = 120.0


def wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + LOAD_TIMEOUT
    while time.monotonic() < deadline:
        if client.get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    pytest.fail("the service never became ready")


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_readyz_is_503_while_the_build_loads_then_200(index: Path) -> None:
    release = threading.Event()

    def slow_loader() -> Retriever:  # a real load that waits until the test has looked
        release.wait(LOAD_TIMEOUT)
        return Retriever.load(index, RetrieverConfig())

    app = create_app(index, ServeConfig(), loader=slow_loader)
    with TestClient(app) as client:
        loading = client.get("/readyz")
        assert loading.status_code == 503
        error = loading.json()["error"]
        assert error["type"] == "ServiceUnavailableError" and "loading" in error["message"]
        assert client.get("/healthz").status_code == 200  # alive while loading
        refused = client.post("/v1/search", json={"query": "boundary layer", "k": 3})
        assert refused.status_code == 503
        release.set()
        wait_ready(client)
        served = client.post("/v1/search", json={"query": "boundary layer", "k": 3})
        assert served.status_code == 200 and len(served.json()["hits"]) == 3


def test_readyz_names_why_a_build_could_not_be_loaded(tmp_path: Path) -> None:
    with TestClient(create_app(tmp_path / "no-index", ServeConfig())) as client:
        deadline = time.monotonic() + LOAD_TIMEOUT
        while (answer := client.get("/readyz")).json()["error"]["message"].startswith(
                "loading") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert answer.status_code == 503
        message = answer.json()["error"]["message"]
        assert message.startswith("the index could not be loaded")
        assert "INDEX_ROOT is neither" in message and str(tmp_path) not in message  # no paths
        assert client.get("/healthz").status_code == 200


def cache_config(redis: RedisProcess) -> dict[str, Any]:
    return {"backend": "redis", "url": redis.url, "breaker_failures": 2,
            "breaker_cooldown_seconds": 60.0, "socket_timeout_ms": 50.0,
            "connect_timeout_ms": 50.0}


def test_metrics_show_cache_errors_and_the_open_breaker_when_redis_dies(index: Path) -> None:
    redis = RedisProcess()
    redis.start()
    try:
        config = ServeConfig.model_validate({"retriever": {"cache": cache_config(redis)}})
        with TestClient(create_app(index, config)) as client:
            wait_ready(client)
            assert client.post("/v1/search", json={"query": "heat transfer"}).status_code == 200
            before = samples(client)
            assert before[("retrieval_cache_breaker_state", (("state", "closed"),))] == 1.0
            redis.stop()
            for i in range(6):  # distinct queries: every one needs the (dead) cache
                answer = client.post("/v1/search", json={"query": f"shock wave number {i}"})
                assert answer.status_code == 200, answer.text  # a dead cache is a miss
            after = samples(client)
            assert after[("retrieval_cache_errors_total", ())] >= 2
            assert after[("retrieval_cache_breaker_state", (("state", "open"),))] == 1.0
            assert after[("retrieval_cache_breaker_state", (("state", "closed"),))] == 0.0
    finally:
        redis.cleanup()


def test_readyz_says_when_the_write_ahead_log_is_damaged(tmp_path: Path, dataset: Any) -> None:
    """A damaged record inside the log, with acknowledged writes after it: a worker that has
    applied the records before it stays alive and turns /readyz to 503 naming the damage; a
    worker starting on that root reports it and never drops the writes after it (searches
    over the last good state: tests/test_live_serving.py)."""
    from live_index import build_small, scifact_docs, unit_vectors
    from test_live_serving import _append_damaged_then_whole

    from indexes import Document
    from indexes.wal import segments
    from indexes.writer import IndexWriter

    docs = scifact_docs(dataset("scifact"), 40)
    build_small(tmp_path, docs)
    config = ServeConfig.model_validate({"retriever": {"live_lag_seconds": 0.2,
                                                       "cache": {"backend": "none"}}})
    with TestClient(create_app(tmp_path, config)) as client:
        wait_ready(client)
        with IndexWriter(tmp_path) as writer:
            seq = writer.upsert([Document("one", "first live text")], vectors=unit_vectors(1, 1))
        (_, path), = segments(tmp_path)
        _append_damaged_then_whole(path, seq + 1, [docs[0].id, docs[1].id])
        deadline = time.monotonic() + LOAD_TIMEOUT
        while client.get("/readyz").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = client.get("/readyz")
        assert refused.status_code == 503
        assert "write-ahead log" in refused.json()["error"]["message"]
        assert client.get("/healthz").status_code == 200  # alive: the last good state serves
        # The gauge says what /readyz says (it said ready: alerts on it missed the damage).
        ready = ("retrieval_ready_workers", ())
        while samples(client).get(ready) != 0.0:
            assert time.monotonic() < deadline, samples(client).get(ready)
            time.sleep(0.05)
        # An error body names files under the root as INDEX_ROOT, not where they lie.
        past = client.post("/v1/search", json={"query": "first live text", "min_seq": seq + 2})
        assert past.status_code == 503 and "INDEX_ROOT" in past.text
        assert str(tmp_path) not in past.text
    with TestClient(create_app(tmp_path, config)) as restarted:
        deadline = time.monotonic() + LOAD_TIMEOUT
        while "LogCorruptionError" not in restarted.get("/readyz").text:
            assert time.monotonic() < deadline, restarted.get("/readyz").text
            time.sleep(0.05)
        assert restarted.get("/readyz").status_code == 503


def test_a_batch_past_the_work_bounds_is_413_and_the_service_serves_on(index: Path) -> None:
    with TestClient(create_app(index, ServeConfig())) as client:
        wait_ready(client)
        heavy = client.post("/v1/search/batch", json={"queries": ["boundary layer"] * 64,
                                                      "k": 1000})
        assert heavy.status_code == 413
        error = heavy.json()["error"]
        assert error["type"] == "LimitExceededError" and "max_batch_hits" in error["message"]
        light = client.post("/v1/search/batch", json={"queries": ["boundary layer"] * 4,
                                                      "k": 5})
        assert light.status_code == 200 and len(light.json()["results"]) == 4


def test_a_worker_serves_the_last_good_build_and_recovers_when_current_is_fixed(
        tmp_path: Path, dataset: Any) -> None:
    """The live build fails verification at start: the worker serves the build live before it
    (/readyz says so), retries, and serves the live build once ``CURRENT`` names a good one;
    it never stays down until restarted."""
    from live_index import build_small, scifact_docs

    from indexes.manifest import read_manifest, resolve_build_dir

    docs = scifact_docs(dataset("scifact"), 60)
    build_small(tmp_path, docs[:30])
    good = read_manifest(resolve_build_dir(tmp_path)).build_id
    build_small(tmp_path, docs[:40])
    bad = resolve_build_dir(tmp_path)
    victim = bad / "vectors" / "vectors.npy"
    victim.write_bytes(victim.read_bytes()[:-4] + b"\0\0\0\1")
    config = ServeConfig.model_validate({"server": {"load_retry_seconds": 0.2},
                                         "retriever": {"cache": {"backend": "none"}}})
    with TestClient(create_app(tmp_path, config)) as client:
        wait_ready(client)
        ready = client.get("/readyz").json()
        assert good in str(ready) and "last good build" in str(ready), ready
        assert client.get("/v1/index").json()["build_id"] == good
        fixed = build_small(tmp_path, docs[:50])  # a new good build: CURRENT rewritten
        assert fixed is not None
        live = read_manifest(resolve_build_dir(tmp_path)).build_id
        deadline = time.monotonic() + LOAD_TIMEOUT
        while client.get("/v1/index").json()["build_id"] != live:
            assert time.monotonic() < deadline, client.get("/readyz").text
            time.sleep(0.05)
        assert "last good build" not in client.get("/readyz").text


def test_http_details_retry_after_allow_no_paths_and_the_open_bind_warning(
        index: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """503s say when to retry, a 405 names the allowed methods, /readyz (an open route) names
    no server path, and an open service bound beyond loopback is warned about at start."""
    import logging

    from retrieval.cli.serve import check_before_start

    release = threading.Event()

    def slow_loader() -> Retriever:
        release.wait(LOAD_TIMEOUT)
        return Retriever.load(index, RetrieverConfig())

    with TestClient(create_app(index, ServeConfig(), loader=slow_loader)) as client:
        loading = client.get("/readyz")
        assert loading.status_code == 503 and loading.headers["retry-after"] == "1"
        refused = client.post("/v1/search", json={"query": "boundary layer"})
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        release.set()
        wait_ready(client)
        wrong = client.get("/v1/search")
        assert wrong.status_code == 405 and "POST" in wrong.headers["allow"]
    (tmp_path / "CURRENT").write_text("no-such-build\n")
    with TestClient(create_app(tmp_path, ServeConfig())) as broken:
        deadline = time.monotonic() + LOAD_TIMEOUT
        while "could not be loaded" not in broken.get("/readyz").text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        message = broken.get("/readyz").json()["error"]["message"]
        assert "INDEX_ROOT" in message and str(tmp_path) not in message
    with caplog.at_level(logging.WARNING, logger="retrieval.cli.serve"):
        check_before_start(index, ServeConfig.model_validate({"server": {"host": "0.0.0.0",
                                                                         "port": 0}}))
    assert "without API keys" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="retrieval.cli.serve"):
        check_before_start(index, ServeConfig.model_validate({"server": {"port": 0}}))
    assert "without API keys" not in caplog.text


def test_searches_past_the_worker_s_in_flight_bound_are_shed_before_a_thread(
        index: Path, query_encoder: Any) -> None:
    """With server.max_in_flight = 1 and one search held inside the encoder, the next search
    is a 503 OverloadedError with Retry-After at once (the retriever's own bound, counted in
    the executor, never fired past the executor's 6 threads); once it ends, searches run.
    Document reads, writes and console searches take a thread too, and count the same
    (they bypassed the bound)."""
    from test_request_guarantees import GatedEncoder

    gated = GatedEncoder(query_encoder)
    config = ServeConfig.model_validate({"server": {"max_in_flight": 1, "open_writes": True},
                                         "retriever": {"cache": {"backend": "none"}}})
    app = create_app(index, config, loader=lambda: Retriever.load(
        index, RetrieverConfig(cache={"backend": "none"}), encoder=gated))
    with TestClient(app, base_url="http://127.0.0.1") as client:  # the console's host
        wait_ready(client)
        gated.close_gate()
        held: dict[str, Any] = {}
        first = threading.Thread(target=lambda: held.update(response=client.post(
            "/v1/search", json={"query": "boundary layer transition", "k": 3})))
        first.start()
        assert gated.entered.acquire(timeout=30)  # the first search is inside the encoder
        for path, body in [("/v1/search", {"query": "shock wave", "k": 3}),
                           ("/v1/documents/get", {"ids": ["1"]}),
                           ("/v1/documents/delete", {"ids": ["no-such-document"]}),
                           ("/v1/console/search", {"query": "shock wave", "k": 3})]:
            shed = client.post(path, json=body)
            assert shed.status_code == 503 and shed.headers["retry-after"] == "1", path
            assert shed.json()["error"]["type"] == "OverloadedError", path
        gated.gate.set()
        first.join(30)
        assert held["response"].status_code == 200
        assert client.post("/v1/search", json={"query": "shock wave", "k": 3}).status_code == 200


def test_only_an_absolute_index_root_is_written_index_root(tmp_path: Path, monkeypatch) -> None:
    """A relative root ("index") was replaced as a bare word: "the index's field is number"
    became "the INDEX_ROOT's field is number"."""
    from retrieval.service.state import ServiceState

    monkeypatch.chdir(tmp_path)
    state = ServiceState(Path("index"), RetrieverConfig())
    assert state.hide_root(f"{tmp_path}/index/wal: the index's field") == \
        "INDEX_ROOT/wal: the index's field"
