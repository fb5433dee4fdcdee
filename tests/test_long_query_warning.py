"""A query longer than the query encoder's window (256 tokens for all-MiniLM-L6-v2, two of
them [CLS] and [SEP]) is embedded from its first tokens only: the words past them count for
BM25 alone. The result says so in its ``warnings``, however the search runs: alone, in a
batch, from the result or embedding cache, on an event loop, over HTTP. A query that fits, and
one whose vector the caller gives, gets no warning."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator

import httpx
import pytest
from serving import Serving, serve
from small_index import index_fixture, query_encoder_fixture  # noqa: F401 (fixtures)

from indexes.distilled_encoder import SHIPPED, DistilledEncoder
from retrieval import Retriever

LONG = "flow " * 300  # "flow" is one token: 300 tokens, 1,500 characters
CUT = "read 254 of the query's 300 tokens: the words past them count for BM25 only"
# 240 characters, 480 tokens: the tokenizer spells each Hangul syllable as up to 3 jamo, so a
# query's characters are no bound on its tokens.
KOREAN = "한국어 " * 60
SHORT = "boundary layer transition on a flat plate at supersonic speed"


def cut_warnings(result) -> list[str]:
    return [w for w in result.warnings if "query encoder" in w]


@pytest.fixture(scope="module")
def cached(index, query_encoder) -> Iterator[Retriever]:
    with Retriever.load(index, {"cache": {"backend": "memory"}, "live_lag_seconds": None},
                        encoder=query_encoder) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def uncached(index, query_encoder) -> Iterator[Retriever]:
    with Retriever.load(index, {"cache": {"backend": "none"}, "live_lag_seconds": None},
                        encoder=query_encoder) as loaded:
        yield loaded


def test_a_query_past_the_window_is_warned_and_one_within_it_is_not(uncached):
    (warning,) = cut_warnings(uncached.search(LONG, k=3))
    assert CUT in warning and "all-MiniLM-L6-v2" in warning
    assert uncached.search(SHORT, k=3).warnings == []
    assert uncached.search("flow " * 254, k=3).warnings == []  # 254 + [CLS] + [SEP]: fits
    assert "read 254 of the query's 255 tokens" in cut_warnings(
        uncached.search("flow " * 255, k=3))[0]


def test_a_query_of_few_characters_and_many_tokens_is_warned(uncached):
    assert len(KOREAN) < 256
    assert "read 254 of the query's 480 tokens" in cut_warnings(uncached.search(KOREAN, k=3))[0]


def test_a_batch_warns_the_long_query_only_unless_its_vector_is_given(uncached, cached,
                                                                       query_encoder):
    for retriever in (uncached, cached):
        first, second = retriever.search_batch([LONG, SHORT], k=4)
        assert CUT in cut_warnings(first)[0] and second.warnings == []
    vectors = query_encoder.encode([LONG, SHORT])
    given = uncached.search_batch([LONG, SHORT], k=3, query_vectors=vectors)
    assert [r.warnings for r in given] == [[], []]
    assert uncached.search(LONG, k=3, query_vector=vectors[0]).warnings == []


def test_a_cached_result_keeps_the_warning(cached):
    query = "heat transfer " + LONG  # a text no other test searches with this cache
    computed = cached.search(query, k=3)
    again = cached.search(query, k=3)
    assert again.cache.result == "hit"
    assert again.warnings == computed.warnings and len(cut_warnings(again)) == 1
    other_k = cached.search(query, k=5)  # the result misses, the embedding comes cached
    assert (other_k.cache.result, other_k.cache.embedding) == ("miss", "hit")
    assert len(cut_warnings(other_k)) == 1
    in_batch = cached.search_batch([query, SHORT], k=3)[0]  # from the result cache
    assert in_batch.cache.result == "hit" and len(cut_warnings(in_batch)) == 1


def test_a_search_on_an_event_loop_is_warned(cached):
    async def both() -> list:
        query = "shock wave " + LONG
        return [await cached.asearch(query, k=3), await cached.asearch(query, k=3),
                *(await cached.asearch_batch([query, SHORT], k=3))]

    first, hit, batched, short = asyncio.run(both())
    assert hit.cache.result == "hit"
    for result in (first, hit, batched):
        assert len(cut_warnings(result)) == 1
    assert short.warnings == []


def test_every_query_encoder_of_ours_has_the_window(query_encoder):
    from retrieval.query_encoder import query_window

    assert query_window(None) is None
    window = query_window(query_encoder)
    assert window is not None and window.window == 256
    distilled = query_window(DistilledEncoder.load(SHIPPED))  # it reads the same tokens
    assert distilled is not None and CUT in (distilled.warning(LONG) or "")
    assert distilled.warning(SHORT) is None


@pytest.fixture(scope="module")
def server(index, tmp_path_factory) -> Iterator[Serving]:
    base = tmp_path_factory.mktemp("long-queries")
    shutil.copytree(index, base / "index")  # a server of its own root touches nothing shared
    config = base / "serve.toml"
    config.write_text("[server]\nworkers = 1\ndrain_seconds = 0.1\n")
    running = serve(base / "index", config, base / "server.log", {})
    try:
        running.wait_until(lambda: httpx.get(f"{running.url}/readyz").status_code == 200,
                           300, "the server to be ready")
        yield running
    finally:
        running.stop()


def test_the_http_service_returns_the_warning(server):
    with server.client(None) as client:
        for _ in range(2):  # computed, then from the result cache
            body = client.post("/v1/search", json={"query": LONG, "k": 3}).json()
            assert any(CUT in w for w in body["warnings"]), body
        assert body["cache"]["result"] == "hit"
        batch = client.post("/v1/search/batch", json={"queries": [LONG, SHORT], "k": 3}).json()
        first, second = batch["results"]
        assert any(CUT in w for w in first["warnings"]) and second["warnings"] == []
