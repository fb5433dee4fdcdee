"""Bodies of the console's own API (``/v1/console/*``); searches are ``SearchBody``'s."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from retrieval.compare import Comparison
from retrieval.console.sides import Side
from retrieval.models import SearchResult
from retrieval.service.schemas import SearchBody

MAX_GATE_QUERIES = 1000


class SideSearchBody(SearchBody):
    """``POST /v1/console/search``: a search on one side (another build, other ranking)."""

    side: Side = Field(default_factory=Side)


class CompareBody(SearchBody):
    """``POST /v1/console/compare``: the same search on two sides."""

    left: Side = Field(default_factory=Side)
    right: Side


class CompareResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    left: SearchResult
    right: SearchResult
    comparison: Comparison


class GateQuery(BaseModel):
    """One line of a query file: a canary (with optional expected ids), labeled when it has
    graded relevant ids (``retrieval.publishing.config``'s two files in one)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: str = Field(min_length=1)
    expected: list[str] = Field(default_factory=list)
    relevant: dict[str, int] = Field(default_factory=dict)


class GateBody(BaseModel):
    """``POST /v1/console/gate``: the publish gate's report of ``right`` against ``left``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    left: str | None = Field(None, description="build id; none: the live build")
    right: str = Field(description="the candidate build id")
    queries: list[GateQuery] = Field(min_length=1, max_length=MAX_GATE_QUERIES)
    thresholds: dict[str, Any] = Field(
        default_factory=dict, description="GateConfig thresholds (k, min_canary_overlap, "
        "max_ndcg_drop, ...); the rest are the gate's defaults")


class ConsoleBuild(BaseModel):
    model_config = ConfigDict(extra="forbid")

    build_id: str
    created_at: str
    documents: int
    encoder_id: str
    status: str = Field(description="live, rollback target or staged")
    serving: bool = Field(description="the build this server answers from")


class ConsoleSchema(BaseModel):
    """What the console builds its controls from: the serving build's fields and settings."""

    model_config = ConfigDict(extra="forbid")

    build_id: str
    rows: int = Field(description="documents, or passages in a passage build, with live writes")
    passages: bool = Field(description="rows are passages: group_by and context apply")
    fields: dict[str, dict[str, Any]] = Field(description="field -> kind, coverage, common "
                                              "values (keyword) or range (number, date)")
    ranking: dict[str, Any] = Field(description="the server's ranking settings")
    builds: list[ConsoleBuild]
