"""``RetrievalVectorStore`` against LangChain's vector-store contract: it starts empty, writes go
through the log (durable, searchable at once, re-adding an id replaces it), and it is driven by
LangChain's own retrievers and runnables."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from passage_fixtures import CAR_QUERY, TARGET
from small_index import small_index

from indexes.errors import InvalidWriteError, SchemaMismatchError
from retrieval import InvalidQueryError
from retrieval.integrations.langchain_store import RetrievalVectorStore

TEXTS = {"wing": "wing flutter at subsonic speeds", "layer": "boundary layers on flat plates",
         "shock": "shock waves in supersonic nozzles", "heat": "heat transfer in hot gases"}


@pytest.fixture
def store(tmp_path):
    vector_store = RetrievalVectorStore(tmp_path / "idx", DeterministicFakeEmbedding(size=32))
    yield vector_store
    vector_store.close()


def add_all(store: RetrievalVectorStore) -> list[str]:
    docs = [Document(id=key, page_content=text, metadata={"topic": key, "year": 1960 + i})
            for i, (key, text) in enumerate(TEXTS.items())]
    return store.add_documents(docs)


def test_an_empty_store_answers_then_takes_documents_with_and_without_ids(store):
    assert store.similarity_search("wing", k=2) == [] and store.get_by_ids(["wing"]) == []
    assert add_all(store) == list(TEXTS)
    generated = store.add_texts(["a text without an id"], [{"topic": "misc"}])
    assert len(generated) == 1 and len(generated[0]) == 32
    found = store.get_by_ids([generated[0], "wing", "absent"])
    assert [d.id for d in found] == [generated[0], "wing"]
    assert found[1].page_content == TEXTS["wing"] and found[1].metadata["year"] == 1960


def test_re_adding_an_id_replaces_it_and_delete_removes_it_at_once(store):
    add_all(store)
    store.add_documents([Document(id="wing", page_content="rewritten wing text",
                                  metadata={"topic": "wing", "year": 2000})])
    assert store.get_by_ids(["wing"])[0].page_content == "rewritten wing text"
    with pytest.raises(InvalidWriteError, match="ids is one string"):
        store.delete("wing")  # type: ignore[arg-type]  # it deleted w, i, n and g
    assert store.delete(["shock"]) is True
    assert store.get_by_ids(["shock"]) == []
    assert "shock" not in [d.id for d in store.similarity_search("shock waves", k=4)]


def test_scores_filters_and_score_thresholds(store):
    add_all(store)
    (best, score), *_ = store.similarity_search_with_score(TEXTS["layer"], k=3)
    assert best.id == "layer" and score == pytest.approx(1.0, abs=1e-5)
    assert [d.id for d in store.similarity_search("in", k=4, filter={"year": {"gte": 1962}})
            ] and all(d.metadata["year"] >= 1962
                      for d in store.similarity_search("in", k=4, filter="year >= 1962"))
    # The library's own spelling, filters=, filters too; any other option is refused, not
    # dropped (a dropped filter matched every document).
    assert {d.id for d in store.similarity_search("in", k=4, filters="year >= 1962")} == \
        {d.id for d in store.similarity_search("in", k=4, filter="year >= 1962")}
    for options in ({"where": {"year": 1962}}, {"filters": "year >= 1962", "filter": "x"}):
        with pytest.raises(InvalidQueryError):
            store.similarity_search("in", k=4, **options)
        with pytest.raises(InvalidQueryError):
            store.max_marginal_relevance_search("in", k=2, **options)
    strict = store.as_retriever(search_type="similarity_score_threshold",
                                search_kwargs={"score_threshold": 0.99, "k": 4})
    assert [d.id for d in strict.invoke(TEXTS["heat"])] == ["heat"]


def test_mmr_prefers_a_different_document_over_a_duplicate(store):
    store.add_texts(["alpha beta", "alpha beta", "alpha gamma"], ids=["a1", "a2", "g"])
    plain = [d.id for d in store.similarity_search("alpha beta", k=2)]
    assert sorted(plain) == ["a1", "a2"]
    diverse = [d.id for d in store.max_marginal_relevance_search("alpha beta", k=2, fetch_k=3,
                                                               lambda_mult=0.1)]
    assert len(diverse) == 2 and "g" in diverse
    mmr = store.as_retriever(search_type="mmr",
                             search_kwargs={"k": 2, "fetch_k": 3, "lambda_mult": 0.1})
    assert "g" in [d.id for d in mmr.invoke("alpha beta")]


def test_writes_are_durable_and_async_search_works(tmp_path):
    first = RetrievalVectorStore(tmp_path / "idx", DeterministicFakeEmbedding(size=32))
    add_all(first)
    first.add_texts(["logged after the first build"], ids=["late"])
    first.close()
    again = RetrievalVectorStore(tmp_path / "idx", DeterministicFakeEmbedding(size=32))
    try:
        assert [d.id for d in again.get_by_ids(["late", "wing"])] == ["late", "wing"]
        hits = asyncio.run(again.asimilarity_search("logged after the first build", k=1))
        assert hits[0].id == "late"
    finally:
        again.close()


def test_a_chain_with_a_chat_model_gets_the_retrieved_context(store):
    add_all(store)
    seen: list[str] = []

    def remember(prompt):
        seen.append(prompt.to_string())
        return prompt

    prompt = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {question}")
    chain = ({"context": store.as_retriever(search_kwargs={"k": 1})
              | RunnableLambda(lambda docs: "\n".join(d.page_content for d in docs)),
              "question": RunnablePassthrough()}
             | prompt | RunnableLambda(remember) | FakeListChatModel(responses=["answered"])
             | StrOutputParser())
    assert chain.invoke(TEXTS["shock"]) == "answered"
    assert TEXTS["shock"] in seen[0]


def test_the_bundled_encoder_by_default(tmp_path):
    store = RetrievalVectorStore(tmp_path / "idx")
    try:
        store.add_texts(list(TEXTS.values()), ids=list(TEXTS))
        store.add_texts(["vitamin D and bone density in adults"], ids=["bone"])
        assert store.similarity_search("bone mineral density", k=1)[0].id == "bone"
        assert store.similarity_search("flutter of aircraft wings", k=1)[0].id == "wing"
    finally:
        store.close()


def test_the_retriever_adapter_points_search_type_to_the_vector_store(store):
    from retrieval import InvalidQueryError
    from retrieval.integrations.langchain import LangChainRetriever

    add_all(store)
    with pytest.raises(InvalidQueryError, match="RetrievalVectorStore.*as_retriever"):
        LangChainRetriever(store._retriever, search_type="mmr")


def test_adding_nothing_returns_no_ids_and_builds_nothing(store):
    assert store.add_texts([]) == [] and store.add_documents([]) == []
    assert not store.root.exists() and store.similarity_search("wing") == []
    add_all(store)
    assert store.add_texts([]) == [] and store.add_documents([]) == []
    assert len(store.similarity_search("in", k=10)) == len(TEXTS)


def test_later_documents_may_add_metadata_keys_of_a_fixed_type(store):
    add_all(store)  # its documents have topic and year
    store.add_documents([Document(id="src", page_content="a text with a source",
                                  metadata={"source": "handbook", "year": 1999})])
    found = store.similarity_search("source", k=4, filter={"source": "handbook"})
    assert [(d.id, d.metadata) for d in found] == [("src", {"source": "handbook", "year": 1999})]
    with pytest.raises(SchemaMismatchError, match="year"):
        store.add_documents([Document(id="bad", page_content="x", metadata={"year": "1999"})])


def ranked_by_cosine(store: RetrievalVectorStore, query: str, k: int) -> list[str]:
    """The ids of the store's top hits ordered by their cosine with the query alone."""
    scored = store.similarity_search_with_score(query, k=k)
    return [doc.id for doc, _ in sorted(scored, key=lambda pair: -pair[1])]


@pytest.fixture(scope="module")
def cranfield(dataset, encoder):
    return small_index(dataset("cranfield"), encoder)


def test_bundled_encoder_mmr_compares_with_the_query_and_titles_come_back(cranfield, tmp_path):
    shutil.copytree(cranfield, tmp_path / "idx")
    store = RetrievalVectorStore(tmp_path / "idx")  # a root built from a corpus with titles
    try:
        query = "flutter of panels in supersonic flow"
        # lambda_mult=1 is relevance alone: the order of the hits' cosines with the query.
        mmr = store.max_marginal_relevance_search(query, k=6, fetch_k=20, lambda_mult=1.0)
        assert [d.id for d in mmr] == ranked_by_cosine(store, query, 20)[:6]
        assert len({d.id for d in store.max_marginal_relevance_search(query, k=6)}) == 6
        stored = store._retriever.get_documents([mmr[0].id])[0]
        assert stored.title and mmr[0].metadata["title"] == stored.title
        assert mmr[0].page_content == stored.text
        fetched = store.get_by_ids([mmr[0].id])[0]
        assert (fetched.page_content, fetched.metadata) == (
            stored.text, {"title": stored.title, **stored.metadata})
    finally:
        store.close()


def test_a_passage_build_gives_one_document_per_id_as_its_best_passage(passage_roots, long_docs,
                                                                        tmp_path):
    shutil.copytree(passage_roots("passages"), tmp_path / "idx")
    store = RetrievalVectorStore(tmp_path / "idx")
    try:
        text_of = {d.id: d.text for d in long_docs}
        found = store.similarity_search(CAR_QUERY, k=6)
        assert len({d.id for d in found}) == len(found) == 6
        for doc in found:
            meta = doc.metadata
            assert meta["parent_id"] == doc.id
            assert text_of[doc.id][meta["start"]:meta["end"]] == doc.page_content
        # MMR compares the query with each hit's own passage, not its document's first one.
        mmr = store.max_marginal_relevance_search(CAR_QUERY, k=4, fetch_k=12, lambda_mult=1.0)
        assert [d.id for d in mmr] == ranked_by_cosine(store, CAR_QUERY, 12)[:4]
        assert mmr[0].id == TARGET and "Automobile prices in Norway" in mmr[0].page_content
        assert mmr[0].metadata["passage"] > 0  # the car paragraph ends the document
        whole = store.get_by_ids([TARGET])[0]
        assert whole.page_content == text_of[TARGET]
    finally:
        store.close()
