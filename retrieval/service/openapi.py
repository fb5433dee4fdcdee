"""The OpenAPI document, generated from the same pydantic models the endpoints use."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from retrieval.models import SearchResult
from retrieval.service.schemas import (
    BatchBody,
    BatchResult,
    DeleteBody,
    ErrorBody,
    FetchBody,
    FetchResult,
    Health,
    IndexInfo,
    SearchBody,
    UpsertBody,
    WriteAck,
)

REF = "#/components/schemas/{model}"
ERROR_STATUSES = {"400": "invalid query or filter, malformed JSON",
                  "401": "missing or unknown API key",
                  "403": "the key's scope does not allow the route (writes need write scope)",
                  "409": "a request_id reused for another write, or min_seq past the log",
                  "413": "body or input over a limit",
                  "422": "unknown field, missing field or wrong type",
                  "503": "loading, draining, or no usable build"}


def _ref(model: type[BaseModel]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": {"$ref": REF.format(
        model=model.__name__)}}}}


def _operation(summary: str, response: type[BaseModel], body: type[BaseModel] | None = None,
               errors: bool = True) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary,
                                 "responses": {"200": {"description": "OK", **_ref(response)}}}
    if body is not None:
        operation["requestBody"] = {"required": True, **_ref(body)}
    if errors:
        operation["responses"].update(_errors(*ERROR_STATUSES))
    operation["security"] = [{"bearer": []}] if errors else []
    return operation


def _errors(*statuses: str) -> dict[str, Any]:
    return {status: {"description": ERROR_STATUSES[status], **_ref(ErrorBody)}
            for status in statuses}


def openapi_document(title: str = "retrieval", version: str = "1") -> dict[str, Any]:
    models: list[tuple[type[BaseModel], Any]] = [
        (SearchBody, "validation"), (BatchBody, "validation"), (SearchResult, "serialization"),
        (BatchResult, "serialization"), (IndexInfo, "serialization"), (Health, "serialization"),
        (ErrorBody, "serialization"), (UpsertBody, "validation"), (DeleteBody, "validation"),
        (FetchBody, "validation"), (WriteAck, "serialization"), (FetchResult, "serialization")]
    _, schemas = models_json_schema(models, ref_template=REF)
    readiness = _operation("200 once a verified build is loaded and the encoder warmed; 503 "
                           "while loading or draining", Health, errors=False)
    readiness["responses"]["503"] = {"description": "not ready", **_ref(ErrorBody)}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version,
                 "description": "Hybrid BM25 + vector retrieval over a memory-mapped build."},
        "paths": {
            "/v1/search": {"post": _operation("Retriever.search: the best k passages, every "
                                              "score, stage timings, build id", SearchResult,
                                              SearchBody)},
            "/v1/search/batch": {"post": _operation("Retriever.search_batch: many queries, "
                                                    "same filters", BatchResult, BatchBody)},
            "/v1/index": {"get": _operation("the live build", IndexInfo)},
            "/v1/documents": {"post": _operation("IndexWriter.upsert (write scope): add or "
                                                 "replace documents; answered once durable, "
                                                 "with the write's seq", WriteAck, UpsertBody)},
            "/v1/documents/delete": {"post": _operation("IndexWriter.delete (write scope)",
                                                        WriteAck, DeleteBody)},
            "/v1/documents/get": {"post": _operation("documents by id as the index serves "
                                                     "them", FetchResult, FetchBody)},
            "/v1/snapshot": {"post": {
                "summary": "the root as a snapshot tar (admin scope): live build, log since "
                           "it, flip history; restore with `retrieval restore FILE ROOT`",
                "security": [{"bearer": []}],
                "responses": {"200": {"description": "OK", "content": {
                    "application/x-tar": {"schema": {"type": "string", "format": "binary"}}}},
                    **_errors("401", "403", "503")}}},
            "/healthz": {"get": _operation("the process is alive", Health, errors=False)},
            "/readyz": {"get": readiness},
            "/metrics": {"get": {"summary": "Prometheus text format, merged over workers; "
                                            "any key where the server has keys, unless "
                                            "server.metrics_auth = false",
                                 "security": [{"bearer": []}],
                                 "responses": {"200": {"description": "OK", "content": {
                                     "text/plain": {"schema": {"type": "string"}}}},
                                     **_errors("401")}}},
        },
        "components": {"schemas": schemas.get("$defs", {}),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
