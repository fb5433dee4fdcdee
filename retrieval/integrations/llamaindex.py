"""A LlamaIndex retriever over the engine: ``LlamaIndexRetriever(Retriever.load(path), k=5)``.

``filters`` takes LlamaIndex ``MetadataFilters`` (translated exactly, or refused with
``UnsupportedFilterError`` at construction) or the library's own dict / DSL filters.
``min_seq`` (read-your-writes) and ``deadline_ms`` are set at construction and can be
overridden per call: ``retriever.retrieve("q", min_seq=ack.seq)`` (LlamaIndex's own
``retrieve`` takes only the query). ``_aretrieve`` awaits the engine's async search, so
``aretrieve`` never blocks the loop. Over a backend whose ``search`` / ``asearch`` lack an
option that is set (an older protocol), it raises ``NotASearchBackendError``: at construction
for a configured option, else on the call.

Nodes are ``TextNode(id_=doc id)`` whose metadata also carries ``doc_id``: LlamaIndex
de-duplicates on ``node.hash`` (text + metadata) in places such as ``QueryFusionRetriever``,
and two documents with identical text must stay two results.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from retrieval.integrations.backend import (
    NOTE_KEYS,
    PASSAGE_KEYS,
    SCORE_KEYS,
    FilterSpec,
    SearchBackend,
    check_backend,
    check_count,
    check_filters,
    check_options,
    grouping_options,
    hit_id,
    hit_metadata,
    passage,
    read_options,
    result_notes,
)
from retrieval.integrations.errors import MissingExtraError
from retrieval.integrations.trusted import TrustedModel
from retrieval.models import Hit, SearchResult
from retrieval.request_path.grouping import check_grouping

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, QueryType, TextNode
    from llama_index.core.vector_stores import MetadataFilters
except ImportError as exc:
    raise MissingExtraError("llamaindex", "llama-index-core") from exc

from retrieval.integrations.llamaindex_filters import translate_filters

__all__ = ["LlamaIndexRetriever", "to_nodes", "translate_filters"]

# The backend's methods this adapter calls.
_BACKEND_METHODS = ("search", "asearch")
# Bookkeeping keys kept out of the text LlamaIndex puts in prompts and embeds.
_HIDDEN_KEYS = [*SCORE_KEYS, *PASSAGE_KEYS, *NOTE_KEYS, "doc_id"]
_ACCEPTED_FILTERS = "MetadataFilters, a dict, a DSL string or None"
_NODE = TrustedModel(TextNode, id_="", text="", metadata={}, excluded_llm_metadata_keys=[],
                     excluded_embed_metadata_keys=[])
# The options of the ``retrieve`` / ``aretrieve`` call running in this context, with the
# retriever they were given to: LlamaIndex calls ``_retrieve`` with the query alone, and a
# context variable keeps concurrent calls (threads or tasks) apart.
_CALL_OPTIONS: ContextVar[tuple[object, dict[str, Any]] | None] = ContextVar(
    "llamaindex_call_options", default=None)


def to_nodes(result: SearchResult) -> list[NodeWithScore]:
    """Hits as scored ``TextNode``s: id_ = doc id (``id#position`` for a passage), text =
    title + text (or the passage's context when asked for), metadata = the document's
    metadata plus ``doc_id``, ``score``, ``bm25_score``, ``vector_score``, ``build_id``, for
    passages ``parent_id``, ``passage``, ``start``, ``end``, and the result's ``degraded`` /
    ``warnings`` when it has them (none of these reach the LLM's or the embedding's text);
    ``NodeWithScore.score`` is the final score."""
    notes = result_notes(result)
    # NodeWithScore is validated: for its two fields that costs no more than building it.
    return [NodeWithScore(node=_text_node(hit, result.build_id, notes), score=hit.score)
            for hit in result.hits]


def _text_node(hit: Hit, build_id: str, notes: dict[str, list[str]]) -> TextNode:
    metadata = hit_metadata(hit, build_id, notes)
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
                 min_score: float | None = None, min_seq: int | None = None,
                 deadline_ms: float | None = None) -> None:
        self.retriever = check_backend(retriever)
        self.search_options = check_options(
            self.retriever, _BACKEND_METHODS,
            {"candidates": check_count("candidates", candidates),
             **grouping_options(*check_grouping(group_by, context), min_score),
             **read_options(min_seq, deadline_ms)})
        self.k = check_count("k", k)
        self.candidates = check_count("candidates", candidates)
        self.filters = (translate_filters(filters) if isinstance(filters, MetadataFilters)
                        else check_filters(filters, _ACCEPTED_FILTERS))
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def retrieve(self, str_or_query_bundle: QueryType, *, min_seq: int | None = None,
                 deadline_ms: float | None = None) -> list[NodeWithScore]:
        """LlamaIndex's ``retrieve``; ``min_seq`` / ``deadline_ms`` override the configured
        ones for this call."""
        token = _CALL_OPTIONS.set((self, read_options(min_seq, deadline_ms)))
        try:
            return super().retrieve(str_or_query_bundle)
        finally:
            _CALL_OPTIONS.reset(token)

    async def aretrieve(self, str_or_query_bundle: QueryType, *, min_seq: int | None = None,
                        deadline_ms: float | None = None) -> list[NodeWithScore]:
        """``retrieve`` for asyncio apps."""
        token = _CALL_OPTIONS.set((self, read_options(min_seq, deadline_ms)))
        try:
            return await super().aretrieve(str_or_query_bundle)
        finally:
            _CALL_OPTIONS.reset(token)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return to_nodes(self.retriever.search(query_bundle.query_str, self.filters, self.k,
                                              **self._search_options("search")))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = await self.retriever.asearch(query_bundle.query_str, self.filters, self.k,
                                              **self._search_options("asearch"))
        return to_nodes(result)

    def _search_options(self, method: str) -> dict[str, Any]:
        """The configured search options (checked against the backend at construction), with
        those given to the running ``retrieve`` call of this retriever (a call of another
        retriever in the same context does not count), for the backend's ``method``."""
        call = _CALL_OPTIONS.get()
        if call is None or call[0] is not self:
            return self.search_options
        return check_options(self.retriever, (method,), {**self.search_options, **call[1]})
