"""The delta of a passage build: writes act on whole documents.

An upserted or deleted document retires ALL its base rows (a document's passages are
consecutive rows, so its parent ordinal gives the range), and an upserted document adds its
passages as delta rows with their parent, position and offsets, numbered after the base's
documents, so grouping by document, ``context=n`` and hydration read base and delta alike.
"""

from __future__ import annotations

import numpy as np

from indexes.docstore import Document
from indexes.passages import PassageInfo, PassageMap
from indexes.wal import Changes
from indexes.wal.split import passage_rows
from retrieval.loaded_build import LoadedBuild


def retire_documents(base: LoadedBuild, doc_ids: set[str]) -> np.ndarray:
    """bool (n_base,): rows of no document in ``doc_ids`` (every passage of each one)."""
    alive = np.ones(base.manifest.n_docs, dtype=bool)
    parents = None if base.passages is None else np.asarray(base.passages.parent)
    for doc_id in doc_ids:
        row = base.docs.row_of(doc_id)
        if row is None:
            continue
        if parents is None:
            alive[row] = False
        else:  # rows of one document are consecutive; parent ordinals ascend with the rows
            parent = parents[row]
            alive[np.searchsorted(parents, parent, "left"):
                  np.searchsorted(parents, parent, "right")] = False
    return alive


def delta_rows(base: LoadedBuild, changes: Changes) -> tuple[list[Document], np.ndarray]:
    """The delta's rows (upserted documents, or their passages) and their vectors."""
    dim = base.vectors.dim
    upserted = list(changes.upserts.items())
    if not upserted:
        return [], np.zeros((0, dim), dtype=np.float32)
    if base.passages is None:
        return ([doc for _, (doc, _) in upserted],
                np.stack([v for _, (_, v) in upserted]).astype(np.float32))
    rows = [row for doc_id, (doc, _) in upserted
            for row in passage_rows(doc, changes.spans[doc_id])]
    vectors = np.concatenate([np.asarray(v, np.float32).reshape(-1, dim)
                              for _, (_, v) in upserted])
    return rows, vectors


def live_passages(base: LoadedBuild, alive: np.ndarray, changes: Changes
                  ) -> tuple[PassageMap, PassageInfo] | None:
    """The passage map over base + delta rows, and the manifest's passage figures of the
    live corpus (``max_per_document`` bounds grouping's widening)."""
    if base.passages is None or base.manifest.passages is None:
        return None
    info = base.manifest.passages
    spans = [changes.spans[doc_id] for doc_id in changes.upserts]
    counts = np.array([len(s) for s in spans], dtype=np.int64)
    flat = np.array([span for s in spans for span in s], dtype=np.int64).reshape(-1, 2)
    passages = base.passages
    live_map = PassageMap(
        np.concatenate([passages.parent, np.repeat(
            np.arange(len(spans), dtype=np.int32) + info.n_documents, counts)]).astype(np.int32),
        np.concatenate([passages.position, np.concatenate(
            [np.arange(n, dtype=np.int32) for n in counts] or [np.empty(0, np.int32)])]
        ).astype(np.int32),
        np.concatenate([passages.start, flat[:, 0]]).astype(np.int64),
        np.concatenate([passages.end, flat[:, 1]]).astype(np.int64))
    retired = np.unique(np.asarray(passages.parent)[~alive]).size
    live_info = info.model_copy(update={
        "n_documents": info.n_documents - retired + len(spans),
        "n_passages": int(alive.sum()) + int(counts.sum()),
        "max_per_document": max(info.max_per_document, int(counts.max(initial=0)))})
    return live_map, live_info
