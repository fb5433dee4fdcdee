"""Adapters over a backend written to an older search protocol (no ``deadline_ms``): it works
as long as no deadline is asked of it, and a deadline asked of it is refused with a typed error
naming the backend, before the backend is called, never dropped and never a bare TypeError
from inside the backend's call.

The backend is a small in-memory search over four documents: the adapters' own behaviour is
the subject, not the engine's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from retrieval import SearchResult
from retrieval.integrations import NotASearchBackendError
from retrieval.models import Hit

langchain = pytest.importorskip("retrieval.integrations.langchain",
                                reason="needs the langchain extra", exc_type=ImportError)
llamaindex = pytest.importorskip("retrieval.integrations.llamaindex",
                                 reason="needs the llamaindex extra", exc_type=ImportError)

DOCUMENTS = {"d1": "wing flutter at transonic speed", "d2": "boundary layer transition",
             "d3": "flutter of thin panels", "d4": "heat transfer in hypersonic flow"}
REFUSED = r"^(Old|Options)Backend\.(a?search|a?search_batch) takes no deadline_ms keyword"


class OldBackend:
    """The search methods as they were before ``deadline_ms``: keyword options ``candidates``
    and ``min_seq`` only. Hits: the documents sharing a word with the query, most shared
    words first."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def search(self, query: str, filters: Any = None, k: int | None = None, *,
               candidates: int | None = None, min_seq: int | None = None) -> SearchResult:
        self.calls.append("search")
        return found(query, k)

    def search_batch(self, queries: Sequence[str], filters: Any = None, k: int | None = None,
                     *, candidates: int | None = None, min_seq: int | None = None
                     ) -> list[SearchResult]:
        self.calls.append("search_batch")
        return [found(query, k) for query in queries]

    async def asearch(self, query: str, filters: Any = None, k: int | None = None, *,
                      candidates: int | None = None, min_seq: int | None = None
                      ) -> SearchResult:
        self.calls.append("asearch")
        return found(query, k)

    async def asearch_batch(self, queries: Sequence[str], filters: Any = None,
                            k: int | None = None, *, candidates: int | None = None,
                            min_seq: int | None = None) -> list[SearchResult]:
        self.calls.append("asearch_batch")
        return [found(query, k) for query in queries]


class OptionsBackend(OldBackend):
    """A newer backend's ``search``: it takes any keyword option, and records them (its
    other methods are still the old ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.options: list[dict[str, Any]] = []

    def search(self, query: str, filters: Any = None, k: int | None = None,  # type: ignore[override]
               **options: Any) -> SearchResult:
        self.options.append(options)
        return found(query, k)


def found(query: str, k: int | None) -> SearchResult:
    words = set(query.split())
    shared = {doc_id: len(words & set(text.split())) for doc_id, text in DOCUMENTS.items()}
    ranked = sorted((d for d in shared if shared[d]), key=lambda d: (-shared[d], d))
    hits = [Hit(doc_id=d, score=float(shared[d]), bm25_score=float(shared[d]),
                vector_score=0.0, text=DOCUMENTS[d]) for d in ranked[:k or 10]]
    return SearchResult(query=query, hits=hits, timings={"total": 0.0}, build_id="old")


def test_langchain_over_an_old_backend_searches_without_a_deadline():
    backend = OldBackend()
    retriever = langchain.LangChainRetriever(backend, k=2, min_seq=3)
    assert [d.id for d in retriever.invoke("flutter of wing")] == ["d1", "d3"]
    assert [d.id for d in asyncio.run(retriever.ainvoke("boundary layer"))] == ["d2"]
    assert [[d.id for d in docs] for docs in retriever.batch(["heat flow", "panels"])] == [
        ["d4"], ["d3"]]
    assert backend.calls == ["search", "asearch", "search_batch"]


def test_langchain_refuses_a_configured_deadline_the_backend_cannot_honour():
    with pytest.raises(NotASearchBackendError, match=REFUSED) as caught:
        langchain.LangChainRetriever(OldBackend(), k=2, deadline_ms=50)
    assert "leave deadline_ms unset" in str(caught.value)
    assert isinstance(caught.value, TypeError)  # what calling the backend raised before


@pytest.mark.parametrize("call", ["invoke", "ainvoke", "batch", "abatch"])
def test_langchain_refuses_a_per_call_deadline_before_calling_the_backend(call):
    backend = OldBackend()
    retriever = langchain.LangChainRetriever(backend, k=2)
    run = {"invoke": lambda: retriever.invoke("flutter", deadline_ms=50),
           "ainvoke": lambda: asyncio.run(retriever.ainvoke("flutter", deadline_ms=50)),
           "batch": lambda: retriever.batch(["flutter", "heat"], deadline_ms=50),
           "abatch": lambda: asyncio.run(retriever.abatch(["flutter"], deadline_ms=50))}[call]
    with pytest.raises(NotASearchBackendError, match=REFUSED):
        run()
    assert backend.calls == []


def test_llamaindex_over_an_old_backend_searches_without_a_deadline():
    backend = OldBackend()
    retriever = llamaindex.LlamaIndexRetriever(backend, k=2)
    assert [n.node.id_ for n in retriever.retrieve("flutter of wing", min_seq=1)] == [
        "d1", "d3"]
    assert [n.node.id_ for n in asyncio.run(retriever.aretrieve("heat"))] == ["d4"]
    assert backend.calls == ["search", "asearch"]


def test_llamaindex_refuses_a_deadline_the_backend_cannot_honour():
    with pytest.raises(NotASearchBackendError, match=REFUSED):
        llamaindex.LlamaIndexRetriever(OldBackend(), deadline_ms=50)
    backend = OldBackend()
    retriever = llamaindex.LlamaIndexRetriever(backend, k=2)
    with pytest.raises(NotASearchBackendError, match=REFUSED):
        retriever.retrieve("flutter", deadline_ms=50)
    with pytest.raises(NotASearchBackendError, match=REFUSED):
        asyncio.run(retriever.aretrieve("flutter", deadline_ms=50))
    assert backend.calls == []


def test_a_backend_taking_any_option_gets_the_deadline():
    backend = OptionsBackend()
    langchain.LangChainRetriever(backend, k=1).invoke("flutter", deadline_ms=50)
    llamaindex.LlamaIndexRetriever(backend, k=1).retrieve("flutter", deadline_ms=40)
    assert [o.get("deadline_ms") for o in backend.options] == [50.0, 40.0]


def test_a_method_the_object_holds_itself_is_read_as_its_own():
    """The signature is read once per class, except a method set on the object itself."""
    backend = OptionsBackend()
    langchain.LangChainRetriever(backend, k=1).invoke("flutter", deadline_ms=50)
    backend.search = OldBackend().search  # type: ignore[method-assign]
    with pytest.raises(NotASearchBackendError, match=REFUSED):
        langchain.LangChainRetriever(backend, k=1).invoke("flutter", deadline_ms=50)
