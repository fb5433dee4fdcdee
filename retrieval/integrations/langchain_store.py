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

Documents come back one per id: ``page_content`` is the text that was added, the metadata is
the document's own plus ``title`` when it has one (a root built from a corpus with titles).
In a passage build a search returns each document once, as its best passage (the metadata
adds ``parent_id``, ``passage``, ``start``, ``end``); ``get_by_ids`` returns whole documents.
A search result's metadata also carries the result's ``degraded`` / ``warnings`` when it has
them. Like other LangChain vector stores it takes any metadata keys: the root is built with
``allow_new_fields``, so a later document may add a key (a key's type stays the one it
first had: a number field refuses a string with ``SchemaMismatchError``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from indexes.build import BuildConfig, build_index
from indexes.docstore import Document as StoredDocument
from indexes.encoders import Encoder, SentenceTransformerEncoder
from indexes.manifest import EncoderInfo, current_build_dir
from indexes.writer import IndexWriter
from retrieval.errors import InvalidQueryError
from retrieval.integrations.backend import passage_location, result_notes
from retrieval.integrations.errors import IntegrationError, MissingExtraError
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Hit, SearchResult
from retrieval.retriever import Retriever

try:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import VectorStore
    from langchain_core.vectorstores.utils import maximal_marginal_relevance
except ImportError as exc:
    raise MissingExtraError("langchain", "langchain-core") from exc

__all__ = ["EmbeddingsEncoder", "RetrievalVectorStore"]

# A store takes any metadata keys, as LangChain's vector stores do (see the module's doc).
_BUILD = BuildConfig(allow_new_fields=True)
# Searches of MMR before it settles for a snapshot newer than its hits (see _hits_and_rows).
_MMR_TRIES = 3


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
        """Upsert the texts (one durable write), searchable when this returns; no texts:
        nothing to write, no ids."""
        texts = list(texts)
        if not texts:
            return []
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
            build_index(docs, self.root, encoder=encoder, config=_BUILD, progress=False)
        else:
            info = EncoderInfo(encoder_id=encoder.encoder_id, model=encoder.model,
                               dim=encoder.dim, vector_dtype="float32")
            build_index(docs, self.root, vectors=encoder.encode([d.content for d in docs]),
                        encoder_info=info, config=_BUILD, progress=False)
        self._open()

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete by id (absent ids are no-ops); True once durable and served."""
        if not ids:
            return False
        with self._lock:
            if self._writer is None:
                return False
            seq = self._writer.delete(ids)  # a string is refused, not read as its characters
            retriever = self._retriever
        assert retriever is not None
        retriever.wait_for_seq(seq)
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids, in that order (whole documents, also in a passage
        build); absent ids are left out."""
        retriever = self._retriever
        if retriever is None:
            return []
        return [Document(id=d.id, page_content=d.text, metadata=_own_metadata(d.metadata, d.title))
                for d in retriever.get_documents(list(ids)) if d is not None]

    # -- searches -----------------------------------------------------------------------------

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4,  # type: ignore[override]
                                     filter: Any = None, **kwargs: Any
                                     ) -> list[tuple[Document, float]]:
        result = self._search(query, k, the_filter(filter, kwargs))
        notes = result_notes(result)
        return [(_document(hit, notes), float(hit.vector_score)) for hit in result.hits]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        return lambda similarity: max(0.0, min(1.0, similarity))

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                      lambda_mult: float = 0.5, filter: Any = None,
                                      **kwargs: Any) -> list[Document]:
        """The engine's top ``fetch_k`` for the query, then LangChain's MMR over their
        stored vectors (each passage's own in a passage build) against the query's vector:
        ``k`` relevant and mutually different documents."""
        retriever = self._retriever
        if retriever is None:
            return []
        filters = the_filter(filter, kwargs)
        vector = self._mmr_query_vector(retriever, query)
        result, hits, rows = _hits_and_rows(retriever, query, filters, fetch_k, vector,
                                            self._grouping(retriever))
        if not hits:
            return []
        chosen = maximal_marginal_relevance(vector, rows.tolist(), lambda_mult=lambda_mult, k=k)
        notes = result_notes(result)
        return [_document(hits[i], notes) for i in chosen]

    def _search(self, query: str, k: int, filters: Any) -> SearchResult:
        retriever = self._retriever
        if retriever is None:  # an empty store finds nothing
            return SearchResult(query=query, hits=[], timings={}, build_id="")
        return retriever.search(query, filters, k, query_vector=self._query_vector(query),
                                **self._grouping(retriever))

    @staticmethod
    def _grouping(retriever: Retriever) -> dict[str, Any]:
        """In a passage build, one hit per document (its best passage): a store's documents
        are what was added, one per id."""
        return {"group_by": "document"} if retriever.snapshot.passages is not None else {}

    def _query_vector(self, query: str) -> np.ndarray | None:
        """The given embeddings' query vector; None: the engine encodes (and caches) it."""
        encoder = self._encoder
        return encoder.encode_query(query) if isinstance(encoder, EmbeddingsEncoder) else None

    def _mmr_query_vector(self, retriever: Retriever, query: str) -> np.ndarray:
        """The query's vector for MMR to compare with the hits' stored vectors: the given
        embeddings', else the retriever's encoder's (the one the engine ranks with)."""
        vector = self._query_vector(query)
        if vector is not None:
            return vector
        if retriever.encoder is None:
            raise IntegrationError(
                f"max_marginal_relevance_search needs the query's vector and the root "
                f"{self.root} has no encoder this store can use (built with "
                f"{retriever.snapshot.manifest.encoder.encoder_id!r}); open the store with the "
                "LangChain Embeddings it was built with: RetrievalVectorStore(root, embeddings)")
        return np.asarray(retriever.encoder.encode([query])[0], dtype=np.float32)

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


def _hits_and_rows(retriever: Retriever, query: str, filters: Any, k: int,
                   vector: np.ndarray, grouping: dict[str, Any]
                   ) -> tuple[SearchResult, list[Hit], np.ndarray]:
    """The search's result, its hits that still have a row, and those rows' stored vectors.

    The rows are read from the snapshot the hits came from (the same build id, "+seq" of the
    live writes included), so a hit is never paired with another version of its document: a
    write applied between the search and the read means searching again. Under writes that
    keep coming, the last try uses the newer snapshot and leaves out hits it no longer has.
    """
    for _ in range(_MMR_TRIES):
        result = retriever.search(query, filters, k, query_vector=vector, **grouping)
        snapshot = retriever.snapshot
        if snapshot.build_id == result.build_id:
            break
    found = [(hit, row) for hit in result.hits if (row := _row_of(snapshot, hit)) is not None]
    if not found:  # every hit gone meanwhile
        return result, [], np.empty((0, snapshot.vectors.dim), np.float32)
    rows = np.asarray([row for _, row in found], dtype=np.int64)
    return result, [hit for hit, _ in found], snapshot.vectors.reconstruct_rows(rows)


def _row_of(snapshot: LoadedBuild, hit: Hit) -> int | None:
    """The hit's row in ``snapshot``: its document's, or in a passage build its passage's;
    None when the snapshot no longer holds it."""
    assert snapshot.metadata.ids is not None  # set by every LoadedBuild
    rows = snapshot.metadata.ids.rows(hit.doc_id)
    if snapshot.passages is None or hit.passage is None:
        return int(rows[0]) if len(rows) else None
    position = snapshot.passages.position
    return next((int(row) for row in rows if position[row] == hit.passage), None)


def _document(hit: Hit, notes: dict[str, list[str]]) -> Document:
    """A search hit as the store's document: its text (the passage's, in a passage build)
    under its document's id, its own metadata plus where the passage sits and the result's
    notes (``result_notes``)."""
    metadata = {**_own_metadata(hit.metadata, hit.title), **passage_location(hit)}
    metadata.update({key: list(values) for key, values in notes.items()})
    return Document(id=hit.doc_id, page_content=hit.text, metadata=metadata)


def _own_metadata(metadata: dict[str, Any], title: str) -> dict[str, Any]:
    """A document's metadata with its title under ``title`` when it has one; a metadata
    field of that name is the caller's own and is kept."""
    return {"title": title, **metadata} if title else dict(metadata)


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
