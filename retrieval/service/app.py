"""The ASGI app: one ``Retriever`` per worker behind Starlette; no search logic of its own.

Starlette rather than FastAPI: the same endpoint (strict body validation, a prepared result)
measured 3x less framework time per request (``python -m benchmarks.http``), which matters
next to a cache hit of tens of microseconds. The OpenAPI document is still generated from the
pydantic models (``retrieval.service.openapi``). Bodies are validated by strict models
(unknown fields and wrong types are 422), results are the library's ``SearchResult``
serialized by pydantic (a cache hit's shared fields once per cache entry,
``retrieval.result_json``), and every error is ``{"error": {"type", "message"}}`` with the
status from ``retrieval.service.errors``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from indexes.errors import LimitExceededError, RetrievalError
from retrieval.console.routes import console_routes
from retrieval.console.sides import Sides
from retrieval.quiet import quiet_third_party
from retrieval.request_path.validate import check_batch_work
from retrieval.result_json import result_json
from retrieval.retriever import Retriever
from retrieval.service.admission import Admission
from retrieval.service.auth import ApiKeys, load_api_keys
from retrieval.service.bodies import JSON, json_response, parse_body
from retrieval.service.errors import (
    RETRY_AFTER_SECONDS,
    NotFoundError,
    ServerError,
    ServiceUnavailableError,
    error_body,
    status_for,
)
from retrieval.service.guard import Guard
from retrieval.service.metrics import ServiceMetrics
from retrieval.service.openapi import openapi_document
from retrieval.service.schemas import BatchBody, Health, IndexInfo, SearchBody
from retrieval.service.settings import SPEC_ENV, ServeConfig
from retrieval.service.state import Loader, ServiceState, describe_index
from retrieval.service.writes import Writes, write_routes

log = logging.getLogger("retrieval.service")
METRICS_SYNC_SECONDS = 1.0


def create_app(index_root: str | Path, config: ServeConfig, *, keys: ApiKeys | None = None,
               loader: Loader | None = None) -> Starlette:
    """The service for ``index_root``; the build loads in the background once it starts."""
    settings = config.server
    if loader is None and config.ray is not None:
        loader = ray_loader(Path(index_root), config)
    state = ServiceState(Path(index_root), config.retriever, loader, config.named_filters,
                         settings.load_retry_seconds)
    metrics = ServiceMetrics()
    writes = Writes(Path(index_root))
    sides = Sides(Path(index_root)) if settings.console_enabled else None
    # One bound for every request that takes a worker thread: searches, document reads and
    # writes, the console's searches and gate.
    admission = Admission(settings.max_in_flight)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
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
            await asyncio.to_thread(writes.close)
            if sides is not None:
                await asyncio.to_thread(sides.close)
            metrics.process_exited()

    routes = (_search_routes(state, metrics, config, admission)
              + _operator_routes(state, metrics)
              + write_routes(state, writes, settings, admission)
              + (console_routes(state, sides, admission) if sides is not None else []))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        RetrievalError: _retrieval_error, HTTPException: _http_error, Exception: _unexpected})
    # An unknown path is a JSON 404 like any other, not a redirect to the path without its
    # trailing slash (built from the request's scheme: plain http behind a TLS proxy).
    app.router.redirect_slashes = False
    app.state.service = state
    app.add_middleware(Guard, keys=keys if keys is not None else load_api_keys(settings),
                       metrics=metrics, max_body_bytes=settings.max_body_bytes,
                       metrics_auth=settings.metrics_auth,
                       body_timeout_seconds=settings.body_timeout_seconds,
                       max_write_body_bytes=settings.max_write_body_bytes,
                       open_writes=settings.open_writes, console=sides is not None)
    return app


def ray_loader(index_root: Path, config: ServeConfig) -> Loader:
    """Open the build through its Ray Serve shard deployments (``Retriever.connect``)."""
    assert config.ray is not None
    ray_settings = config.ray

    def connect() -> Retriever:
        import ray

        if not ray.is_initialized():
            ray.init(address=ray_settings.address, log_to_driver=False)
        return Retriever.connect(index_root, config.retriever, app_name=ray_settings.app_name,
                                 allow_partial=ray_settings.allow_partial)

    return connect


def app_from_env() -> Starlette:
    """uvicorn's factory in each worker process (``retrieval serve`` sets the spec)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        quiet_third_party()
    spec = json.loads(os.environ[SPEC_ENV])
    return create_app(spec["index_root"], ServeConfig.model_validate(spec["config"]))


def gone(request: Request) -> Callable[[], Awaitable[None]]:
    """An awaitable factory that completes once the client has disconnected (the body is read
    by then, so the next message on the channel is the disconnect): ``retrieval.abandon``."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return disconnected


def _search_routes(state: ServiceState, metrics: ServiceMetrics, config: ServeConfig,
                   admission: Admission) -> list[Route]:
    settings = config.server

    async def search(request: Request) -> Response:
        with admission.admit():  # before the body is parsed: a shed search costs least
            body = await parse_body(request, SearchBody)
            result = await state.retriever().asearch(body.query, body.filters, body.k,
                                                     candidates=body.candidates,
                                                     deadline_ms=body.deadline_ms,
                                                     group_by=body.group_by,
                                                     context=body.context or 0,
                                                     min_seq=body.min_seq,
                                                     explain=body.explain,
                                                     min_score=body.min_score,
                                                     abandoned=gone(request))
        metrics.observe_result(result)
        if settings.log_query_text:
            log.info("search %r: %d hits, %.3f ms", body.query, len(result.hits),
                     result.timings.get("total", 0.0))
        return Response(result_json(result), media_type=JSON)

    async def search_batch(request: Request) -> Response:
        body = await parse_body(request, BatchBody)
        if len(body.queries) > settings.max_batch_queries:
            raise LimitExceededError(
                f"batch has {len(body.queries)} queries, more than the limit "
                f"{settings.max_batch_queries}; split it or raise server.max_batch_queries")
        retriever = state.retriever()
        check_batch_work(len(body.queries), body.k, body.candidates, retriever.config,
                         settings.max_batch_hits, settings.max_batch_candidates, "server")
        with admission.admit():
            results = await retriever.asearch_batch(body.queries, body.filters, body.k,
                                                    candidates=body.candidates,
                                                    deadline_ms=body.deadline_ms,
                                                    group_by=body.group_by,
                                                    context=body.context or 0,
                                                    min_seq=body.min_seq,
                                                    explain=body.explain,
                                                    min_score=body.min_score,
                                                    abandoned=gone(request))
        for result in results:
            metrics.observe_result(result)
        payload = b",".join(result_json(r) for r in results)
        return Response(b'{"results":[' + payload + b"]}", media_type=JSON)

    return [Route("/v1/search", search, methods=["POST"]),
            Route("/v1/search/batch", search_batch, methods=["POST"])]


def _operator_routes(state: ServiceState, metrics: ServiceMetrics) -> list[Route]:
    document = json.dumps(openapi_document())

    async def index_info(_: Request) -> Response:
        return json_response(IndexInfo(**describe_index(state.retriever())))

    async def healthz(_: Request) -> Response:
        return json_response(Health(status="alive"))

    async def readyz(_: Request) -> Response:
        ready, reason = state.readiness()
        if not ready:
            return JSONResponse(error_body(ServiceUnavailableError(reason)), status_code=503,
                                headers={"Retry-After": RETRY_AFTER_SECONDS})
        return json_response(Health(status="ready", build_id=state.retriever().build_id,
                            detail=None if reason == "ready" else reason))

    async def prometheus_metrics(_: Request) -> Response:
        _sync_once(state, metrics)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def openapi(_: Request) -> Response:
        return Response(document, media_type=JSON)

    return [Route("/v1/index", index_info), Route("/healthz", healthz),
            Route("/readyz", readyz), Route("/metrics", prometheus_metrics),
            Route("/openapi.json", openapi)]


def _sync_once(state: ServiceState, metrics: ServiceMetrics) -> None:
    # /readyz's answer (a log that cannot be applied is unready too), not only "loaded"
    metrics.ready_workers.set(1.0 if state.readiness()[0] else 0.0)
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


async def _retrieval_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RetrievalError)
    status = status_for(exc)
    headers = {"Retry-After": RETRY_AFTER_SECONDS} if status == 503 else None
    body = error_body(exc)
    hide = request.app.state.service.hide_root
    error = body["error"]
    error["message"] = hide(error["message"])
    for name, value in error.get("details", {}).items():
        if isinstance(value, str):
            error["details"][name] = hide(value)
    return JSONResponse(body, status_code=status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405):
        error: RetrievalError = NotFoundError(
            f"no route {request.method} {request.url.path}; see /openapi.json for the API")
    else:
        error = ServerError(str(exc.detail))
    # A 405 carries the route's allowed methods in ``Allow`` (Starlette sets it).
    return JSONResponse(error_body(error), status_code=exc.status_code, headers=exc.headers)


async def _unexpected(_: Request, exc: Exception) -> Response:
    log.error("unexpected error serving a request", exc_info=exc)
    return JSONResponse(error_body(ServerError("internal error; the server log has the "
                                               "details")), status_code=500)
