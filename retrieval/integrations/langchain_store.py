"""A LangChain ``VectorStore`` over an index root: ``RetrievalVectorStore("idx", embeddings)``.

It keeps LangChain's vector-store contract: it can start empty (the first ``add_texts``
builds the root, later ones go through the write-ahead log, so every write is durable and
searchable when the call returns), takes any LangChain ``Embeddings`` or the bundled encoder
by default, and offers ``add_texts`` / ``add_documents`` (an id given again replaces its
document; ids are generated when none are given), ``delete``, ``get_by_ids``,
``similarity_search(_with_score)``, ``max_marginal_relevance_search`` and ``as_retriever``
with every ``search_type`` (sync; async through LangChain's executor defaults). Searches are
the engine's hybrid search (BM25 candidates re-ranked by vectors, exact filters: ``filter=``
takes the library's dict or DSL filters); a hit's score is its vector (cosine) similarity,
its relevance score that similarity clipped to [0, 1].
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexes.build import build_index
from indexes.docstore import Document as StoredDocument
from indexes.encoders import Encoder, SentenceTransformerEncoder
from indexes.manifest import EncoderInfo, current_build_dir
from indexes.writer import IndexWriter
from retrieval.errors import InvalidQueryError
from retrieval.integrations.errors import MissingExtraError
from retrieval.models import SearchResult
from retrieval.retriever import Retriever

try:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import VectorStore
    from langchain_core.vectorstores.utils import maximal_marginal_relevance
except ImportError as exc:
    raise MissingExtraError("langchain", "langchain-core") from exc

__all__ = ["EmbeddingsEncoder", "RetrievalVectorStore"]


class EmbeddingsEncoder:
    """A LangChain ``Embeddings`` as the library's ``Encoder`` (rows L2-normalized, as the
    engine's cosine scores expect); its id names the class, so a root built with one model is
    not searched with another."""

    def __init__(self, embeddings: Embeddings) -> None:
        self.embeddings = embeddings
        self.model = type(embeddings).__name__
        self.encoder_id = f"langchain/{self.model}"
        self.dim = len(embeddings.embed_query("dimension probe"))

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        return _unit(np.asarray(self.embeddings.embed_documents(list(texts)), np.float32))

    def encode_query(self, text: str) -> np.ndarray:
        return _unit(np.asarray([self.embeddings.embed_query(text)], np.float32))[0]


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1.0, norms)


class RetrievalVectorStore(VectorStore):
    """LangChain's ``VectorStore`` over the index root ``root`` (created on the first write)."""

    def __init__(self, root: str | Path, embedding: Embeddings | None = None, *,
                 config: dict[str, Any] | None = None) -> None:
        self.root = Path(root)
        self._embedding = embedding
        self._encoder: Encoder | None = EmbeddingsEncoder(embedding) if embedding else None
        self._config = dict(config or {})
        self._lock = threading.Lock()
        self._retriever: Retriever | None = None
        self._writer: IndexWriter | None = None
        if current_build_dir(self.root) is not None:
            self._open()

    @property
    def embeddings(self) -> Embeddings | None:
        return self._embedding

    def _open(self) -> None:
        self._retriever = Retriever.load(self.root, self._config, encoder=self._query_encoder())
        self._writer = IndexWriter(self.root, encoder=self._encoder)

    def _query_encoder(self) -> Encoder | None:
        """The given embeddings' adapter; None: the build's own (the bundled model's)."""
        return self._encoder

    def close(self) -> None:
        with self._lock:
            if self._retriever is not None:
                self._retriever.close()
            if self._writer is not None:
                self._writer.close()
            self._retriever = self._writer = None

    # -- writes -------------------------------------------------------------------------------

    def add_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None,
                  *, ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        """Upsert the texts (one durable write), searchable when this returns."""
        texts = list(texts)
        ids = [i or uuid.uuid4().hex for i in (ids or [None] * len(texts))]  # type: ignore[list-item]
        metadatas = metadatas or [{} for _ in texts]
        docs = [StoredDocument(id=str(i), text=t, metadata=dict(m))
                for i, t, m in zip(ids, texts, metadatas, strict=True)]
        with self._lock:
            if self._writer is None:  # an empty store: its first write is the first build
                self._first_build(docs)
                return ids
            seq = self._writer.upsert(docs)
            retriever = self._retriever
        assert retriever is not None
        retriever.wait_for_seq(seq)
        return ids

    def _first_build(self, docs: list[StoredDocument]) -> None:
        encoder = self._encoder or SentenceTransformerEncoder()
        if self._encoder is None:
            build_index(docs, self.root, encoder=encoder, progress=False)
        else:
            info = EncoderInfo(encoder_id=encoder.encoder_id, model=encoder.model,
                               dim=encoder.dim, vector_dtype="float32")
            build_index(docs, self.root, vectors=encoder.encode([d.content for d in docs]),
                        encoder_info=info, progress=False)
        self._open()

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete by id (absent ids are no-ops); True once durable and served."""
        if not ids:
            return False
        with self._lock:
            if self._writer is None:
                return False
            seq = self._writer.delete(list(ids))
            retriever = self._retriever
        assert retriever is not None
        retriever.wait_for_seq(seq)
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in that order; absent ids are left out."""
        retriever = self._retriever
        if retriever is None:
            return []
        return [Document(id=d.id, page_content=d.text, metadata=d.metadata)
                for d in retriever.get_documents(list(ids)) if d is not None]

    # -- searches -----------------------------------------------------------------------------

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4,  # type: ignore[override]
                                     filter: Any = None, **kwargs: Any
                                     ) -> list[tuple[Document, float]]:
        result = self._search(query, k, the_filter(filter, kwargs))
        return [(_document(hit), float(hit.vector_score)) for hit in result.hits]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda similarity: max(0.0, min(1.0, similarity))

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                      lambda_mult: float = 0.5, filter: Any = None,
                                      **kwargs: Any) -> list[Document]:
        """The engine's top ``fetch_k`` for the query, then LangChain's MMR over their
        stored vectors: ``k`` relevant and mutually different documents."""
        retriever = self._retriever
        if retriever is None:
            return []
        vector = self._query_vector(query)
        result = retriever.search(query, the_filter(filter, kwargs), fetch_k,
                                  query_vector=vector)
        if not result.hits:
            return []
        snapshot = retriever.snapshot
        assert snapshot.metadata.ids is not None
        rows = [snapshot.metadata.ids.rows(hit.doc_id)[0] for hit in result.hits]
        stored = snapshot.vectors.reconstruct_rows(np.asarray(rows, dtype=np.int64))
        query_row = vector if vector is not None else stored[0]
        chosen = maximal_marginal_relevance(np.asarray(query_row), stored.tolist(),
                                            lambda_mult=lambda_mult, k=k)
        return [_document(result.hits[i]) for i in chosen]

    def _search(self, query: str, k: int, filters: Any) -> SearchResult:
        retriever = self._retriever
        if retriever is None:  # an empty store finds nothing
            return SearchResult(query=query, hits=[], timings={}, build_id="")
        return retriever.search(query, filters, k, query_vector=self._query_vector(query))

    def _query_vector(self, query: str) -> np.ndarray | None:
        encoder = self._encoder
        return encoder.encode_query(query) if isinstance(encoder, EmbeddingsEncoder) else None

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings,  # type: ignore[override]
                   metadatas: list[dict[str, Any]] | None = None, *,
                   ids: list[str] | None = None, root: str | Path | None = None,
                   **kwargs: Any) -> RetrievalVectorStore:
        """A store at ``root`` (required) holding ``texts``."""
        if root is None:
            raise TypeError("RetrievalVectorStore.from_texts needs root=: the index root to "
                            "create")
        store = cls(root, embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store


def _document(hit: Any) -> Document:
    return Document(id=hit.doc_id, page_content=hit.text, metadata=dict(hit.metadata))


def the_filter(filter: Any, options: dict[str, Any]) -> Any:
    """The filter of a search (``filter``, LangChain's name, or ``filters``, this library's);
    any other option is refused: one silently dropped could be a filter that matched all."""
    if "filters" in options:
        if filter is not None:
            raise InvalidQueryError("give the filter once: filter= or filters=, not both")
        filter = options.pop("filters")
    if options:
        raise InvalidQueryError(f"unknown search options {sorted(options)}: this vector store "
                                "takes filter= (a filter object or DSL string) and k")
    return filter
