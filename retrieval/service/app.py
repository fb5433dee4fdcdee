"""The ASGI app: one ``Retriever`` per worker behind FastAPI; no search logic of its own.

Search bodies are validated by strict pydantic models (unknown fields and wrong types are
422), results are the library's ``SearchResult`` serialized once by pydantic (the endpoint
returns the bytes, so FastAPI does not validate the result a second time), and every error is
``{"error": {"type", "message"}}`` with the status from ``retrieval.service.errors``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from indexes.errors import LimitExceededError, RetrievalError
from retrieval.models import SearchResult
from retrieval.service.auth import ApiKeys, load_api_keys
from retrieval.service.cli import SPEC_ENV
from retrieval.service.errors import (
    MalformedRequestError,
    NotFoundError,
    RequestFieldError,
    ServerError,
    ServiceUnavailableError,
    error_body,
    status_for,
)
from retrieval.service.guard import Guard
from retrieval.service.metrics import ServiceMetrics
from retrieval.service.schemas import (
    BatchBody,
    BatchResult,
    ErrorBody,
    Health,
    IndexInfo,
    SearchBody,
)
from retrieval.service.settings import ServeConfig
from retrieval.service.state import Loader, ServiceState, describe_index

log = logging.getLogger("retrieval.service")
JSON = "application/json"
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (400, 401, 413, 422, 503)}
METRICS_SYNC_SECONDS = 1.0


def create_app(index_root: str | Path, config: ServeConfig, *, keys: ApiKeys | None = None,
               loader: Loader | None = None) -> FastAPI:
    """The service for ``index_root``; the build loads in the background once it starts."""
    settings = config.server
    state = ServiceState(Path(index_root), config.retriever, loader)
    metrics = ServiceMetrics()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.start_loading()
        state.install_drain_handler(settings.drain_seconds)
        syncing = asyncio.create_task(_sync_metrics(state, metrics))
        try:
            yield
        finally:
            syncing.cancel()
            with suppress(asyncio.CancelledError):
                await syncing
            await asyncio.to_thread(state.close)
            metrics.process_exited()

    app = FastAPI(title="retrieval", version="1", lifespan=lifespan,
                  description="Hybrid BM25 + vector retrieval over a memory-mapped build.")
    app.state.service = state
    _add_error_handlers(app)
    _add_search_routes(app, state, metrics, config)
    _add_operator_routes(app, state, metrics)
    app.add_middleware(Guard, keys=keys if keys is not None else load_api_keys(settings),
                       metrics=metrics, max_body_bytes=settings.max_body_bytes,
                       metrics_auth=settings.metrics_auth)
    return app


def app_from_env() -> FastAPI:
    """uvicorn's factory in each worker process (``retrieval serve`` sets the spec)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = json.loads(os.environ[SPEC_ENV])
    return create_app(spec["index_root"], ServeConfig.model_validate(spec["config"]))


def _json(model: Any, status: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code=status, media_type=JSON)


def _add_search_routes(app: FastAPI, state: ServiceState, metrics: ServiceMetrics,
                       config: ServeConfig) -> None:
    settings = config.server

    @app.post("/v1/search", response_model=SearchResult, responses=ERRORS)
    async def search(body: SearchBody) -> Response:
        """``Retriever.search``: the best k passages, every score, stage timings, build id."""
        result = await state.retriever().asearch(body.query, body.filters, body.k,
                                                 candidates=body.candidates)
        metrics.observe_result(result)
        if settings.log_query_text:
            log.info("search %r: %d hits, %.3f ms", body.query, len(result.hits),
                     result.timings.get("total", 0.0))
        return _json(result)

    @app.post("/v1/search/batch", response_model=BatchResult, responses=ERRORS)
    async def search_batch(body: BatchBody) -> Response:
        """``Retriever.search_batch``: many queries, same filters, one encoder call."""
        if len(body.queries) > settings.max_batch_queries:
            raise LimitExceededError(
                f"batch has {len(body.queries)} queries, more than the limit "
                f"{settings.max_batch_queries}; split it or raise server.max_batch_queries")
        results = await state.retriever().asearch_batch(body.queries, body.filters, body.k,
                                                        candidates=body.candidates)
        for result in results:
            metrics.observe_result(result)
        payload = ",".join(r.model_dump_json() for r in results)
        return Response('{"results":[' + payload + "]}", media_type=JSON)


def _add_operator_routes(app: FastAPI, state: ServiceState, metrics: ServiceMetrics) -> None:
    @app.get("/v1/index", response_model=IndexInfo, responses=ERRORS)
    async def index_info() -> IndexInfo:
        """The live build: id, documents, creation time, encoder, metadata fields."""
        return IndexInfo(**describe_index(state.retriever()))

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        """The process is alive (it may still be loading)."""
        return Health(status="alive")

    @app.get("/readyz", response_model=Health, responses={503: {"model": ErrorBody}})
    async def readyz() -> Response:
        """200 once a verified build is loaded and the encoder warmed; 503 while loading or
        draining."""
        ready, reason = state.readiness()
        if not ready:
            return JSONResponse(error_body(ServiceUnavailableError(reason)), status_code=503)
        return _json(Health(status="ready", build_id=state.retriever().build_id))

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus text format, merged over all worker processes."""
        _sync_once(state, metrics)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _sync_once(state: ServiceState, metrics: ServiceMetrics) -> None:
    metrics.ready_workers.set(1.0 if state.ready else 0.0)
    if state.ready or state.draining.is_set():
        with suppress(ServiceUnavailableError):
            retriever = state.retriever()
            metrics.sync(retriever.stats(), retriever.reload_events)


async def _sync_metrics(state: ServiceState, metrics: ServiceMetrics) -> None:
    """Counters only the retriever knows (cache errors, breaker, reloads, build id)."""
    while True:
        try:
            _sync_once(state, metrics)
        except Exception:  # noqa: BLE001 (metrics must never take the worker down)
            log.exception("metrics sync failed")
        await asyncio.sleep(METRICS_SYNC_SECONDS)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RetrievalError)
    async def retrieval_error(_: Request, exc: RetrievalError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=status_for(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        error = describe_validation(exc.errors())
        return JSONResponse(error_body(error), status_code=status_for(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            error: RetrievalError = NotFoundError(
                f"no route {request.method} {request.url.path}; see /openapi.json for the API")
        else:
            error = ServerError(str(exc.detail))
        return JSONResponse(error_body(error), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error serving a request", exc_info=exc)
        return JSONResponse(error_body(ServerError("internal error; the server log has the "
                                                   "details")), status_code=500)


def describe_validation(errors: Any) -> RetrievalError:
    """One clear message for pydantic's list: bad JSON is 400, anything else about fields 422."""
    for item in errors:
        if item.get("type") == "json_invalid":
            where = item.get("ctx", {}).get("error", "")
            return MalformedRequestError(f"request body is not valid JSON ({where}); send a "
                                         "JSON object with Content-Type: application/json")
    parts = []
    for item in errors:
        if item.get("loc") == ("body",) and isinstance(item.get("input"), str | bytes):
            return MalformedRequestError("the body must be a JSON object sent with "
                                         "Content-Type: application/json")
        loc = [str(p) for p in item.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "body"
        if item.get("type") == "extra_forbidden":
            parts.append(f"unknown field {field!r}")
        elif item.get("type") == "missing":
            parts.append(f"{field} is required" if loc else "a JSON body is required")
        else:
            parts.append(f"{field}: {item.get('msg')}")
    return RequestFieldError("invalid request: " + "; ".join(parts[:10]))
