"""The LangChain adapter driven through langchain-core itself, on SciFact with the real model."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="needs the langchain extra")

from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.language_models.fake_chat_models import ParrotFakeChatModel  # noqa: E402
from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402
from langchain_core.runnables import RunnablePassthrough  # noqa: E402

from retrieval import InvalidQueryError, Retriever, SearchResult, UnknownFieldError  # noqa: E402
from retrieval.integrations import NotASearchBackendError  # noqa: E402
from retrieval.integrations.langchain import LangChainRetriever  # noqa: E402

QUERIES = [
    "statins lower cardiovascular risk",
    "vitamin D deficiency and bone fractures",
    "gene expression in tumor cells",
]
CARDIO = {"department": "cardiology"}



class Recording:
    """A SearchBackend forwarding to the real Retriever and recording which method ran."""

    def __init__(self, inner: Retriever) -> None:
        self.inner, self.calls = inner, []

    def search(self, *args: Any, **kwargs: Any) -> SearchResult:
        self.calls.append("search")
        return self.inner.search(*args, **kwargs)

    def search_batch(self, *args: Any, **kwargs: Any) -> list[SearchResult]:
        self.calls.append("search_batch")
        return self.inner.search_batch(*args, **kwargs)

    async def asearch(self, *args: Any, **kwargs: Any) -> SearchResult:
        self.calls.append("asearch")
        return await self.inner.asearch(*args, **kwargs)

    async def asearch_batch(self, *args: Any, **kwargs: Any) -> list[SearchResult]:
        self.calls.append("asearch_batch")
        return await self.inner.asearch_batch(*args, **kwargs)


def expected_documents(result: SearchResult) -> list[Document]:
    return [Document(id=h.doc_id,
                     page_content=f"{h.title}\n\n{h.text}" if h.title else h.text,
                     metadata={**h.metadata, "score": h.score, "bm25_score": h.bm25_score,
                               "vector_score": h.vector_score, "relevance": h.relevance,
                               "build_id": result.build_id})
            for h in result.hits]


@pytest.mark.parametrize("k", [1, 3])
def test_k_at_construction_gives_exactly_k(uncached_scifact, k):
    assert len(uncached_scifact.search(QUERIES[0], k=10).hits) == 10  # more matches than k
    docs = LangChainRetriever(uncached_scifact, k=k).invoke(QUERIES[0])
    assert [d.id for d in docs] == [h.doc_id for h in uncached_scifact.search(QUERIES[0], k=k).hits]
    assert len(docs) == k


def test_per_call_options_override_the_configured_ones(uncached_scifact):
    retriever = LangChainRetriever(uncached_scifact, k=3, filters={"department": "oncology"})
    assert len(retriever.invoke(QUERIES[0], k=5)) == 5
    docs = retriever.invoke(QUERIES[0], k=4, filters=CARDIO)
    expected = uncached_scifact.search(QUERIES[0], CARDIO, 4).hits
    assert [d.id for d in docs] == [h.doc_id for h in expected]
    assert retriever.invoke(QUERIES[0])[0].metadata["department"] == "oncology"


@pytest.mark.parametrize("filters", [
    CARDIO,
    {"year": {"gte": 2010}, "doc_type": {"nin": ["review", "trial"]}},
    'department = "oncology" OR year < 2000',
])
def test_filters_narrow_exactly_as_search_does(uncached_scifact, filters):
    docs = LangChainRetriever(uncached_scifact, k=10).invoke(QUERIES[1], filters=filters)
    unfiltered = [d.id for d in LangChainRetriever(uncached_scifact, k=10).invoke(QUERIES[1])]
    assert docs == expected_documents(uncached_scifact.search(QUERIES[1], filters, 10))
    assert [d.id for d in docs] != unfiltered  # the filter changed what came back


def test_invoke_ainvoke_batch_abatch_return_documents_with_scores(uncached_scifact):
    retriever = LangChainRetriever(uncached_scifact, k=4, filters={"year": {"gte": 2000}})
    expected = [expected_documents(uncached_scifact.search(q, {"year": {"gte": 2000}}, 4))
                for q in QUERIES]
    assert [retriever.invoke(q) for q in QUERIES] == expected
    assert [asyncio.run(retriever.ainvoke(q)) for q in QUERIES] == expected
    # A batch encodes its queries in one call; padding may move a cosine in the last float bits.
    batched = [expected_documents(r)
               for r in uncached_scifact.search_batch(QUERIES, {"year": {"gte": 2000}}, 4)]
    assert retriever.batch(QUERIES) == batched
    assert asyncio.run(retriever.abatch(QUERIES)) == batched
    assert [[d.id for d in docs] for docs in batched] == [[d.id for d in docs]
                                                          for docs in expected]
    first = expected[0][0]
    assert set(first.metadata) >= {"department", "doc_type", "year", "score", "bm25_score",
                                   "vector_score", "build_id"}
    assert first.metadata["build_id"] == uncached_scifact.build_id
    assert first.page_content.endswith(uncached_scifact.search(QUERIES[0], k=1).hits[0].text)


def test_batch_is_one_search_batch_call_and_async_uses_the_async_path(uncached_scifact):
    backend = Recording(uncached_scifact)
    retriever = LangChainRetriever(backend, k=2)
    retriever.batch(QUERIES)
    asyncio.run(retriever.abatch(QUERIES))
    asyncio.run(retriever.ainvoke(QUERIES[0]))
    retriever.invoke(QUERIES[0])
    assert backend.calls == ["search_batch", "asearch_batch", "asearch", "search"]


class Runs(BaseCallbackHandler):
    def __init__(self) -> None:
        self.started, self.ended, self.errors = [], 0, 0

    def on_retriever_start(self, serialized: Any, query: str, **kwargs: Any) -> None:
        self.started.append(query)

    def on_retriever_end(self, documents: Any, **kwargs: Any) -> None:
        self.ended += 1

    def on_retriever_error(self, error: BaseException, **kwargs: Any) -> None:
        self.errors += 1


def test_batch_reports_one_run_per_input_to_callbacks(uncached_scifact):
    runs = Runs()
    LangChainRetriever(uncached_scifact, k=2).batch(QUERIES, {"callbacks": [runs]})
    assert runs.started == QUERIES and runs.ended == len(QUERIES) and runs.errors == 0


class Events(BaseCallbackHandler):
    """Each callback run's events, in order, by run id."""

    def __init__(self) -> None:
        self.runs: dict[Any, list[str]] = {}

    def _add(self, event: str, run_id: Any) -> None:
        self.runs.setdefault(run_id, []).append(event)

    def on_retriever_start(self, serialized: Any, query: str, *, run_id: Any,
                           **kwargs: Any) -> None:
        self._add("start", run_id)

    def on_retriever_end(self, documents: Any, *, run_id: Any, **kwargs: Any) -> None:
        self._add("end", run_id)

    def on_retriever_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
        self._add("error", run_id)


@pytest.mark.parametrize("options", [{}, {"deadline_ms": 60_000}])
def test_a_failing_input_gives_each_input_one_run_to_callbacks(uncached_scifact, options):
    """One bad input fails the engine's batch call: every input still gets exactly one run,
    started once and then ended (the good one) or errored (the bad one) once."""
    retriever = LangChainRetriever(uncached_scifact, k=2, **options)
    for call in (lambda cb, **kw: retriever.batch([QUERIES[0], "   "], {"callbacks": [cb]}, **kw),
                 lambda cb, **kw: asyncio.run(retriever.abatch([QUERIES[0], "   "],
                                                               {"callbacks": [cb]}, **kw))):
        events = Events()
        outcomes = call(events, return_exceptions=True)
        assert isinstance(outcomes[1], InvalidQueryError) and len(outcomes[0]) == 2
        assert sorted(events.runs.values()) == [["start", "end"], ["start", "error"]]
        events = Events()
        with pytest.raises(InvalidQueryError):
            call(events)
        assert len(events.runs) == 2
        assert all(run[0] == "start" and len(run) == 2 for run in events.runs.values())


def test_batch_with_return_exceptions_gives_each_input_its_outcome(uncached_scifact):
    outcomes = LangChainRetriever(uncached_scifact, k=2).batch([QUERIES[0], "   "],
                                                      return_exceptions=True)
    expected = uncached_scifact.search(QUERIES[0], k=2).hits
    assert [d.id for d in outcomes[0]] == [h.doc_id for h in expected]
    assert isinstance(outcomes[1], InvalidQueryError)


def test_works_inside_an_lcel_chain_with_a_fake_chat_model(uncached_scifact):
    retriever = LangChainRetriever(uncached_scifact, k=2)
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    chain = ({"context": retriever | (lambda docs: "\n\n".join(d.page_content for d in docs)),
              "question": RunnablePassthrough()}
             | prompt | ParrotFakeChatModel() | StrOutputParser())
    answer = chain.invoke(QUERIES[0])  # the parrot model answers with the prompt it was given
    for hit in uncached_scifact.search(QUERIES[0], k=2).hits:
        assert hit.text in answer
    assert answer.endswith(f"Question: {QUERIES[0]}")


def test_min_score_at_construction_and_per_call(uncached_scifact):
    every = uncached_scifact.search(QUERIES[0], k=5).hits
    threshold = sorted(h.relevance for h in every)[2]
    kept = [h.doc_id for h in every if h.relevance >= threshold]
    configured = LangChainRetriever(uncached_scifact, k=5, min_score=threshold)
    assert [d.id for d in configured.invoke(QUERIES[0])] == kept
    assert [d.id for d in configured.batch([QUERIES[0]])[0]] == kept
    assert len(configured.invoke(QUERIES[0], min_score=0.0)) == 5
    assert LangChainRetriever(uncached_scifact, k=5).invoke(QUERIES[0], min_score=1.0) == []
    with pytest.raises(InvalidQueryError, match="min_score must be a number"):
        LangChainRetriever(uncached_scifact, min_score="high")


def test_bad_input_raises_typed_errors(uncached_scifact):
    with pytest.raises(NotASearchBackendError, match="search_batch, asearch, asearch_batch"):
        LangChainRetriever(object.__new__(type("OnlySearch", (), {"search": lambda s: None})))
    with pytest.raises(InvalidQueryError, match="k must be a positive integer"):
        LangChainRetriever(uncached_scifact, k=0)
    with pytest.raises(InvalidQueryError, match="candidates must be a positive integer"):
        LangChainRetriever(uncached_scifact, candidates="many")
    with pytest.raises(InvalidQueryError, match="filters must be a dict"):
        LangChainRetriever(uncached_scifact, filters=["department", "cardiology"])
    retriever = LangChainRetriever(uncached_scifact)
    with pytest.raises(InvalidQueryError, match="unknown search option.*top_k"):
        retriever.invoke(QUERIES[0], top_k=3)
    with pytest.raises(UnknownFieldError):
        retriever.invoke(QUERIES[0], filters={"no_such_field": 1})
