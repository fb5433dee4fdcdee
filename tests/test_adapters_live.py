"""The framework adapters over an index that takes live writes: read-your-writes (``min_seq``)
and ``deadline_ms`` per call and at construction, in process and over ``RemoteRetriever``; a
result's ``degraded`` and ``warnings`` reach the caller; the vector store's MMR stays right
while writes land between its search and its read of the stored vectors.

The retrievers here follow the log only when asked (``live_lag_seconds: None``), so a write is
unseen until a search names its seq: what an adapter without ``min_seq`` would miss is certain,
not a race.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from serving import free_port
from small_index import small_index

from indexes import Document
from retrieval import IndexWriter, InvalidQueryError, Retriever, SearchResult
from retrieval.client import RemoteRetriever
from retrieval.integrations.langchain import LangChainRetriever
from retrieval.integrations.langchain_store import RetrievalVectorStore
from retrieval.integrations.llamaindex import LlamaIndexRetriever
from retrieval.service.app import create_app
from retrieval.service.settings import ServeConfig

QUERY = "zebrafish telomerase hibernation"
UNSEEN = {"cache": {"backend": "memory"}, "live_lag_seconds": None}


@pytest.fixture(scope="module")
def cranfield(dataset, encoder) -> Path:
    return small_index(dataset("cranfield"), encoder)


@pytest.fixture
def root(tmp_path, cranfield) -> Path:
    """A copy of the small Cranfield index (real texts, titles, metadata and model): each
    test writes to its own."""
    copy = tmp_path / "idx"
    shutil.copytree(cranfield, copy)
    return copy


@pytest.fixture
def live(root, encoder) -> Iterator[tuple[Retriever, IndexWriter]]:
    with Retriever.load(root, UNSEEN, encoder=encoder) as retriever, \
            IndexWriter(root, encoder=encoder) as writer:
        yield retriever, writer


def needle(doc_id: str) -> Document:
    return Document(doc_id, f"{QUERY} in aeroelastic models", "A live write",
                    {"year": 2031, "department": "oncology"})


def only(doc_id: str) -> dict[str, str]:
    return {"id": doc_id}


def lc_ids(docs: list[Any]) -> list[str]:
    return [d.id for d in docs]


def li_ids(nodes: list[Any]) -> list[str]:
    return [n.node.node_id for n in nodes]


# -- read-your-writes ---------------------------------------------------------------------------


def test_langchain_reads_its_writes_per_call_and_at_construction(live):
    retriever, writer = live
    lc = LangChainRetriever(retriever, k=1)
    seq = writer.upsert([needle("new-1")])
    assert lc.invoke(QUERY, filters=only("new-1")) == []  # not yet served: the write is unseen
    assert lc_ids(lc.invoke(QUERY, filters=only("new-1"), min_seq=seq)) == ["new-1"]
    seq = writer.upsert([needle("new-2")])
    assert lc_ids(asyncio.run(lc.ainvoke(QUERY, filters=only("new-2"), min_seq=seq))) == [
        "new-2"]
    seq = writer.upsert([needle("new-3")])
    assert [lc_ids(docs) for docs in lc.batch([QUERY, QUERY], filters=only("new-3"),
                                              min_seq=seq)] == [["new-3"], ["new-3"]]
    seq = writer.upsert([needle("new-4")])
    assert [lc_ids(docs) for docs in asyncio.run(lc.abatch([QUERY], filters=only("new-4"),
                                                           min_seq=seq))] == [["new-4"]]
    seq = writer.delete(["new-1"])
    assert lc_ids(lc.invoke(QUERY, filters=only("new-1"))) == ["new-1"]  # still served
    after_delete = LangChainRetriever(retriever, k=1, filters=only("new-1"), min_seq=seq)
    assert after_delete.invoke(QUERY) == []


def test_llamaindex_reads_its_writes_per_call_and_at_construction(live):
    retriever, writer = live
    li = LlamaIndexRetriever(retriever, k=1, filters=only("new-1"))
    seq = writer.upsert([needle("new-1")])
    assert li.retrieve(QUERY) == []
    assert li_ids(li.retrieve(QUERY, min_seq=seq)) == ["new-1"]
    seq = writer.delete(["new-1"])
    assert li_ids(li.retrieve(QUERY)) == ["new-1"]
    assert li_ids(asyncio.run(li.aretrieve(QUERY, min_seq=seq))) == []
    seq = writer.upsert([needle("new-2")])
    configured = LlamaIndexRetriever(retriever, k=1, filters=only("new-2"), min_seq=seq)
    assert li_ids(configured.retrieve(QUERY)) == ["new-2"]
    # A call's options are that call's: the next call without them uses the configured ones.
    with pytest.raises(InvalidQueryError, match="min_seq"):
        li.retrieve(QUERY, min_seq=-1)
    assert li_ids(configured.retrieve(QUERY)) == ["new-2"]


def test_adapters_refuse_bad_read_options(live):
    retriever, _ = live
    for options in ({"min_seq": "latest"}, {"min_seq": -1}, {"deadline_ms": 0},
                    {"deadline_ms": float("nan")}, {"deadline_ms": True}):
        with pytest.raises(InvalidQueryError, match=next(iter(options))):
            LangChainRetriever(retriever, **options)
        with pytest.raises(InvalidQueryError, match=next(iter(options))):
            LlamaIndexRetriever(retriever, **options)
        with pytest.raises(InvalidQueryError, match=next(iter(options))):
            LangChainRetriever(retriever).invoke(QUERY, **options)


@pytest.fixture
def remote(root, encoder) -> Iterator[RemoteRetriever]:
    """The HTTP service over ``root`` taking writes, on a real port, and a client of it."""
    app = create_app(root, ServeConfig(server={"open_writes": True}), keys=None,
                     loader=lambda: Retriever.load(root, UNSEEN, encoder=encoder))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not (server.started and app.state.service.ready):
        assert time.monotonic() < deadline, "the service did not load the index"
        time.sleep(0.05)
    client = RemoteRetriever(f"http://127.0.0.1:{server.config.port}")
    yield client
    client.close()
    server.should_exit = True
    thread.join(timeout=30)


def test_adapters_over_remote_retriever_read_their_writes(remote):
    lc, li = LangChainRetriever(remote, k=1), LlamaIndexRetriever(remote, k=1)
    ack = remote.upsert([needle("remote-1")])
    assert lc.invoke(QUERY, filters=only("remote-1")) == []  # the service has not applied it
    assert lc_ids(lc.invoke(QUERY, filters=only("remote-1"), min_seq=ack.seq)) == ["remote-1"]
    ack = remote.delete(["remote-1"])
    assert lc_ids(lc.invoke(QUERY, filters=only("remote-1"))) == ["remote-1"]
    assert asyncio.run(lc.ainvoke(QUERY, filters=only("remote-1"), min_seq=ack.seq)) == []
    ack = remote.upsert([needle("remote-2")])
    scoped = LlamaIndexRetriever(remote, k=1, filters=only("remote-2"))
    assert li_ids(asyncio.run(scoped.aretrieve(QUERY, min_seq=ack.seq))) == ["remote-2"]
    assert li.retrieve(QUERY, deadline_ms=60_000)  # the client takes a deadline too


# -- deadlines, degraded results and warnings ---------------------------------------------------


class Recording:
    """A SearchBackend forwarding to the real Retriever, keeping each call's options and
    result; ``degrade`` marks the results as a missed deadline would."""

    def __init__(self, inner: Retriever, degrade: bool = False) -> None:
        self.inner, self.degrade = inner, degrade
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.results: list[SearchResult] = []

    def _kept(self, name: str, options: dict[str, Any], result: Any) -> Any:
        self.calls.append((name, options))
        results = result if isinstance(result, list) else [result]
        if self.degrade:
            results = [r.model_copy(update={"degraded": ["embed"]}) for r in results]
        self.results.extend(results)
        return results if isinstance(result, list) else results[0]

    def search(self, *args: Any, **options: Any) -> SearchResult:
        return self._kept("search", options, self.inner.search(*args, **options))

    def search_batch(self, *args: Any, **options: Any) -> list[SearchResult]:
        return self._kept("search_batch", options, self.inner.search_batch(*args, **options))

    async def asearch(self, *args: Any, **options: Any) -> SearchResult:
        return self._kept("asearch", options, await self.inner.asearch(*args, **options))

    async def asearch_batch(self, *args: Any, **options: Any) -> list[SearchResult]:
        return self._kept("asearch_batch", options,
                          await self.inner.asearch_batch(*args, **options))


def test_deadline_reaches_every_search_and_batch(live):
    retriever, _ = live
    backend = Recording(retriever)
    lc = LangChainRetriever(backend, k=2, deadline_ms=60_000)
    lc.invoke("flutter of panels")
    asyncio.run(lc.ainvoke("flutter of panels", deadline_ms=30_000))
    queries = ["flutter of panels", "heat transfer to a blunt body"]
    batched = lc.batch(queries)
    abatched = asyncio.run(lc.abatch(queries, deadline_ms=30_000))
    LlamaIndexRetriever(backend, k=2, deadline_ms=60_000).retrieve("flutter of panels")
    assert [(name, options.get("deadline_ms")) for name, options in backend.calls] == [
        ("search", 60_000), ("asearch", 30_000), ("search_batch", 60_000),
        ("asearch_batch", 30_000), ("search", 60_000)]
    expected = [lc_ids(lc.invoke(q)) for q in queries]
    assert [lc_ids(docs) for docs in batched] == [lc_ids(docs) for docs in abatched] == expected


class CountedEncoder:
    """The real query encoder, keeping how many texts each of its calls encoded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.calls: list[int] = []

    def encode(self, texts: Any, *, batch_size: int = 64, progress: bool = False) -> Any:
        self.calls.append(len(texts))
        return self.inner.encode(list(texts))


def test_a_batch_with_a_deadline_is_one_engine_batch(cranfield, encoder):
    """A deadline used to split a LangChain batch into one search per input (the engine's
    batch took none), each paying its own encoder call; now the whole batch is one
    ``search_batch`` under one budget: one encoder call for every input, sync and async.
    (Dynamic batching is off, so separate searches could not share an encoder call.)"""
    counted = CountedEncoder(encoder)
    config = {"cache": {"backend": "none"}, "batching": {"enabled": False}}
    queries = ["flutter of panels", "heat transfer to a blunt body",
               "buckling of thin cylindrical shells"]
    with Retriever.load(cranfield, config, encoder=counted) as retriever:
        lc = LangChainRetriever(retriever, k=2, deadline_ms=60_000)
        counted.calls.clear()  # the load's warm-up
        batched = lc.batch(queries)
        abatched = asyncio.run(lc.abatch(queries, deadline_ms=30_000))
        assert counted.calls == [3, 3]
        expected = [lc_ids(docs) for docs in LangChainRetriever(retriever, k=2).batch(queries)]
    assert [lc_ids(docs) for docs in batched] == [lc_ids(docs) for docs in abatched] == expected
    assert not any(d.metadata.get("degraded") for docs in batched + abatched for d in docs)


def test_a_degraded_result_says_so_in_every_document(live):
    retriever, _ = live
    backend = Recording(retriever, degrade=True)
    docs = LangChainRetriever(backend, k=3).invoke("flutter of panels")
    nodes = LlamaIndexRetriever(backend, k=3).retrieve("flutter of panels")
    assert len(docs) == len(nodes) == 3
    assert all(d.metadata["degraded"] == ["embed"] for d in docs)
    assert all(n.node.metadata["degraded"] == ["embed"] for n in nodes)
    assert "degraded" not in nodes[0].node.get_content(metadata_mode="llm")
    # A real deadline: the documents say what the engine's result said, whichever it was.
    real = Recording(retriever)
    docs = LangChainRetriever(real, k=3, deadline_ms=0.001).invoke("flutter of panels")
    assert [d.metadata.get("degraded") for d in docs] == [real.results[0].degraded or None] * 3
    # Undegraded, unwarned results carry neither key.
    assert not {"degraded", "warnings"} & set(LangChainRetriever(retriever, k=1).invoke(
        "flutter of panels")[0].metadata)


def test_filter_warnings_reach_documents_and_an_empty_result_logs_them(live, caplog):
    retriever, _ = live
    misspelt = {"$or": [{"department": "cardiolgy"}, {"year": {"gte": 1900}}]}
    expected = retriever.search("flutter of panels", misspelt, 2).warnings
    assert expected and "cardiology" in expected[0]
    docs = LangChainRetriever(retriever, k=2, filters=misspelt).invoke("flutter of panels")
    nodes = LlamaIndexRetriever(retriever, k=2, filters=misspelt).retrieve("flutter of panels")
    assert [d.metadata["warnings"] for d in docs] == [expected] * 2
    assert [n.node.metadata["warnings"] for n in nodes] == [expected] * 2
    assert "cardiolgy" not in nodes[0].node.get_content(metadata_mode="llm")
    with caplog.at_level(logging.WARNING, logger="retrieval.integrations"):
        assert LangChainRetriever(retriever).invoke("flutter", filters={
            "department": "cardiolgy"}) == []
    assert any("cardiolgy" in record.getMessage() for record in caplog.records)


# -- the vector store's MMR while writes land ---------------------------------------------------


@pytest.fixture
def store(root) -> Iterator[RetrievalVectorStore]:
    vector_store = RetrievalVectorStore(root, config=UNSEEN)
    yield vector_store
    vector_store.close()


MMR_QUERY = "flutter of panels in supersonic flow"


def write_after_searches(store: RetrievalVectorStore, monkeypatch, write) -> list[str]:
    """After each of the next searches of ``store`` has returned, apply ``write(top hit id)``
    before anything else reads the index (what a concurrent writer can do); the ids written."""
    retriever = store._retriever
    assert retriever is not None
    search, written = retriever.search, []

    def search_then_write(*args: Any, **kwargs: Any) -> SearchResult:
        result = search(*args, **kwargs)
        top = next((h.doc_id for h in result.hits if h.doc_id not in written), None)
        if top is not None and write(top, len(written)):
            written.append(top)
        return result

    monkeypatch.setattr(retriever, "search", search_then_write)
    return written


def test_mmr_skips_a_document_deleted_between_its_search_and_its_vectors(store, monkeypatch):
    written = write_after_searches(store, monkeypatch,
                                   lambda top, n: n == 0 and store.delete([top]))
    docs = store.max_marginal_relevance_search(MMR_QUERY, k=3, fetch_k=10)
    assert len(written) == 1 and len(docs) == 3
    assert written[0] not in lc_ids(docs)


def test_mmr_never_pairs_a_hit_with_another_version_of_it(store, monkeypatch):
    def rewrite(top: str, n: int) -> bool:
        if n:
            return False
        store.add_texts([f"rewritten: {MMR_QUERY}"], [{"year": 2031}], ids=[top])
        return True

    written = write_after_searches(store, monkeypatch, rewrite)
    docs = store.max_marginal_relevance_search(MMR_QUERY, k=3, fetch_k=10, lambda_mult=1.0)
    assert len(written) == 1
    for doc in docs:  # each document as the index now holds it
        assert doc.page_content == store.get_by_ids([doc.id])[0].page_content
    assert docs[0].id == written[0] and docs[0].page_content.startswith("rewritten")


def test_mmr_under_writes_after_every_search_leaves_out_what_is_gone(store, monkeypatch):
    written = write_after_searches(store, monkeypatch, lambda top, n: store.delete([top]))
    docs = store.max_marginal_relevance_search(MMR_QUERY, k=3, fetch_k=10)
    assert len(written) >= 2 and len(docs) == 3
    assert not set(written) & set(lc_ids(docs))
