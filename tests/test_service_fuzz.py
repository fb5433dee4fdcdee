"""A seeded fuzz of the service's own OpenAPI document (schemathesis over hypothesis): every
operation, fuzzed bodies, queries and headers, against the real app over a ready retriever on
the small Cranfield index; no response is a 5xx (the probe found 3 x 500 in 8,691 requests:
a ``deadline_ms`` past the thread timeout's range)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from small_index import index_fixture  # noqa: F401 (the ``index`` fixture)
from starlette.testclient import TestClient

from retrieval.service.app import create_app
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
