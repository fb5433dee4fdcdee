"""Filters people expect: contains / any / all on list fields, exists and missing, in the dict
language and the DSL, checked against the documents themselves; and a value no document
holds warned about on the result, with the closest value."""

from __future__ import annotations

import pytest
from live_index import INFO, unit_vectors

from indexes import Document, build_index
from retrieval import FilterTypeError, MalformedFilterError, Retriever

TAGS = [["wind", "subsonic"], ["wind"], ["subsonic", "shock"], [], ["shock"], None]
LIVE = {"cache": {"backend": "none"}, "live_lag_seconds": None}


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    root = tmp_path_factory.mktemp("operators")
    docs = []
    for i in range(30):
        metadata: dict = {"department": ["cardiology", "oncology", "neurology"][i % 3]}
        tags = TAGS[i % len(TAGS)]
        if tags is not None:
            metadata["tags"] = tags
        if i % 4:
            metadata["reviewer"] = f"r{i % 5}"
            metadata["score"] = float(i)
        docs.append(Document(f"d{i}", f"flow over a wing, case {i}", metadata=metadata))
    build_index(docs, root, vectors=unit_vectors(len(docs), 1), encoder_info=INFO,
                progress=False)
    with Retriever.load(root, LIVE) as loaded:
        yield loaded, docs


def allowed(retriever, spec) -> int:
    return retriever.search("wing", spec, 1, query_vector=unit_vectors(1, 2)[0]).allowed


def count(docs, test) -> int:
    return sum(1 for d in docs if test(d.metadata))


@pytest.mark.parametrize(("spec", "dsl", "test"), [
    ({"tags": {"contains": "wind"}}, 'tags CONTAINS "wind"',
     lambda m: "wind" in m.get("tags", [])),
    ({"tags": {"any": ["wind", "shock"]}}, 'tags ANY ("wind", "shock")',
     lambda m: bool({"wind", "shock"} & set(m.get("tags", [])))),
    ({"tags": {"all": ["wind", "subsonic"]}}, 'tags ALL ("wind", "subsonic")',
     lambda m: {"wind", "subsonic"} <= set(m.get("tags", []))),
    ({"tags": {"exists": True}}, "tags EXISTS", lambda m: bool(m.get("tags"))),
    ({"reviewer": {"exists": False}}, "NOT reviewer EXISTS", lambda m: "reviewer" not in m),
    ({"score": {"exists": True}}, "score EXISTS", lambda m: "score" in m),
    ({"score": {"exists": False}, "tags": "shock"}, 'NOT score EXISTS AND tags = "shock"',
     lambda m: "score" not in m and "shock" in m.get("tags", [])),
], ids=["contains", "any", "all", "exists-keyword", "missing", "exists-number", "combined"])
def test_list_and_presence_operators_match_the_documents(retriever, spec, dsl, test):
    loaded, docs = retriever
    want = count(docs, test)
    assert 0 < want < len(docs)
    assert allowed(loaded, spec) == want
    assert allowed(loaded, dsl) == want


def test_wrong_uses_are_typed_errors(retriever):
    loaded, _ = retriever
    with pytest.raises(FilterTypeError, match="'score' is a number field: 'contains'"):
        allowed(loaded, {"score": {"contains": 3}})
    with pytest.raises(FilterTypeError, match="'exists' takes true or false"):
        allowed(loaded, {"tags": {"exists": "yes"}})
    with pytest.raises(MalformedFilterError, match="'all' takes a non-empty list"):
        allowed(loaded, {"tags": {"all": []}})
    with pytest.raises(MalformedFilterError, match="contains, any, all, exists"):
        allowed(loaded, {"tags": {"has": "x"}})


def test_a_value_no_document_holds_is_warned_about_with_the_closest(retriever):
    loaded, _ = retriever
    vector = unit_vectors(1, 2)[0]
    typo = loaded.search("wing", {"department": "oncolgy"}, 5, query_vector=vector)
    assert typo.hits == [] and typo.warnings == [
        "no document has department = 'oncolgy'; did you mean 'oncology'?"]
    fine = loaded.search("wing", {"department": "oncology"}, 5, query_vector=vector)
    assert fine.hits and fine.warnings == []
    acl = {"department": {"in": [f"team-{i}" for i in range(100)]}}  # an access list
    assert loaded.search("wing", acl, 5, query_vector=vector).warnings == []


def test_a_lists_null_items_are_skipped_live_and_built_and_true_is_one_value(tmp_path):
    """["a", None] holds "a" (a null item was left out with the whole list); [True, "true"]
    holds one value, counted once."""
    from enum import Enum

    from indexes.writer import IndexWriter

    class Lab(str, Enum):  # noqa: UP042 - its str() is "Lab.NORTH" (a StrEnum's is "north")
        NORTH = "north"
        SOUTH = "south"

    docs = [Document("d0", "wing", metadata={"tags": ["a", None], "lab": "north"}),
            Document("d1", "wing", metadata={"tags": ["a"], "lab": "south"}),
            Document("d2", "wing", metadata={"tags": ["b", True, "true"], "lab": "east"})]
    build_index(docs, tmp_path, vectors=unit_vectors(3, 1), encoder_info=INFO, progress=False)
    with Retriever.load(tmp_path, LIVE) as retriever:
        assert allowed(retriever, {"tags": {"contains": "a"}}) == 2
        assert allowed(retriever, {"tags": {"in": [Lab.NORTH, Lab.SOUTH]}}) == 0
        assert allowed(retriever, {"lab": {"in": [Lab.NORTH, Lab.SOUTH]}}) == 2
        assert allowed(retriever, {"lab": {"nin": [Lab.NORTH]}}) == 2
        assert dict(retriever.snapshot.metadata.value_counts("tags"))["true"] == 1
        with IndexWriter(tmp_path) as writer:
            writer.upsert([Document("d3", "wing", metadata={"tags": ["a", None, False,
                                                                     "false"]})],
                          vectors=unit_vectors(1, 2))
        retriever.refresh()
        assert allowed(retriever, {"tags": {"contains": "a"}}) == 3
        assert dict(retriever.snapshot.metadata.value_counts("tags"))["false"] == 1


@pytest.mark.parametrize("field", ["score", "reviewer"])
@pytest.mark.parametrize("digits", [400, 5000])
def test_a_dsl_integer_of_hundreds_of_digits_is_a_typed_error(retriever, field, digits):
    """It was an OverflowError (a 500 over HTTP) past a float's range, and a ValueError past
    the 4,300 digits int() reads."""
    loaded, _ = retriever
    with pytest.raises((FilterTypeError, MalformedFilterError)):
        allowed(loaded, f"{field} = {'1' * digits}")


def test_counts_of_a_live_view_leave_out_deleted_and_replaced_documents(tmp_path):
    """Named filters' counts, field summaries and the closest-value hint count what a search
    can find: a value only deleted documents held is gone, as from a rebuilt build."""
    from indexes.field_summary import summarize_fields
    from indexes.writer import IndexWriter

    docs = [Document(f"d{i}", "wing", metadata={"lab": "L1" if i < 2 else "L2"})
            for i in range(6)]
    build_index(docs, tmp_path, vectors=unit_vectors(6, 1), encoder_info=INFO, progress=False)
    with Retriever.load(tmp_path, LIVE) as retriever:
        with IndexWriter(tmp_path) as writer:
            writer.delete(["d0"])
            writer.upsert([Document("d1", "wing", metadata={"lab": "L2"}),
                           Document("d9", "wing", metadata={"lab": "L3"})],
                          vectors=unit_vectors(2, 2))
        retriever.refresh()
        retriever.register_filter("everything", {})
        assert retriever.named_filters()["everything"] == 6
        (lab,) = summarize_fields(retriever.snapshot.metadata, top=5)
        assert (lab.documents, lab.of, lab.distinct) == (6, 6, 2)
        assert dict(lab.common) == {"L2": 5, "L3": 1}
        found = retriever.search("wing", {"lab": "L1"}, 1, query_vector=unit_vectors(1, 3)[0])
        assert found.allowed == 0
        assert found.warnings == ["no document has lab = 'L1'; did you mean 'L3'?"]
