"""The adapters build framework objects without validating again: what they build must equal,
field by field, what the frameworks' validating constructors build from the same hits."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

pytest.importorskip("langchain_core", reason="needs the langchain extra")
pytest.importorskip("llama_index.core", reason="needs the llamaindex extra")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.load import dumpd  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode  # noqa: E402
from pydantic import BaseModel, ValidationError  # noqa: E402

from retrieval.integrations.langchain import to_documents  # noqa: E402
from retrieval.integrations.llamaindex import to_nodes  # noqa: E402
from retrieval.integrations.trusted import TrustedModel  # noqa: E402
from retrieval.models import Hit, PassageContext, SearchResult  # noqa: E402

HIDDEN = ["score", "bm25_score", "vector_score", "relevance", "build_id", "parent_id", "passage",
          "start", "end", "degraded", "warnings", "doc_id"]
NOTES = {"degraded": ["embed"], "warnings": ["no document has department = 'cardiolgy'"]}


def result(notes: bool = False) -> SearchResult:
    """Hits of every shape: titled or not, a metadata field named like a score key, nested
    metadata values, a passage, a passage with its neighbours as context; with ``notes``, a
    result that was degraded and warned."""
    hits = [
        Hit(doc_id="a", score=0.9, bm25_score=7.5, vector_score=0.81, relevance=0.62,
            title="Statins",
            text="lower risk", metadata={"year": 2004, "department": "cardiology"}),
        Hit(doc_id="b", score=0.5, bm25_score=0.0, vector_score=0.3, text="untitled body",
            metadata={"score": "the document's own", "tags": ["x", "y"], "nested": {"k": 1}}),
        Hit(doc_id="c", score=0.4, bm25_score=2.0, vector_score=0.1, title="Long",
            text="second passage", parent_id="c", passage=1, start=120, end=134),
        Hit(doc_id="d", score=0.2, bm25_score=1.0, vector_score=0.05, text="middle",
            metadata={"year": 1999}, parent_id="d", passage=2, start=10, end=16,
            context=PassageContext(text="before middle after", start=0, end=19,
                                   first_passage=1, last_passage=3)),
    ]
    return SearchResult(query="q", hits=hits, timings={"total": 0.1}, build_id="build-7",
                        **(NOTES if notes else {}))


def body(hit: Hit) -> str:
    text = hit.context.text if hit.context is not None else hit.text
    return f"{hit.title}\n\n{text}" if hit.title else text


def expected_metadata(hit: Hit, result: SearchResult) -> dict[str, Any]:
    located = ({"parent_id": hit.parent_id, "passage": hit.passage, "start": hit.start,
                "end": hit.end} if hit.parent_id is not None else {})
    notes = {key: list(getattr(result, key)) for key in NOTES if getattr(result, key)}
    return {**hit.metadata, "score": hit.score, "bm25_score": hit.bm25_score,
            "vector_score": hit.vector_score, "relevance": hit.relevance,
            "build_id": result.build_id, **located, **notes}


def hit_id(hit: Hit) -> str:
    return hit.doc_id if hit.passage is None else f"{hit.doc_id}#{hit.passage}"


def validated_documents(result: SearchResult) -> list[Document]:
    return [Document(id=hit_id(h), page_content=body(h),
                     metadata=expected_metadata(h, result)) for h in result.hits]


def validated_nodes(result: SearchResult) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=hit_id(h), text=body(h),
                                        metadata={**expected_metadata(h, result),
                                                  "doc_id": h.doc_id},
                                        excluded_llm_metadata_keys=list(HIDDEN),
                                        excluded_embed_metadata_keys=list(HIDDEN)),
                          score=h.score) for h in result.hits]


def assert_same_model(built: BaseModel, validated: BaseModel) -> None:
    assert type(built) is type(validated)
    assert built == validated
    assert built.__dict__ == validated.__dict__
    assert list(built.__dict__) == list(validated.__dict__)  # field order: dumps, JSON
    assert built.model_fields_set == validated.model_fields_set
    assert built.__pydantic_extra__ == validated.__pydantic_extra__
    assert built.__pydantic_private__ == validated.__pydantic_private__
    assert built.model_dump() == validated.model_dump()
    assert built.model_dump(exclude_unset=True) == validated.model_dump(exclude_unset=True)
    assert built.model_dump_json() == validated.model_dump_json()
    assert pickle.loads(pickle.dumps(built)) == validated


@pytest.mark.parametrize("notes", [False, True])
def test_documents_equal_validated_construction(notes):
    built, validated = to_documents(result(notes)), validated_documents(result(notes))
    assert len(built) == len(validated) == 4
    for doc, reference in zip(built, validated, strict=True):
        assert_same_model(doc, reference)
        assert (doc.id, doc.page_content, doc.metadata) == \
            (reference.id, reference.page_content, reference.metadata)
        assert dumpd(doc) == dumpd(reference)  # LangChain's own serialization
    assert built[1].metadata["score"] == 0.5  # the stage score wins over the document's field
    assert built[3].page_content == "before middle after"


@pytest.mark.parametrize("notes", [False, True])
def test_nodes_equal_validated_construction(notes):
    built, validated = to_nodes(result(notes)), validated_nodes(result(notes))
    assert len(built) == len(validated) == 4
    for scored, reference in zip(built, validated, strict=True):
        assert_same_model(scored, reference)
        node, expected = scored.node, reference.node
        assert_same_model(node, expected)
        assert (node.node_id, node.text, node.metadata, node.relationships) == \
            (expected.node_id, expected.text, expected.metadata, expected.relationships)
        assert node.hash == expected.hash  # what LlamaIndex de-duplicates on
        for mode in MetadataMode:
            assert node.get_content(metadata_mode=mode) == expected.get_content(mode)
        assert node.to_dict() == expected.to_dict()
        assert TextNode.from_dict(node.to_dict()) == expected


def test_built_objects_own_their_mutable_fields():
    hits = result()
    first, second = to_nodes(hits)[:2]
    first.node.relationships["x"] = "shared?"  # type: ignore[assignment]
    first.node.excluded_llm_metadata_keys.append("year")
    first.node.metadata["added"] = True
    assert second.node.relationships == {} and "year" not in second.node.excluded_llm_metadata_keys
    assert "added" not in hits.hits[0].metadata and "added" not in to_nodes(hits)[0].node.metadata
    doc = to_documents(hits)[0]
    doc.metadata["added"] = True
    assert "added" not in hits.hits[0].metadata and "added" not in to_documents(hits)[0].metadata
    noted = result(notes=True)
    for first, second in (to_documents(noted)[:2],
                          [scored.node for scored in to_nodes(noted)[:2]]):
        first.metadata["warnings"].append("added")
        assert second.metadata["warnings"] == noted.warnings == NOTES["warnings"]


def test_built_nodes_still_validate_assignment():
    node = to_nodes(result())[0].node
    node.text = "replaced"
    assert node.model_fields_set == {"id_", "text", "metadata", "excluded_llm_metadata_keys",
                                     "excluded_embed_metadata_keys"}
    with pytest.raises(ValidationError):
        node.start_char_idx = "not a number"  # type: ignore[assignment]


class WithPostInit(BaseModel):
    name: str
    seen: list[str] = []

    def model_post_init(self, context: Any) -> None:
        self.seen.append(self.name)


def test_a_model_with_a_post_init_hook_is_built_validated():
    trusted = TrustedModel(WithPostInit, name="example")
    assert not trusted.trusted
    built = trusted.build(name="x")
    assert built.seen == ["x"]
    with pytest.raises(ValidationError):
        trusted.build(name=3)
