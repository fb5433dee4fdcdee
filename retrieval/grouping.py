"""Passages grouped by their document, and the passage fields of a hit.

In a passage build (``indexes.passages``) every row is a passage. ``group_by="document"``
collapses the fused candidates to the best passage of each document before top-k, so a result
holds at most one hit per document and ``k`` counts documents. Grouping looks at every
candidate, not only the top-k passages; when the candidates hold fewer than ``k`` documents
the dense leg is asked for ``k * max_per_document`` more rows, which always spans ``k``
documents when at least ``k`` are allowed (k - 1 documents have fewer passages than that).

``context=n`` adds to each hit the exact slice of its document covering the ``n`` passages on
each side of it: consecutive passages tile their document's text, so it is one slice.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from indexes.errors import InvalidQueryError, LimitExceededError
from retrieval.loaded_build import LoadedBuild
from retrieval.models import PassageContext

if TYPE_CHECKING:
    from retrieval.config import RetrieverConfig
    from retrieval.request import SearchRequest

GROUP_BY = ("document",)
MAX_CONTEXT = 5  # neighbouring passages on each side; a wider window is the whole document


def check_grouping(group_by: Any, context: Any) -> tuple[str | None, int]:
    """Validated ``group_by`` (None or "document") and ``context`` (0..MAX_CONTEXT)."""
    if group_by is not None and group_by not in GROUP_BY:
        raise InvalidQueryError(f"group_by must be None or one of {list(GROUP_BY)}, got "
                                f"{group_by!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise InvalidQueryError(f"context must be a non-negative integer (neighbouring "
                                f"passages on each side), got {context!r}")
    if context > MAX_CONTEXT:
        raise LimitExceededError(f"context={context} exceeds the limit {MAX_CONTEXT}; ask for "
                                 "fewer neighbouring passages")
    return group_by, context


def grouping_key(request: SearchRequest) -> str:
    """The part of a result-cache key grouping changes ("" when the search does not group)."""
    if request.group_by is None and not request.context:
        return ""
    return f":group={request.group_by}:context={request.context}"


def best_per_document(parents: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Indices of the best-scored entry of each distinct parent, best first.

    ``parents`` int (n,), ``scores`` float (n,); ties go to the earlier entry.
    """
    order = np.argsort(-scores, kind="stable")
    _, first = np.unique(parents[order], return_index=True)
    return order[np.sort(first)]


def group_candidates(
    snapshot: LoadedBuild, request: SearchRequest, query_vector: np.ndarray | None,
    mask: np.ndarray | None, rows: np.ndarray, bm25: np.ndarray, cosine: np.ndarray,
    fused: np.ndarray, config: RetrieverConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The candidates reduced to each document's best passage (rows, bm25, cosine, fused).

    Unsplit builds and ungrouped requests pass through: a row is already a document.
    """
    passages = snapshot.passages
    if request.group_by is None or passages is None:
        return rows, bm25, cosine, fused
    keep = best_per_document(np.asarray(passages.parent)[rows], fused)
    if keep.size < request.k and query_vector is not None:
        rows, bm25, cosine, fused = _widen(snapshot, request, query_vector, mask, rows, bm25,
                                           config)
        keep = best_per_document(np.asarray(passages.parent)[rows], fused)
    return rows[keep], bm25[keep], cosine[keep], fused[keep]


def _widen(
    snapshot: LoadedBuild, request: SearchRequest, query_vector: np.ndarray,
    mask: np.ndarray | None, rows: np.ndarray, bm25: np.ndarray, config: RetrieverConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidates plus the dense top ``k * max_per_document`` rows, re-scored and re-fused."""
    # Imported here: the pipeline imports this module for its grouping step.
    from retrieval.pipeline import add_dense, fuse

    info = snapshot.manifest.passages
    per_document = info.max_per_document if info is not None else 1
    wide = replace(request, k=min(request.k * per_document, snapshot.manifest.n_docs))
    rows, bm25 = add_dense(snapshot, wide, query_vector, mask, rows, bm25, config)
    cosine = snapshot.vectors.scores(query_vector, rows)
    return rows, bm25, cosine, fuse(bm25, cosine, config)


def passage_fields(snapshot: LoadedBuild, row: int, context: int) -> dict[str, Any]:
    """``Hit`` fields locating a passage in its document (empty for unsplit builds)."""
    passages = snapshot.passages
    if passages is None:
        return {}
    fields: dict[str, Any] = {"parent_id": snapshot.docs.doc_id(row),
                              "passage": int(passages.position[row]),
                              "start": int(passages.start[row]), "end": int(passages.end[row])}
    if context:
        fields["context"] = neighbourhood(snapshot, row, context)
    return fields


def neighbourhood(snapshot: LoadedBuild, row: int, context: int) -> PassageContext:
    """The slice of the document covering ``context`` passages on each side of ``row``."""
    passages = snapshot.passages
    assert passages is not None
    first, last = passages.neighbours(row, context)
    text = snapshot.docs.get(first).text
    covered = int(passages.end[first])
    for r in range(first + 1, last + 1):  # each passage starts at or before the last end
        text += snapshot.docs.get(r).text[covered - int(passages.start[r]):]
        covered = int(passages.end[r])
    return PassageContext(text=text, start=int(passages.start[first]), end=covered,
                          first_passage=int(passages.position[first]),
                          last_passage=int(passages.position[last]))
