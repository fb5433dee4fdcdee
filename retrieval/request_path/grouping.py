"""Passages grouped by their document, and the passage fields of a hit.

In a passage build (``indexes.passages``) every row is a passage. ``group_by="document"``
collapses the fused candidates to the best passage of each document before top-k, so a result
holds at most one hit per document and ``k`` counts documents. Grouping looks at every
candidate, not only the top-k passages; when the candidates hold fewer than ``k`` documents
the dense leg is asked for ``k * max_per_document`` more rows, which always spans ``k``
documents when at least ``k`` are allowed (k - 1 documents have fewer passages than that).
Without the dense leg (the ``keyword`` candidate policy, or a degraded search without its query
vector) BM25's top ``k * max_per_document`` rows are taken instead: k documents then come back
when k documents share a term with the query.

``context=n`` adds to each hit the exact slice of its document covering the ``n`` passages on
each side of it: consecutive passages tile their document's text, so it is one slice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from indexes.errors import InvalidQueryError, LimitExceededError
from retrieval.loaded_build import LoadedBuild
from retrieval.models import PassageContext

if TYPE_CHECKING:
    from retrieval.request_path.validate import SearchRequest

GROUP_BY = ("document",)
MAX_CONTEXT = 5  # neighbouring passages on each side; a wider window is the whole document


def check_grouping(group_by: Any, context: Any) -> tuple[str | None, int]:
    """Validated ``group_by`` (None or "document") and ``context`` (0..MAX_CONTEXT)."""
    if group_by is not None and group_by not in GROUP_BY:
        raise InvalidQueryError(f"group_by must be None or one of {list(GROUP_BY)}, got "
                                f"{group_by!r}")
    if isinstance(context, np.integer):  # a computed count, as k takes one
        context = int(context)
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


Scored = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # rows, bm25, cosine, fused


def group_candidates(snapshot: LoadedBuild, request: SearchRequest, scored: Scored,
                     widen: Callable[[int], Scored]) -> tuple[Scored, Scored, np.ndarray | None]:
    """(the candidates reduced to each document's best passage, every candidate scored,
    the positions of the first among the second or None when nothing was reduced). The
    second is what fusion normalized over: an explanation's ranks and bounds come from it.

    ``widen(n)``: the candidates plus ``n`` more rows, re-scored (the pipeline's stages).
    Unsplit builds and ungrouped requests pass through: a row is already a document.
    """
    passages = snapshot.passages
    if request.group_by is None or passages is None:
        return scored, scored, None
    keep = best_per_document(np.asarray(passages.parent)[scored[0]], scored[3])
    if keep.size < request.k:
        info = snapshot.manifest.passages
        per_document = info.max_per_document if info is not None else 1
        scored = widen(min(request.k * per_document, snapshot.manifest.n_docs))
        keep = best_per_document(np.asarray(passages.parent)[scored[0]], scored[3])
    rows, bm25, cosine, fused = scored
    return (rows[keep], bm25[keep], cosine[keep], fused[keep]), scored, keep


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
