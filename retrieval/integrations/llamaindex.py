"""A LlamaIndex retriever over the engine: ``LlamaIndexRetriever(Retriever.load(path), k=5)``.

``filters`` takes LlamaIndex ``MetadataFilters`` (translated exactly, or refused with
``UnsupportedFilterError`` at construction) or the library's own dict / DSL filters.
``_aretrieve`` awaits the engine's async search, so ``aretrieve`` never blocks the loop.

Nodes are ``TextNode(id_=doc id)`` whose metadata also carries ``doc_id``: LlamaIndex
de-duplicates on ``node.hash`` (text + metadata) in places such as ``QueryFusionRetriever``,
and two documents with identical text must stay two results.
"""

from __future__ import annotations

from retrieval.integrations.backend import (
    PASSAGE_KEYS,
    SCORE_KEYS,
    FilterSpec,
    SearchBackend,
    check_backend,
    check_count,
    check_filters,
    grouping_options,
    hit_id,
    hit_metadata,
    passage,
)
from retrieval.integrations.errors import MissingExtraError
from retrieval.integrations.trusted import TrustedModel
from retrieval.models import Hit, SearchResult
from retrieval.request_path.grouping import check_grouping

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.core.vector_stores import MetadataFilters
except ImportError as exc:
    raise MissingExtraError("llamaindex", "llama-index-core") from exc

from retrieval.integrations.llamaindex_filters import translate_filters

__all__ = ["LlamaIndexRetriever", "to_nodes", "translate_filters"]

# Bookkeeping keys kept out of the text LlamaIndex puts in prompts and embeds.
_HIDDEN_KEYS = [*SCORE_KEYS, *PASSAGE_KEYS, "doc_id"]
_ACCEPTED_FILTERS = "MetadataFilters, a dict, a DSL string or None"
_NODE = TrustedModel(TextNode, id_="", text="", metadata={}, excluded_llm_metadata_keys=[],
                     excluded_embed_metadata_keys=[])


def to_nodes(result: SearchResult) -> list[NodeWithScore]:
    """Hits as scored ``TextNode``s: id_ = doc id (``id#position`` for a passage), text =
    title + text (or the passage's context when asked for), metadata = the document's
    metadata plus ``doc_id``, ``score``, ``bm25_score``, ``vector_score``, ``build_id`` and,
    for passages, ``parent_id``, ``passage``, ``start``, ``end``; ``NodeWithScore.score`` is
    the final score."""
    # NodeWithScore is validated: for its two fields that costs no more than building it.
    return [NodeWithScore(node=_text_node(hit, result.build_id), score=hit.score)
            for hit in result.hits]


def _text_node(hit: Hit, build_id: str) -> TextNode:
    metadata = hit_metadata(hit, build_id)
    metadata["doc_id"] = hit.doc_id
    return _NODE.build(id_=hit_id(hit), text=passage(hit), metadata=metadata,
                       excluded_llm_metadata_keys=list(_HIDDEN_KEYS),
                       excluded_embed_metadata_keys=list(_HIDDEN_KEYS))


class LlamaIndexRetriever(BaseRetriever):
    """LlamaIndex ``BaseRetriever`` wrapping a ``Retriever`` or any ``SearchBackend``."""

    def __init__(self, retriever: SearchBackend, *, k: int | None = None,
                 filters: MetadataFilters | FilterSpec = None, candidates: int | None = None,
                 group_by: str | None = None, context: int = 0,
                 callback_manager: CallbackManager | None = None, verbose: bool = False,
                 min_score: float | None = None) -> None:
        self.retriever = check_backend(retriever)
        self.search_options = {"candidates": check_count("candidates", candidates),
                               **grouping_options(*check_grouping(group_by, context),
                                                  min_score)}
        self.k = check_count("k", k)
        self.candidates = check_count("candidates", candidates)
        self.filters = (translate_filters(filters) if isinstance(filters, MetadataFilters)
                        else check_filters(filters, _ACCEPTED_FILTERS))
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return to_nodes(self.retriever.search(query_bundle.query_str, self.filters, self.k,
                                              **self.search_options))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = await self.retriever.asearch(query_bundle.query_str, self.filters, self.k,
                                              **self.search_options)
        return to_nodes(result)
