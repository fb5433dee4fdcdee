"""``retrieval serve`` as a real server process (2 workers) on a free 127.0.0.1 port, over TCP.

One server for the module, stopped by the last test (SIGTERM during load). It serves a copy of
the SciFact index in a temporary root, so publishing a build there touches nothing shared.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import Serving, dies_with_this_process, free_port, in_thread

from indexes.corpus import read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.publish import UnknownBuildError
from retrieval import (
    LimitExceededError,
    Retriever,
    RetrieverConfig,
    UnknownFieldError,
    UnknownNamedFilterError,
)
from retrieval.client import RemoteRetriever
from retrieval.console.sides import Sides
from retrieval.service import AuthenticationError
from retrieval.service.protocol import guarded_protocol
from retrieval.service.settings import ServerSettings

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key-0123456789"
CONFIG = """
[server]
workers = 2
api_keys_env = "SERVICE_TEST_KEYS"
drain_seconds = 1.5
grace_period_seconds = 20.0
max_batch_queries = 128
[retriever]
reload_interval_seconds = 0.25
[named_filters]
cardio = { department = "cardiology" }
"""
MAX_BODY = 65_536  # set through RETRIEVAL_SERVER__MAX_BODY_BYTES, so overrides are exercised


@dataclass
class Server(Serving):
    root: Path
    docs: list[Any]
    queries: list[str]

    def client(self, key: str | None = KEY) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with self.client() as client:
            text = client.get("/metrics").text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}



@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, dataset: Any, beir_index: Any,
           build_subset: Any) -> Iterator[Server]:
    _, queries, _ = beir_index("scifact")
    base = tmp_path_factory.mktemp("served")
    docs = list(with_demo_metadata(read_corpus(dataset("scifact"))))
    build_subset(docs, base / "index")
    (base / "serve.toml").write_text(CONFIG)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "SERVICE_TEST_KEYS": f"{KEY},second-key", "RETRIEVAL_SERVER__MAX_BODY_BYTES":
           str(MAX_BODY), "RETRIEVAL_SERVER__BODY_TIMEOUT_SECONDS": "5",
           "RETRIEVAL_SERVER__HEADER_TIMEOUT_SECONDS": "5",
           "PROMETHEUS_MULTIPROC_DIR": str(base / "metrics")}
    log = base / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "retrieval", "serve", str(base / "index"), "--config",
             str(base / "serve.toml"), "--port", str(port), "--log-level", "warning"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=dies_with_this_process)
    server = Server(f"http://127.0.0.1:{port}", process, log, base / "index", docs,
                    list(queries.values()))
    try:
        ready = ("retrieval_ready_workers", ())
        server.wait_until(lambda: server.metrics().get(ready) == 2.0, 300, "2 ready workers")
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# -- results ------------------------------------------------------------------------------


def test_http_results_equal_in_process_results_for_every_scifact_test_query(served: Server
                                                                            ) -> None:
    local = Retriever.load(served.root, RetrieverConfig())
    try:
        with served.client() as client:
            for start in range(0, len(served.queries), 100):
                chunk = served.queries[start:start + 100]
                response = client.post("/v1/search/batch", json={"queries": chunk, "k": 10})
                assert response.status_code == 200, response.text
                remote = response.json()["results"]
                expected = local.search_batch(chunk, k=10)
                for got, want in zip(remote, expected, strict=True):
                    assert got["build_id"] == want.build_id
                    assert [h["doc_id"] for h in got["hits"]] == [h.doc_id for h in want.hits]
                    assert [h["score"] for h in got["hits"]] == pytest.approx(
                        [h.score for h in want.hits], rel=1e-6, abs=1e-7)
        with RemoteRetriever(served.url, api_key=KEY) as remote_retriever:
            # A query of no batch: INT8 query vectors depend on the batch they were encoded
            # in, and either worker may hold the batch's embedding in its cache.
            query = "do statins lower the risk of heart attacks in older patients"
            one = remote_retriever.search(query, filters="year >= 2000", k=5)
            want_one = local.search(query, filters="year >= 2000", k=5)
            assert [h.doc_id for h in one.hits] == [h.doc_id for h in want_one.hits]
            assert one.hits[0].bm25_score == pytest.approx(want_one.hits[0].bm25_score)
    finally:
        local.close()


def test_remote_retriever_async_and_typed_errors(served: Server) -> None:
    async def run() -> None:
        async with RemoteRetriever(served.url, api_key=KEY) as remote:
            single = await remote.asearch(served.queries[1], k=3)
            batch = await remote.asearch_batch(served.queries[:4], {"year": {"gte": 1990}}, 2)
            assert len(single.hits) == 3 and [len(r.hits) for r in batch] == [2] * 4
            with pytest.raises(UnknownFieldError, match="colour"):
                await remote.asearch("x", filters={"colour": "red"})
            # A filter registered by name in the service config, ANDed with inline clauses.
            recent = {"year": {"gte": 2010}}
            named = await remote.asearch(served.queries[1], {"$named": "cardio", **recent})
            inline = await remote.asearch(served.queries[1],
                                          {"department": "cardiology", **recent})
            assert named.hits and [h.doc_id for h in named.hits] == \
                [h.doc_id for h in inline.hits]
            assert all(h.metadata["year"] >= 2010 for h in named.hits)
            with pytest.raises(UnknownNamedFilterError, match="nobody"):
                await remote.asearch("x", filters={"$named": "nobody"})

    asyncio.run(run())
    with RemoteRetriever(served.url, api_key=KEY) as remote:
        # One client, several event loops (each asyncio.run its own): the second loop's call
        # raised "Event loop is closed" from a pool of the first.
        for query in served.queries[:2]:
            assert asyncio.run(remote.asearch(query, k=2)).hits
        with pytest.raises(LimitExceededError, match="max_k"):
            remote.search("statins", k=10**6)
        assert remote.index_info()["documents"] == len(served.docs)
        # A generous deadline is carried to the server and does not degrade the search.
        timely = remote.search(served.queries[1], k=3, deadline_ms=60_000)
        assert timely.degraded == [] and [h.doc_id for h in timely.hits] == \
            [h.doc_id for h in remote.search(served.queries[1], k=3).hits]
        batch = served.queries[20:22]  # the same batch each time: INT8 vectors depend on it
        timely_batch = remote.search_batch(batch, k=3, deadline_ms=60_000)
        assert [r.degraded for r in timely_batch] == [[], []]
        assert [[h.doc_id for h in r.hits] for r in timely_batch] == \
            [[h.doc_id for h in r.hits] for r in asyncio.run(
                remote.asearch_batch(batch, k=3, deadline_ms=60_000))] == \
            [[h.doc_id for h in r.hits] for r in remote.search_batch(batch, k=3)]
    with RemoteRetriever(served.url, api_key="wrong") as remote, \
            pytest.raises(AuthenticationError):
        remote.search("statins")


def test_open_operator_routes_and_openapi(served: Server) -> None:
    with served.client(key=None) as anonymous, served.client() as client:
        assert anonymous.get("/healthz").json() == {"status": "alive"}
        ready = anonymous.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert anonymous.get("/metrics").status_code == 401  # metrics_auth defaults on
        info = client.get("/v1/index").json()
        assert info["documents"] == len(served.docs)
        assert {"department", "doc_type", "year"} <= set(info["metadata_fields"])
        schema = client.get("/openapi.json").json()
        assert {"/v1/search", "/v1/search/batch", "/v1/index"} <= set(schema["paths"])
        assert {"SearchResult", "Hit", "SearchBody"} <= set(schema["components"]["schemas"])


# -- hostile input ----------------------------------------------------------------------------


def test_a_filter_value_no_document_holds_is_warned_about_over_http(served: Server) -> None:
    with served.client() as client:
        body = client.post("/v1/search", json={"query": "cells", "k": 3,
                                               "filters": {"department": "oncolgy"}}).json()
    assert body["hits"] == [] and body["warnings"] == [
        "no document has department = 'oncolgy'; did you mean 'oncology'?"]


def test_explain_over_http_and_the_remote_client(served: Server) -> None:
    with served.client() as client:
        body = client.post("/v1/search", json={"query": "cells", "k": 3,
                                               "explain": True}).json()
    why = body["hits"][0]["explanation"]
    assert why["bm25_terms"] and why["fusion"] == "zscore" and why["bm25_rank"] >= 1
    with RemoteRetriever(served.url, KEY) as remote:
        hits = remote.search("cells", k=2, explain=True).hits
        assert all(h.explanation is not None for h in hits)
        assert all(h.explanation is None for h in remote.search("cells", k=2).hits)


def test_min_score_over_http_and_the_remote_client(served: Server) -> None:
    with served.client() as client:
        every = client.post("/v1/search", json={"query": "cells", "k": 5}).json()["hits"]
        assert all(0 < hit["relevance"] < 1 for hit in every)
        threshold = sorted(hit["relevance"] for hit in every)[2]
        kept = client.post("/v1/search", json={"query": "cells", "k": 5,
                                               "min_score": threshold}).json()["hits"]
        assert [h["doc_id"] for h in kept] == \
            [h["doc_id"] for h in every if h["relevance"] >= threshold]
        batch = client.post("/v1/search/batch", json={"queries": ["cells"], "k": 5,
                                                      "min_score": threshold}).json()
        assert batch["results"][0]["hits"] == kept
        bad = client.post("/v1/search", json={"query": "cells", "min_score": 1.5})
        assert bad.status_code == 400 and "min_score" in bad.json()["error"]["message"]
    with RemoteRetriever(served.url, KEY) as remote:
        assert [h.doc_id for h in remote.search("cells", k=5, min_score=threshold).hits] == \
            [h["doc_id"] for h in kept]
        assert remote.search_batch(["cells"], k=5, min_score=1.0)[0].hits == []


def nested_filter(depth: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"year": {"gte": 2000}}
    for _ in range(depth):
        spec = {"$and": [spec]}
    return spec


JSON = {"content-type": "application/json"}
HOSTILE = [
    # (name, method, path, request options, auth, status, error type)
    ("bad JSON", "POST", "/v1/search", {"content": b'{"query": ', "headers": JSON}, True,
     400, "MalformedRequestError"),
    ("not JSON content type", "POST", "/v1/search",
     {"content": b'{"query": "x"}', "headers": {"content-type": "text/plain"}}, True, 400,
     "MalformedRequestError"),
    ("empty body", "POST", "/v1/search", {"headers": JSON}, True, 400,
     "MalformedRequestError"),
    # A compressed body was read as it came: refused as "not valid JSON", or served when the
    # bytes happened to be JSON under another label.
    ("compressed body", "POST", "/v1/search",
     {"content": b'{"query": "x"}', "headers": JSON | {"content-encoding": "gzip"}}, True,
     400, "MalformedRequestError"),
    ("JSON array body", "POST", "/v1/search", {"json": ["x"]}, True, 422, "RequestFieldError"),
    ("huge body", "POST", "/v1/search", {"json": {"query": "x" * (MAX_BODY + 1)}}, True, 413,
     "PayloadTooLargeError"),
    ("huge k", "POST", "/v1/search", {"json": {"query": "x", "k": 10**12}}, True, 413,
     "LimitExceededError"),
    ("k zero", "POST", "/v1/search", {"json": {"query": "x", "k": 0}}, True, 400,
     "InvalidQueryError"),
    ("k as string", "POST", "/v1/search", {"json": {"query": "x", "k": "5"}}, True, 422,
     "RequestFieldError"),
    ("query as number", "POST", "/v1/search", {"json": {"query": 5}}, True, 422,
     "RequestFieldError"),
    ("missing query", "POST", "/v1/search", {"json": {"k": 5}}, True, 422, "RequestFieldError"),
    ("unknown field", "POST", "/v1/search", {"json": {"query": "x", "topk": 5}}, True, 422,
     "RequestFieldError"),
    ("blank query", "POST", "/v1/search", {"json": {"query": "   "}}, True, 400,
     "InvalidQueryError"),
    ("query over the length limit", "POST", "/v1/search", {"json": {"query": "x" * 5000}},
     True, 413, "LimitExceededError"),
    ("lone surrogate", "POST", "/v1/search",
     {"content": b'{"query": "a\\ud800b"}', "headers": JSON}, True, 400,
     "MalformedRequestError"),
    ("filter nested past the limit", "POST", "/v1/search",
     {"json": {"query": "x", "filters": nested_filter(40)}}, True, 413,
     "LimitExceededError"),
    ("JSON nested past the parser's limit", "POST", "/v1/search",
     {"json": {"query": "x", "filters": nested_filter(400)}}, True, 400,
     "MalformedRequestError"),
    ("filter on unknown field", "POST", "/v1/search",
     {"json": {"query": "x", "filters": {"colour": "red"}}}, True, 400, "UnknownFieldError"),
    ("filter value of wrong type", "POST", "/v1/search",
     {"json": {"query": "x", "filters": {"year": {"gte": "recent"}}}}, True, 400,
     "FilterTypeError"),
    ("deadline not positive", "POST", "/v1/search",
     {"json": {"query": "x", "deadline_ms": -1}}, True, 400, "InvalidQueryError"),
    ("deadline of wrong type", "POST", "/v1/search",
     {"json": {"query": "x", "deadline_ms": "soon"}}, True, 422, "RequestFieldError"),
    ("batch deadline not positive", "POST", "/v1/search/batch",
     {"json": {"queries": ["x"], "deadline_ms": 0}}, True, 400, "InvalidQueryError"),
    ("batch deadline of wrong type", "POST", "/v1/search/batch",
     {"json": {"queries": ["x"], "deadline_ms": "soon"}}, True, 422, "RequestFieldError"),
    ("batch deadline over a day", "POST", "/v1/search/batch",
     {"json": {"queries": ["x"], "deadline_ms": 1e12}}, True, 413, "LimitExceededError"),
    ("DSL syntax error", "POST", "/v1/search",
     {"json": {"query": "x", "filters": "year >> 3"}}, True, 400, "MalformedFilterError"),
    ("batch over the query limit", "POST", "/v1/search/batch",
     {"json": {"queries": ["x"] * 129}}, True, 413, "LimitExceededError"),
    ("batch queries not a list", "POST", "/v1/search/batch", {"json": {"queries": "x"}}, True,
     422, "RequestFieldError"),
    ("missing API key", "POST", "/v1/search", {"json": {"query": "x"}}, None, 401,
     "AuthenticationError"),
    ("wrong API key", "POST", "/v1/search", {"json": {"query": "x"}}, "wrong", 401,
     "AuthenticationError"),
    ("key in another scheme", "GET", "/v1/index", {"headers": {"authorization": f"Basic {KEY}"}},
     None, 401, "AuthenticationError"),
    ("unknown route", "GET", "/v2/everything", {}, True, 404, "NotFoundError"),
    ("trailing slash", "POST", "/v1/search/", {"json": {"query": "x"}}, True, 404,
     "NotFoundError"),
    ("wrong method", "GET", "/v1/search", {}, True, 405, "NotFoundError"),
]


@pytest.mark.parametrize(("name", "method", "path", "options", "auth", "status", "kind"),
                         HOSTILE, ids=[case[0] for case in HOSTILE])
def test_hostile_requests_get_a_typed_4xx(served: Server, name: str, method: str, path: str,
                                          options: dict[str, Any], auth: Any, status: int,
                                          kind: str) -> None:
    with served.client(key=KEY if auth is True else auth) as client:
        response = client.request(method, path, **options)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind and error["message"]
    assert "Traceback" not in response.text


def test_a_batch_past_its_deadline_degrades_over_http(served: Server) -> None:
    """The batch body's deadline is one budget for the batch: its first query searches
    while the batch's encoder call runs, and cannot wait past a microsecond for it. An encoder
    that finished while the first query's BM25 ran gives its vector at no wait (a loaded
    host), so up to 5 batches are sent, and one must have degraded."""
    firsts = []
    with served.client() as client:
        for attempt in range(5):
            late = {"queries": [f"a batch with no time to embed {attempt}",
                                f"nor for its second query {attempt}"], "deadline_ms": 0.001}
            response = client.post("/v1/search/batch", json=late)
            assert response.status_code == 200, response.text
            firsts.append(response.json()["results"][0])
            if firsts[-1]["degraded"]:
                break
    first = firsts[-1]
    assert first["degraded"] == ["embed"] and first["hits"]
    assert all(h["vector_score"] == 0.0 for h in first["hits"])


# -- metrics --------------------------------------------------------------------------------


def test_a_body_shorter_than_its_content_length_gets_408_not_a_hung_worker(served: Server
                                                                          ) -> None:
    """A client that promises 100 bytes and sends 9: the server answers 408 after
    server.body_timeout_seconds (5 s here: the load tests of this module must not hit it)
    instead of waiting forever, and serves on."""
    head = (f"POST /v1/search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
    # Read until the server closes: one recv may hand back the head without the body.
    answer, waited = _exchange(served, head.encode() + b'{"query":')
    assert answer.startswith("HTTP/1.1 408"), answer[:200]
    assert "RequestTimeoutError" in answer and waited < 14
    with served.client() as client:
        assert client.post("/v1/search", json={"query": "statins", "k": 1}).status_code == 200


def _exchange(served: Server, data: bytes, timeout: float = 20) -> tuple[str, float]:
    """Send ``data`` on a fresh connection; (everything answered until it closed, seconds)."""
    with _connect(served, timeout) as sock:
        started = time.monotonic()
        if data:
            sock.sendall(data)
        return _until_closed(sock), time.monotonic() - started


def _connect(served: Server, timeout: float = 20) -> socket.socket:
    host, port = served.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def _until_closed(sock: socket.socket) -> str:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks).decode("latin-1")


def _statuses(answer: str) -> list[int]:
    """The statuses of the responses one after another in ``answer`` (each has a length)."""
    statuses = []
    while answer:
        head, _, rest = answer.partition("\r\n\r\n")
        statuses.append(int(head.split(" ", 2)[1]))
        lengths = [int(line.split(":")[1]) for line in head.lower().split("\r\n")
                   if line.startswith("content-length:")]
        answer = rest[sum(lengths):]
    return statuses


def _requests_total(served: Server, method: str, route: str, status: int) -> float:
    key = ("retrieval_http_requests_total",
           (("method", method), ("route", route), ("status", str(status))))
    return served.metrics().get(key, 0.0)


@pytest.mark.parametrize("name,extra", [
    ("a 1 MB header", "X-Big: " + "a" * 1_000_000 + "\r\n"),
    ("10,000 headers", "".join(f"X-H{i}: {i}\r\n" for i in range(10_000))),
])
def test_an_oversized_request_head_gets_431_and_the_connection_closes(served: Server, name: str,
                                                                       extra: str) -> None:
    head = f"GET /healthz HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()
    answer, _ = _exchange(served, head)
    assert answer.startswith("HTTP/1.1 431"), (name, answer[:200])
    assert "HeaderTooLargeError" in answer and "server.max_header" in answer
    with served.client() as client:
        assert client.get("/healthz").status_code == 200


def test_a_head_not_sent_in_time_gets_408_and_frees_the_connection(served: Server) -> None:
    """server.header_timeout_seconds (5 s here): a half-sent head, and a connection that sends
    nothing, are answered 408 and closed instead of holding a descriptor forever."""
    before = _requests_total(served, "other", "other", 408)
    for data in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ", b""):
        answer, waited = _exchange(served, data)
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        assert "server.header_timeout_seconds" in answer and 4.5 < waited < 20
    with served.client() as client:
        assert client.get("/healthz").status_code == 200
    # Answered below the app, they were in no count.
    assert _requests_total(served, "other", "other", 408) - before == 2


def test_a_url_past_the_head_limit_gets_431_without_any_header(served: Server) -> None:
    """The URL's bytes were counted only once a header came: a 20 KB URL alone was served."""
    answer, _ = _exchange(served, b"GET /healthz?" + b"a" * 20_000 + b" HTTP/1.0\r\n\r\n")
    assert answer.startswith("HTTP/1.1 431"), answer[:200]


def test_a_header_streamed_past_the_limit_is_refused_before_it_ends(served: Server) -> None:
    """A header value is joined piece by piece before any header callback sees it (64 MiB of
    it took 20 s of the worker's loop): its bytes are now counted as they are read, and a
    head that has not ended past the limit gets 431, not 408 once its time is up."""
    with _connect(served) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            for _ in range(8):
                time.sleep(0.05)  # pieces, as a slow client sends them
                sock.sendall(b"a" * 32_768)
        except OSError:  # refused and closed before the last piece
            pass
        answer = _until_closed(sock)
    assert answer.startswith("HTTP/1.1 431"), answer[:200]
    assert "HeaderTooLargeError" in answer


def test_a_pipelined_request_is_answered_before_the_oversized_head_behind_it(served: Server
                                                                            ) -> None:
    """A search and, on the same connection right behind it, a head with too many headers:
    the 431 was written at once, so the client read it as the search's answer and the
    search's own response (an upsert's, as well: a write done) was lost."""
    batch = json.dumps({"queries": served.queries[:100], "k": 10}).encode()
    search = (f"POST /v1/search/batch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(batch)}\r\n\r\n"
              ).encode() + batch
    too_many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n"
    before = _requests_total(served, "other", "other", 431)
    answer, _ = _exchange(served, search + search + too_many)
    assert _statuses(answer) == [200, 200, 431], answer[:300]
    assert _requests_total(served, "other", "other", 431) - before == 1


def test_a_body_cut_short_by_its_client_is_not_run(served: Server) -> None:
    """The connection closed 100 bytes short of the Content-Length: the disconnect was taken
    for the body's end and the request ran on what had come, which parsed (an upsert's first
    documents were written). It is recorded as 499, and nothing runs. (A document read, not
    a search: a search notices its client gone and is abandoned, 499 either way.)"""
    route = "/v1/documents/get"
    body = b'{"ids": ["a document id"]}'
    head = (f"POST {route} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) + 100}\r\n\r\n")
    before = {status: _requests_total(served, "POST", route, status) for status in (200, 499)}
    with _connect(served) as sock:
        sock.sendall(head.encode() + body)
    served.wait_until(lambda: _requests_total(served, "POST", route, 499) - before[499] == 1
                      or _requests_total(served, "POST", route, 200) > before[200], 20,
                      "the request cut short to be counted")
    assert _requests_total(served, "POST", route, 200) == before[200]
    assert _requests_total(served, "POST", route, 499) - before[499] == 1


def test_a_build_id_longer_than_a_file_name_is_an_unknown_build(served: Server) -> None:
    """The console's sides looked for builds/<id>: past 255 bytes that raised OSError (File
    name too long), a 500 where any other unknown build is a 404."""
    sides = Sides(served.root)
    for build_id in ("b" * 256, "\u00e9" * 200):  # 256 characters; 400 bytes
        with pytest.raises(UnknownBuildError, match="no build"):
            sides.build_path(build_id)


@pytest.fixture(scope="module")
def slow_app() -> Iterator[tuple[str, int]]:
    """uvicorn with the service's protocol (a 1 s head timeout) over an app that answers each
    request 2 s after it came."""
    import uvicorn

    async def answer_late(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(2.0)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"late"})

    address = ("127.0.0.1", free_port())
    protocol = guarded_protocol(ServerSettings(header_timeout_seconds=1.0))
    server = uvicorn.Server(uvicorn.Config(answer_late, host=address[0], port=address[1],
                                           http=protocol, lifespan="off", log_level="warning"))
    with in_thread(server):
        yield address


def test_a_head_begun_while_a_request_runs_still_gets_its_timeout(slow_app: tuple[str, int]
                                                                  ) -> None:
    """The next request's head timer fired while the request before was still running, found
    a request being answered, and was never armed again: once that was answered, one more
    byte (which stops uvicorn's keep-alive timer) held the half-sent head open for good."""
    with socket.create_connection(slow_app, timeout=10) as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nG")
        answer = b""
        while b"late" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        sock.sendall(b"E")
        # The old protocol never answers: the read times out (TimeoutError) here.
        answer += _until_closed(sock).encode("latin-1")
    assert _statuses(answer.decode("latin-1")) == [200, 408], answer


def test_metrics_parse_and_count_the_requests_sent(served: Server) -> None:
    def requests(metrics: dict[Any, float], route: str, status: str) -> float:
        key = ("retrieval_http_requests_total",
               (("method", "POST"), ("route", route), ("status", status)))
        return metrics.get(key, 0.0)

    def lookups(metrics: dict[Any, float]) -> float:
        return sum(v for (name, labels), v in metrics.items()
                   if name == "retrieval_cache_lookups_total" and ("cache", "result") in labels)

    before = served.metrics()
    with served.client() as client:
        for query in served.queries[:7]:
            assert client.post("/v1/search", json={"query": query}).status_code == 200
        for start in (10, 13, 16):
            batch = {"queries": served.queries[start:start + 3]}
            assert client.post("/v1/search/batch", json=batch).status_code == 200
        for _ in range(2):
            assert client.post("/v1/search", json={"k": 1}).status_code == 422
        # An encoder that finishes while BM25 runs gives its vector at no wait, deadline or
        # not (seen once on a loaded host): of 5 searches, those past it count.
        late = [client.post("/v1/search", json={"query": f"no time to embed {i}",
                                                "deadline_ms": 0.001}).json()["degraded"]
                for i in range(5)]
        degraded = late.count(["embed"])
        assert degraded >= 1 and late.count([]) == 5 - degraded, late
    after = served.metrics()
    assert after.get(("retrieval_search_degraded_total", (("reason", "embed"),)), 0.0) \
        - before.get(("retrieval_search_degraded_total", (("reason", "embed"),)), 0.0) \
        == degraded
    assert requests(after, "/v1/search", "200") - requests(before, "/v1/search", "200") == 12
    assert requests(after, "/v1/search", "422") - requests(before, "/v1/search", "422") == 2
    assert (requests(after, "/v1/search/batch", "200")
            - requests(before, "/v1/search/batch", "200")) == 3
    assert lookups(after) - lookups(before) == 12 + 9
    stages = {dict(labels)["stage"] for (name, labels) in after
              if name == "retrieval_search_stage_duration_seconds_count"}
    assert {"total", "bm25", "rerank", "hydrate"} <= stages
    buckets = {dict(labels)["le"] for (name, labels) in after
               if name == "retrieval_search_stage_duration_seconds_bucket"}
    assert "0.0001" in buckets or "1e-04" in buckets
    with served.client() as client:
        build_id = client.get("/v1/index").json()["build_id"]
    assert after[("retrieval_build_info", (("build_id", build_id),))] == 1.0


# -- overload ---------------------------------------------------------------------------------


def test_256_connections_are_shed_within_the_bound_and_health_stays_responsive(served: Server
                                                                              ) -> None:
    """256 connections (wrk: a C load generator, so the client's own queueing stays out) in a
    closed loop of full misses (distinct query texts) against 2 workers admitting 32 searches
    each (the default on 2 cores): every answer is 200 or a shed 503 with Retry-After and
    OverloadedError, both occur, no socket error, and /healthz answers every probe meanwhile.
    The p99s are printed (benchmarks/overload.py measures them)."""
    from benchmarks.overload import probes, wrk_statuses

    stop = threading.Event()
    found: dict[str, list[float]] = {}
    prober = threading.Thread(target=lambda: found.update(probes(served.url, served.queries,
                                                                 stop, KEY)))
    prober.start()
    try:
        load = wrk_statuses(served.url, served.queries, 256, 4.0, KEY)
    finally:
        stop.set()
        prober.join()
    assert (load["other"], load["errors"]) == (0, 0), load
    assert load["ok"] > 0 and load["shed"] > 0, load
    assert found["healthz"], "no /healthz probe answered"
    answers = load["ok"] + load["shed"]
    admitted = found["admitted"] or [float("nan")]
    print(f"256 connections: {answers} answers, shed {load['shed'] / answers:.0%}, admitted "
          f"probe p99 {np.percentile(admitted, 99):.0f} ms, /healthz p99 "
          f"{np.percentile(found['healthz'], 99):.0f} ms")


# -- load: a publish, then SIGTERM ------------------------------------------------------------


@dataclass
class Outcome:
    started: float
    ended: float
    status: int | str
    build_id: str | None


def run_load(server: Server, connections: int, stop: threading.Event,
             outcomes: list[Outcome]) -> None:
    """Closed loop: each connection sends its next search when the previous one returns,
    appending each answer to ``outcomes`` as it comes; a connection stops at its first
    transport error (the server closed) or at ``stop``."""

    async def connection(client: httpx.AsyncClient, offset: int) -> None:
        i = offset
        while not stop.is_set():
            started = time.monotonic()
            try:
                response = await client.post("/v1/search", json={
                    "query": server.queries[i % len(server.queries)], "k": 5})
            except httpx.TransportError as exc:
                outcomes.append(Outcome(started, time.monotonic(), type(exc).__name__, None))
                return
            body = response.json()
            outcomes.append(Outcome(started, time.monotonic(), response.status_code,
                                    body.get("build_id")))
            i += connections

    async def main() -> None:
        limits = httpx.Limits(max_connections=connections)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60,
                                     headers={"authorization": f"Bearer {KEY}"}) as client:
            await asyncio.gather(*(connection(client, n) for n in range(connections)))

    asyncio.run(main())


def in_background(server: Server, stop: threading.Event
                  ) -> tuple[threading.Thread, list[Outcome]]:
    """``run_load`` with 16 connections in a thread; its outcomes fill the list as they come
    (a test waiting for the new build's answers sees them, not only once the load stops)."""
    outcomes: list[Outcome] = []
    thread = threading.Thread(target=run_load, args=(server, 16, stop, outcomes))
    thread.start()
    return thread, outcomes


def test_build_published_under_load_serves_on_without_errors(served: Server,
                                                             build_subset: Any) -> None:
    with served.client() as client:
        old = client.get("/v1/index").json()["build_id"]
    stop = threading.Event()
    thread, outcomes = in_background(served, stop)
    try:
        time.sleep(1.0)
        new = build_subset(served.docs[:-25], served.root).build_id  # publishes atomically
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                len(outcomes) > 64 and all(o.build_id == new for o in outcomes[-64:])):
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert new != old
    assert [o for o in outcomes if o.status != 200] == []
    assert {o.build_id for o in outcomes} == {old, new}
    assert all(o.build_id == new for o in outcomes[-64:])
    with served.client() as client:  # both workers moved (each answers some of these)
        assert {client.get("/v1/index").json()["build_id"] for _ in range(8)} == {new}
    reloads = served.metrics().get(("retrieval_reloads_total", (("outcome", "loaded"),)))
    assert reloads is not None and reloads >= 1


def test_sigterm_under_load_finishes_every_accepted_request(served: Server) -> None:
    stop = threading.Event()
    thread, outcomes = in_background(served, stop)
    time.sleep(1.5)
    signalled = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    saw_draining = False
    with served.client(key=None) as anonymous:
        while time.monotonic() - signalled < 1.5 and not saw_draining:
            saw_draining = anonymous.get("/readyz").status_code == 503
            time.sleep(0.05)
    try:
        code = served.process.wait(timeout=25)  # grace period 20 s
    finally:
        stop.set()
        thread.join(timeout=60)
    accepted = [o for o in outcomes if o.started < signalled]
    assert len(accepted) >= 16
    unanswered = [o for o in accepted if o.status != 200]
    assert unanswered == [], served.failure(f"SIGTERM at {signalled:.3f}; unanswered {unanswered}")
    assert saw_draining, "readiness never turned 503 while draining"
    assert code == 0, served.failure(f"exit code {code}")
