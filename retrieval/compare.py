"""Two rankings of one query side by side: overlap@k, what entered and left, rank moves.

The overlap is the publish gate's (``retrieval.publishing.quality.overlap_at_k``), so a
comparison in the console and a canary in the gate agree on the same two rankings. A hit is
named by its document, or by document and passage (``doc#passage``) when ungrouped passages
of a passage build are compared.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from retrieval.models import Hit, SearchResult
from retrieval.publishing.quality import overlap_at_k


class RankMove(BaseModel):
    """Where one hit stands in each ranking (1-based; None: not in that top k)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="doc id, or 'doc id#passage' for ungrouped passages")
    left: int | None
    right: int | None

    @property
    def delta(self) -> int | None:
        """Places gained on the right (positive: ranked higher there)."""
        return None if self.left is None or self.right is None else self.left - self.right


class Comparison(BaseModel):
    """How the right ranking differs from the left one at depth ``k``."""

    model_config = ConfigDict(extra="forbid")

    k: int
    by: Literal["document", "passage"] = Field(description="what a key names")
    overlap: float = Field(description="|top-k(left) ∩ top-k(right)| over the longer top k "
                           "(1.0: the same hits, however few), as the gate's")
    entered: list[str] = Field(description="in the right top k only, in its order")
    left_out: list[str] = Field(description="in the left top k only, in its order")
    moves: list[RankMove] = Field(description="every hit of either side, by its left rank")


def hit_key(hit: Hit, by: str) -> str:
    return hit.doc_id if by == "document" or hit.passage is None else \
        f"{hit.doc_id}#{hit.passage}"


def compare_results(left: SearchResult, right: SearchResult, k: int,
                    by: Literal["document", "passage"] = "document") -> Comparison:
    """``right`` against ``left``, over their first ``k`` hits; ``by="passage"`` tells
    passages of one document apart (ungrouped passage searches)."""
    a = [hit_key(h, by) for h in left.hits[:k]]
    b = [hit_key(h, by) for h in right.hits[:k]]
    rank_a = {key: i + 1 for i, key in enumerate(a)}
    rank_b = {key: i + 1 for i, key in enumerate(b)}
    order = a + [key for key in b if key not in rank_a]
    return Comparison(
        k=k, by=by, overlap=overlap_at_k(a, b, k),
        entered=[key for key in b if key not in rank_a],
        left_out=[key for key in a if key not in rank_b],
        moves=[RankMove(key=key, left=rank_a.get(key), right=rank_b.get(key)) for key in order])
