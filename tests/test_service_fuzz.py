"""A seeded fuzz of the service's own OpenAPI document (schemathesis over hypothesis): every
operation, fuzzed bodies, queries and headers, against the real app over a ready retriever on
the small Cranfield index; no response is a 5xx (the probe found 3 x 500 in 8,691 requests:
a ``deadline_ms`` past the thread timeout's range)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # schemathesis's own dependency
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from small_index import index_fixture  # noqa: F401 (the ``index`` fixture)
from starlette.testclient import TestClient

from indexes.errors import SchemaMismatchError
from retrieval.service.app import create_app
from retrieval.service.errors import error_body
from retrieval.service.openapi import openapi_document
from retrieval.service.settings import ServeConfig

schema = schemathesis.openapi.from_dict(openapi_document())


@pytest.fixture(scope="module")
def client(index: Path) -> Iterator[TestClient]:
    config = ServeConfig.model_validate({"retriever": {"cache": {"backend": "none"}}})
    with TestClient(create_app(index, config), raise_server_exceptions=False) as ready:
        deadline = time.monotonic() + 120
        while ready.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the service never became ready"
            time.sleep(0.05)
        yield ready


@schema.parametrize()
@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_fuzzed_requests_never_get_a_server_error(case: Any, client: TestClient) -> None:
    sent = case.as_transport_kwargs(base_url="http://testserver")
    if "data" in sent and isinstance(sent["data"], bytes | str):  # httpx names raw bytes so
        sent["content"] = sent.pop("data")
    response = client.request(**sent)
    assert response.status_code < 500, (sent, response.text[:500])


def test_the_document_allows_error_details_and_names_every_keyed_route() -> None:
    """ErrorDetail forbade the ``details`` an error carries (a 422 for a metadata field of
    another type failed its own schema); /metrics was documented without security though it
    takes a key by default, and /v1/snapshot as answering 200 only."""
    document = openapi_document()
    error = error_body(SchemaMismatchError("field 'year' is a number", field="year"))
    assert error["error"]["details"] == {"field": "year"}
    jsonschema.validate(error, {"$ref": "#/components/schemas/ErrorBody",
                                "components": document["components"]})
    metrics = document["paths"]["/metrics"]["get"]
    assert metrics["security"] == [{"bearer": []}] and "401" in metrics["responses"]
    assert {"200", "401", "403", "503"} <= set(
        document["paths"]["/v1/snapshot"]["post"]["responses"])
