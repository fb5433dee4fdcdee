"""The console's page and its API: the serving build's schema and builds, a search on one
side, a comparison of two sides, and the publish gate over a query file.

No ranking happens here: a side is a ``Retriever`` (``retrieval.console.sides``), a comparison
is ``retrieval.compare`` on their results and the gate is ``compare_builds``, the same call
``retrieval publish`` makes. The page itself is static files shipped in the package.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from indexes.errors import RetrievalError
from indexes.field_summary import summarize_fields
from indexes.publish import list_builds
from retrieval.compare import compare_results
from retrieval.console.schemas import (
    CompareBody,
    CompareResult,
    ConsoleBuild,
    ConsoleSchema,
    GateBody,
    SideSearchBody,
)
from retrieval.console.sides import Sides
from retrieval.errors import closest
from retrieval.loaded_build import LoadedBuild
from retrieval.models import SearchResult
from retrieval.publishing.config import Canary, GateConfig, LabeledQuery
from retrieval.publishing.gate import SearchInputs, compare_builds
from retrieval.result_json import result_json
from retrieval.retriever import RANKING_SETTINGS, Retriever
from retrieval.service.admission import Admission
from retrieval.service.bodies import JSON, json_response, parse_body
from retrieval.service.errors import NotFoundError, RequestFieldError
from retrieval.service.schemas import SearchBody
from retrieval.service.state import ServiceState

ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
TOP_VALUES = 20  # common values offered per keyword field
GATE_FILES = {"canaries", "labeled_log"}  # GateConfig's files: a request sends queries instead
# The page loads nothing but its own files and talks to this origin only.
PAGE_HEADERS = {"content-security-policy": "default-src 'self'; img-src 'self' data:",
                "x-content-type-options": "nosniff", "cache-control": "no-cache"}


def console_routes(state: ServiceState, sides: Sides, admission: Admission) -> list[Route]:
    page = _asset("index.html")
    summaries = FieldSummaries()

    async def console(_: Request) -> Response:
        return Response(page, media_type="text/html", headers=PAGE_HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            raise NotFoundError(f"no console file {name!r}; the console serves /console and "
                                f"{', '.join(f'/console/{n}' for n in ASSETS)}")
        return Response(_asset(name), media_type=ASSETS[name], headers=PAGE_HEADERS)

    async def schema(_: Request) -> Response:
        # In a worker thread, admitted like a search: summarizing an id-like field of 100k
        # documents took 86-252 ms on the event loop, which answered nothing meanwhile.
        with admission.admit():
            serving = state.retriever()
            described = await asyncio.to_thread(describe_console, serving, sides.root,
                                                summaries)
        return json_response(described)

    async def side_search(request: Request) -> Response:
        with admission.admit():
            body = await parse_body(request, SideSearchBody)
            serving = state.retriever()
            await _wait_for_writes(serving, body.min_seq)
            async with sides.alease(serving, body.side) as retriever:
                result = await _search(retriever, body)
        return Response(result_json(result), media_type=JSON)

    async def compare(request: Request) -> Response:
        with admission.admit():
            body = await parse_body(request, CompareBody)
            serving = state.retriever()
            await _wait_for_writes(serving, body.min_seq)
            async with (sides.alease(serving, body.left) as left,
                        sides.alease(serving, body.right) as right):
                results = await asyncio.gather(_search(left, body), _search(right, body))
        k = body.k or serving.config.default_k
        passages = any(r.hits and r.hits[0].passage is not None for r in results)
        by: Literal["document", "passage"] = (
            "passage" if passages and body.group_by != "document" else "document")
        return json_response(CompareResult(left=results[0], right=results[1],
                                           comparison=compare_results(*results, k, by)))

    async def gate(request: Request) -> Response:
        with admission.admit():
            body = await parse_body(request, GateBody)
            gate, inputs = _gate_config(body), _gate_inputs(body)
            serving = state.retriever()
            report = await asyncio.to_thread(
                compare_builds, sides.build_path(body.left), sides.build_path(body.right),
                gate, encoder=serving.encoder, config=serving.config, inputs=inputs)
        return Response(report.model_dump_json(), media_type=JSON)

    return [Route("/console", console), Route("/console/{name}", asset),
            Route("/v1/console/schema", schema),
            Route("/v1/console/search", side_search, methods=["POST"]),
            Route("/v1/console/compare", compare, methods=["POST"]),
            Route("/v1/console/gate", gate, methods=["POST"])]


class FieldSummaries:
    """The fields' summaries of the last snapshot described, reused while it serves: a
    snapshot never changes (a live write makes a new one), and summarizing reads every keyword
    value and posting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one computes, a concurrent call waits and reuses it
        self._snapshot: weakref.ref[LoadedBuild] | None = None  # not kept alive by this
        self._fields: dict[str, dict[str, Any]] = {}

    def of(self, snapshot: LoadedBuild) -> dict[str, dict[str, Any]]:
        with self._lock:
            if self._snapshot is None or self._snapshot() is not snapshot:
                self._fields = {f.name: f.as_dict()
                                for f in summarize_fields(snapshot.metadata, TOP_VALUES)}
                self._snapshot = weakref.ref(snapshot)
            return self._fields


def describe_console(serving: Retriever, root: Path,
                     summaries: FieldSummaries | None = None) -> ConsoleSchema:
    """What ``GET /v1/console/schema`` answers; it reads the index (run it in a thread)."""
    snapshot = serving.snapshot
    builds = [ConsoleBuild(build_id=b.build_id, created_at=b.created_at, documents=b.n_docs,
                           encoder_id=b.encoder_id, status=b.status,
                           serving=b.build_id == serving.build_id)
              for b in list_builds(root)]
    config = serving.config
    return ConsoleSchema(
        # The live manifest's count, as /v1/index's: the doc store also holds the rows that
        # live writes retired (deleted or replaced) until the next compaction.
        build_id=serving.build_id, rows=snapshot.manifest.n_docs,
        passages=snapshot.manifest.passages is not None,
        fields=(summaries or FieldSummaries()).of(snapshot),
        ranking={name: getattr(config, name) for name in RANKING_SETTINGS}
        | {"default_k": config.default_k},
        builds=builds)


async def _wait_for_writes(serving: Retriever, min_seq: int | None) -> None:
    """Serve the writes up to ``min_seq`` before the sides are chosen, so a side over the
    serving build (a ``with_ranking`` variant of its snapshot included) reads them.

    A variant follows no log: it holds the writes of the snapshot it was made over, so a
    ``min_seq`` past those would fail (409) on it. The serving retriever follows the log;
    ``_search`` then passes no ``min_seq`` (another build of the root holds no live writes to
    wait for)."""
    if min_seq is not None:
        await asyncio.to_thread(serving.wait_for_seq, min_seq)


async def _search(retriever: Retriever, body: SearchBody) -> SearchResult:
    return await retriever.asearch(body.query, body.filters, body.k, candidates=body.candidates,
                                   deadline_ms=body.deadline_ms, group_by=body.group_by,
                                   context=body.context or 0, explain=body.explain,
                                   min_score=body.min_score)


def _gate_config(body: GateBody) -> GateConfig:
    files_named = sorted(GATE_FILES & set(body.thresholds))
    if files_named:
        raise RequestFieldError(f"thresholds cannot name {', '.join(files_named)}: the "
                                "queries come in the body")
    try:
        return GateConfig.model_validate(body.thresholds)
    except ValidationError as exc:
        raise RequestFieldError(f"invalid gate thresholds: {_threshold_problems(exc)}"
                                ) from None


def _threshold_problems(exc: ValidationError) -> str:
    """One line naming each bad threshold (``thresholds.k: ...``): pydantic's own text spans
    lines and ends in a link to its docs, which a page cannot show well."""
    parts: list[str] = []
    for item in exc.errors(include_url=False):
        field = ".".join(["thresholds", *(str(p) for p in item["loc"])])
        if item["type"] == "extra_forbidden":
            name = str(item["loc"][-1])
            thresholds = sorted(set(GateConfig.model_fields) - GATE_FILES)
            parts.append(f"unknown threshold {field!r}{closest(name, thresholds)}")
        else:
            parts.append(f"{field}: {item['msg']} (got {repr(item.get('input'))[:80]})")
    return "; ".join(parts)


def _gate_inputs(body: GateBody) -> SearchInputs:
    return SearchInputs(
        canaries=[Canary(query=q.query, expected=q.expected) for q in body.queries],
        labeled=[LabeledQuery(query=q.query, relevant=q.relevant) for q in body.queries
                 if q.relevant])


def _asset(name: str) -> bytes:
    try:
        return (files("retrieval.console") / "assets" / name).read_bytes()
    except FileNotFoundError:
        raise RetrievalError(f"the console's {name} is missing from the installed package; "
                             "reinstall retrieval") from None
