"""The LlamaIndex adapter driven through llama-index-core itself, with the real model and data."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_index.core", reason="needs the llamaindex extra")

from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.query_engine import RetrieverQueryEngine  # noqa: E402
from llama_index.core.retrievers import QueryFusionRetriever  # noqa: E402
from llama_index.core.schema import MetadataMode  # noqa: E402
from llama_index.core.vector_stores import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from indexes.build import build_index  # noqa: E402
from indexes.docstore import Document  # noqa: E402
from retrieval import InvalidQueryError, Retriever, UnknownFieldError  # noqa: E402
from retrieval.integrations import NotASearchBackendError, UnsupportedFilterError  # noqa: E402
from retrieval.integrations.llamaindex import LlamaIndexRetriever, translate_filters  # noqa: E402

QUERIES = ["statins lower cardiovascular risk", "gene expression in tumor cells"]
F, Op = MetadataFilter, FilterOperator



def triples(nodes):
    return [(n.node.node_id, n.score) for n in nodes]


def test_retrieve_and_aretrieve_equal_search(uncached_scifact):
    year = {"year": {"gte": 2005}}
    for filters in (None, year):
        retriever = LlamaIndexRetriever(uncached_scifact, k=5, filters=filters)
        for query in QUERIES:
            hits = uncached_scifact.search(query, filters, 5).hits
            expected = [(h.doc_id, h.score) for h in hits]
            assert len(expected) == 5
            assert triples(retriever.retrieve(query)) == expected
            assert triples(asyncio.run(retriever.aretrieve(query))) == expected


def test_nodes_carry_text_metadata_and_scores(uncached_scifact):
    hit = uncached_scifact.search(QUERIES[0], k=1).hits[0]
    node = LlamaIndexRetriever(uncached_scifact, k=1).retrieve(QUERIES[0])[0].node
    assert node.node_id == hit.doc_id and node.text == f"{hit.title}\n\n{hit.text}"
    assert node.metadata == {**hit.metadata, "doc_id": hit.doc_id, "score": hit.score,
                             "bm25_score": hit.bm25_score, "vector_score": hit.vector_score,
                             "relevance": hit.relevance, "build_id": uncached_scifact.build_id}
    prompt_metadata = node.get_metadata_str(MetadataMode.LLM)
    assert "department" in prompt_metadata
    assert "bm25_score" not in prompt_metadata and "doc_id" not in prompt_metadata


def naive(spec, meta) -> bool:
    """An independent reading of the LlamaIndex operators over one document's metadata."""
    if isinstance(spec, MetadataFilters):
        results = [naive(child, meta) for child in spec.filters]
        return all(results) if spec.condition == FilterCondition.AND else any(results)
    value, bound = meta.get(spec.key), spec.value
    if spec.operator == Op.NE:
        return value != bound
    if spec.operator == Op.NIN:
        return value not in bound
    if value is None:
        return False
    return {Op.EQ: lambda: value == bound, Op.GT: lambda: value > bound,
            Op.GTE: lambda: value >= bound, Op.LT: lambda: value < bound,
            Op.LTE: lambda: value <= bound, Op.IN: lambda: value in bound}[spec.operator]()


CASES = {
    "eq": (MetadataFilters(filters=[F(key="department", value="cardiology")]),
           {"department": "cardiology"}),
    "ne": (MetadataFilters(filters=[F(key="department", value="cardiology", operator=Op.NE)]),
           {"department": {"ne": "cardiology"}}),
    "gt": (MetadataFilters(filters=[F(key="year", value=2015, operator=Op.GT)]),
           {"year": {"gt": 2015}}),
    "gte": (MetadataFilters(filters=[F(key="year", value=2015, operator=Op.GTE)]),
            {"year": {"gte": 2015}}),
    "lt": (MetadataFilters(filters=[F(key="year", value=2005, operator=Op.LT)]),
           {"year": {"lt": 2005}}),
    "lte": (MetadataFilters(filters=[F(key="year", value=2005, operator=Op.LTE)]),
            {"year": {"lte": 2005}}),
    "in": (MetadataFilters(filters=[F(key="doc_type", value=["trial", "review"],
                                      operator=Op.IN)]),
           {"doc_type": {"in": ["trial", "review"]}}),
    "nin": (MetadataFilters(filters=[F(key="doc_type", value=["trial", "review"],
                                       operator=Op.NIN)]),
            {"doc_type": {"nin": ["trial", "review"]}}),
    "and": (MetadataFilters(filters=[F(key="department", value="oncology"),
                                     F(key="year", value=2010, operator=Op.GTE)]),
            {"$and": [{"department": {"eq": "oncology"}}, {"year": {"gte": 2010}}]}),
    "or": (MetadataFilters(condition=FilterCondition.OR,
                           filters=[F(key="department", value="oncology"),
                                    F(key="year", value=2000, operator=Op.LT)]),
           {"$or": [{"department": "oncology"}, {"year": {"lt": 2000}}]}),
    "nested": (MetadataFilters(filters=[
        F(key="doc_type", value=["cohort"], operator=Op.NIN),
        MetadataFilters(condition=FilterCondition.OR, filters=[
            F(key="department", value="genetics"),
            MetadataFilters(filters=[F(key="department", value="neurology"),
                                     F(key="year", value=2012, operator=Op.LTE)])])]),
        {"doc_type": {"nin": ["cohort"]},
         "$or": [{"department": "genetics"},
                 {"department": "neurology", "year": {"lte": 2012}}]}),
}


def test_min_score_leaves_out_hits_below_it(uncached_scifact):
    every = uncached_scifact.search(QUERIES[0], k=5).hits
    threshold = sorted(h.relevance for h in every)[2]
    nodes = LlamaIndexRetriever(uncached_scifact, k=5, min_score=threshold).retrieve(QUERIES[0])
    assert [n.node.node_id for n in nodes] == \
        [h.doc_id for h in every if h.relevance >= threshold]
    assert all(n.node.metadata["relevance"] >= threshold for n in nodes)
    with pytest.raises(InvalidQueryError, match="min_score"):
        LlamaIndexRetriever(uncached_scifact, min_score=2)


@pytest.mark.parametrize("name", CASES)
def test_metadata_filters_select_what_our_filters_select(uncached_scifact, name):
    llama_filters, ours = CASES[name]
    nodes = LlamaIndexRetriever(uncached_scifact, k=20, filters=llama_filters).retrieve(QUERIES[1])
    expected = [(h.doc_id, h.score) for h in uncached_scifact.search(QUERIES[1], ours, 20).hits]
    assert triples(nodes) == expected and expected
    assert all(naive(llama_filters, n.node.metadata) for n in nodes)
    unfiltered = {h.doc_id for h in uncached_scifact.search(QUERIES[1], k=20).hits}
    assert {n.node.node_id for n in nodes} != unfiltered


def test_translation_of_a_nested_filter():
    assert translate_filters(CASES["nested"][0]) == {"$and": [
        {"doc_type": {"nin": ["cohort"]}},
        {"$or": [{"department": {"eq": "genetics"}},
                 {"$and": [{"department": {"eq": "neurology"}}, {"year": {"lte": 2012}}]}]}]}
    assert translate_filters(MetadataFilters(filters=[])) is None


def test_list_and_presence_operators_translate_to_the_filter_language():
    filters = MetadataFilters(filters=[
        F(key="tags", value="wind", operator=Op.CONTAINS),
        F(key="tags", value=["a", "b"], operator=Op.ANY),
        F(key="tags", value=["a", "b"], operator=Op.ALL),
        F(key="reviewer", value=None, operator=Op.IS_EMPTY)])
    assert translate_filters(filters) == {"$and": [
        {"tags": {"contains": "wind"}}, {"tags": {"any": ["a", "b"]}},
        {"tags": {"all": ["a", "b"]}}, {"reviewer": {"exists": False}}]}


@pytest.mark.parametrize("operator", [Op.TEXT_MATCH, Op.TEXT_MATCH_INSENSITIVE])
def test_operators_we_cannot_express_are_refused(twins, operator):
    value = "cardio"
    filters = MetadataFilters(filters=[F(key="year", value=2010, operator=Op.GTE),
                                       MetadataFilters(filters=[F(key="department", value=value,
                                                                  operator=operator)])])
    with pytest.raises(UnsupportedFilterError, match=f"operator {operator.name}") as error:
        LlamaIndexRetriever(twins, filters=filters)
    assert isinstance(error.value, InvalidQueryError)


def test_not_condition_and_empty_nested_filters_are_refused(twins):
    negated = MetadataFilters(condition=FilterCondition.NOT,
                              filters=[F(key="department", value="oncology")])
    with pytest.raises(UnsupportedFilterError, match="condition 'not'.*NE or NIN"):
        LlamaIndexRetriever(twins, filters=negated)
    empty_inside = MetadataFilters(condition=FilterCondition.OR, filters=[
        F(key="department", value="oncology"), MetadataFilters(filters=[])])
    with pytest.raises(UnsupportedFilterError, match="nested MetadataFilters has no filters"):
        LlamaIndexRetriever(twins, filters=empty_inside)
    # An OR of no tenants (a list built per user) would otherwise have matched every document.
    with pytest.raises(UnsupportedFilterError, match="would match no document"):
        LlamaIndexRetriever(twins, filters=MetadataFilters(condition=FilterCondition.OR,
                                                           filters=[]))
    assert LlamaIndexRetriever(twins, filters=MetadataFilters(filters=[]))  # AND of nothing


def test_query_engine_answers_with_mock_llm(uncached_scifact):
    engine = RetrieverQueryEngine.from_args(LlamaIndexRetriever(uncached_scifact, k=3),
                                            llm=MockLLM())
    response = engine.query(QUERIES[0])
    hits = uncached_scifact.search(QUERIES[0], k=3).hits
    assert [n.node.node_id for n in response.source_nodes] == [h.doc_id for h in hits]
    assert hits[0].text[:200] in str(response)  # MockLLM echoes the prompt: context went in
    assert "bm25_score" not in str(response)
    async_response = asyncio.run(engine.aquery(QUERIES[0]))
    assert [n.node.node_id for n in async_response.source_nodes] == [h.doc_id for h in hits]


TWIN_TEXT = "Statin therapy lowers LDL cholesterol and cardiovascular events in older adults."


@pytest.fixture(scope="module")
def twins(tmp_path_factory, encoder):
    """A small real index holding two documents with identical text and metadata."""
    docs = [Document("twin-a", TWIN_TEXT, "Statins", {"department": "cardiology"}),
            Document("twin-b", TWIN_TEXT, "Statins", {"department": "cardiology"}),
            Document("other-1", "Tumor suppressor genes in colorectal cancer.", "Genes",
                     {"department": "oncology"}),
            Document("other-2", "Sleep deprivation impairs memory consolidation.", "Sleep",
                     {"department": "neurology"})]
    root = tmp_path_factory.mktemp("twins")
    build_index(docs, root, encoder=encoder, progress=False)
    retriever = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    yield retriever
    retriever.close()


def test_identical_text_documents_are_not_dropped(twins):
    query = "do statins reduce cardiovascular events"
    retriever = LlamaIndexRetriever(twins, k=3)
    nodes = retriever.retrieve(query)
    assert {"twin-a", "twin-b"} <= {n.node.node_id for n in nodes}
    twin_nodes = [n.node for n in nodes if n.node.node_id.startswith("twin")]
    assert twin_nodes[0].text == twin_nodes[1].text and twin_nodes[0].hash != twin_nodes[1].hash
    fusion = QueryFusionRetriever([retriever], llm=MockLLM(), num_queries=1, use_async=False,
                                  similarity_top_k=3)
    assert {"twin-a", "twin-b"} <= {n.node.node_id for n in fusion.retrieve(query)}
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    assert {"twin-a", "twin-b"} <= {n.node.node_id for n in engine.query(query).source_nodes}


def test_bad_arguments_raise_typed_errors(twins):
    with pytest.raises(NotASearchBackendError, match="has no search, search_batch"):
        LlamaIndexRetriever("build/scifact")
    with pytest.raises(InvalidQueryError, match="k must be a positive integer"):
        LlamaIndexRetriever(twins, k=True)
    with pytest.raises(InvalidQueryError, match="filters must be MetadataFilters, a dict"):
        LlamaIndexRetriever(twins, filters=[F(key="department", value="oncology")])
    with pytest.raises(UnknownFieldError):
        LlamaIndexRetriever(twins, filters=MetadataFilters(
            filters=[F(key="color", value="red")])).retrieve("statins")
