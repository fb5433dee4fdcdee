"""What the service makes of a body, without a server: the words a client reads in a 400 or
422, and the vectors of a write."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from indexes.errors import InvalidWriteError
from retrieval.service.bodies import Body, describe_validation, parse_body
from retrieval.service.errors import MalformedRequestError, RequestFieldError
from retrieval.service.schemas import (
    BatchBody,
    DeleteBody,
    FetchBody,
    SearchBody,
    UpsertBody,
    WriteDocument,
)
from retrieval.service.writes import given_vectors


def message_for(model: type[BaseModel], raw: bytes) -> Exception:
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(raw)
    return describe_validation(caught.value)


@pytest.mark.parametrize(("filters", "named"), [("[1, 2]", "an array"), ("3", "a number"),
                                                ("true", "a boolean")])
def test_filters_of_the_wrong_json_type_get_one_message_with_an_example(filters: str,
                                                                        named: str) -> None:
    for model, head in ((SearchBody, '"query": "x"'), (BatchBody, '"queries": ["x"]')):
        error = message_for(model, f'{{{head}, "filters": {filters}}}'.encode())
        assert isinstance(error, RequestFieldError)
        assert str(error) == (f'invalid request: filters must be a filter object, a DSL string '
                              f'or null, not {named}; e.g. {{"year": {{"gte": 2010}}}} or '
                              f'"year >= 2010"')


def test_other_field_errors_are_still_listed_beside_the_filters_one() -> None:
    error = message_for(SearchBody, b'{"query": "x", "filters": [], "k": "5", "topk": 1}')
    text = str(error)
    assert "filters must be" in text and "k: " in text and "unknown field 'topk'" in text
    assert text.count("filters") == 1


def test_a_lone_surrogate_escape_is_named_as_such() -> None:
    error = message_for(SearchBody, b'{"query": "a\\ud800b"}')
    assert isinstance(error, MalformedRequestError)
    assert "half of a surrogate pair alone is not text" in str(error)


@pytest.mark.parametrize(("model", "field"), [(BatchBody, "queries"), (DeleteBody, "ids"),
                                               (FetchBody, "ids"), (UpsertBody, "documents")])
def test_a_list_of_wrong_items_stops_at_the_first(model: type[BaseModel], field: str) -> None:
    """{"queries": [1, 1, ...]}: pydantic made an error per item (40,000 of them took 2.3 s)
    and their messages were de-duplicated on a list, quadratically: 31 s on the event loop."""
    items = ", ".join(["1"] * 40_000)
    raw = f'{{"{field}": [{items}]}}'.encode()
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(raw)
    assert caught.value.error_count() == 1
    assert str(describe_validation(caught.value)).startswith(f"invalid request: {field}.0: ")


def test_a_vector_of_wrong_items_stops_at_the_first() -> None:
    items = ", ".join(['"x"'] * 40_000)
    document = f'{{"id": "a", "text": "b", "vector": [{items}]}}'
    with pytest.raises(ValidationError) as caught:
        UpsertBody.model_validate_json(f'{{"documents": [{document}]}}')
    assert caught.value.error_count() == 2  # the list's first item, and not a string


def test_thousands_of_unknown_fields_are_named_ten_at_most_in_order() -> None:
    """Past 100 errors only the first are read from pydantic's JSON: every error as a dict
    (exc.errors()) took 0.8 s for 100,000 unknown fields."""
    fields = ", ".join(f'"f{i}": 1' for i in range(20_000))
    error = message_for(SearchBody, f'{{"query": "x", "k": "5", {fields}}}'.encode())
    assert isinstance(error, RequestFieldError)
    assert str(error) == "invalid request: k: Input should be a valid integer; " + "; ".join(
        f"unknown field 'f{i}'" for i in range(9))


def test_plain_bad_json_is_not_blamed_on_surrogates() -> None:
    error = message_for(SearchBody, b'{"query": ')
    assert isinstance(error, MalformedRequestError) and "surrogate" not in str(error)


@pytest.mark.parametrize("vectors", [["AAAA"], ["AAAAAAAA", "AAAAAAAA"]])
def test_base64_vectors_not_of_whole_float32_rows_are_a_write_error(vectors: list[str]) -> None:
    """3 bytes; and 2 rows of 6 bytes, whose 12 bytes are 3 floats but no 2 equal rows."""
    documents = [WriteDocument(id=f"d{i}", text="x", vector=v) for i, v in enumerate(vectors)]
    with pytest.raises(InvalidWriteError, match="not a whole number of float32 values"):
        given_vectors(documents)


def test_base64_rows_decode_in_one_go_as_float32() -> None:
    rows = np.arange(6, dtype="<f4").reshape(2, 3)  # 12 bytes a row: 16 characters
    documents = [WriteDocument(id=f"d{i}", text="x",
                               vector=base64.b64encode(row.tobytes()).decode())
                 for i, row in enumerate(rows)]
    assert np.array_equal(given_vectors(documents), rows)


# -- parse_body: what a request must be besides its fields --------------------------------


def parse(model: type[Body], raw: bytes, headers: dict[str, str] | None = None,
          query: bytes = b"") -> Body:
    """``parse_body`` of a POST carrying ``raw``: a real Starlette request over an ASGI scope,
    as the service's routes receive it (JSON content type unless ``headers`` say otherwise)."""
    given = {"content-type": "application/json"} if headers is None else headers
    scope = {"type": "http", "method": "POST", "path": "/v1/search", "query_string": query,
             "headers": [(k.encode(), v.encode()) for k, v in given.items()]}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    return asyncio.run(parse_body(Request(scope, receive), model))


def test_a_body_without_a_content_type_is_refused() -> None:
    """A page on any website may POST without a Content-Type and no CORS preflight (fetch of
    a Blob, mode "no-cors"): read as JSON, it planted documents under server.open_writes."""
    raw = b'{"documents": [{"id": "planted", "text": "from another site"}]}'
    with pytest.raises(MalformedRequestError,
                       match="no Content-Type; send the JSON body with the header "
                             "'content-type: application/json'"):
        parse(UpsertBody, raw, headers={})
    assert parse(UpsertBody, raw).documents[0].id == "planted"
    declared = {"content-type": "application/merge-patch+json; charset=utf-8"}
    assert parse(DeleteBody, b'{"ids": ["a"]}', headers=declared).ids == ["a"]


REPEATED = [
    (DeleteBody, b'{"ids": ["dupB"], "ids": ["1"]}', "ids"),  # deleted "1"
    (SearchBody, b'{"query": "heat", "filters": {"year": {"gte": 3000}}, "filters": null}',
     "filters"),  # searched unfiltered
    (SearchBody, b'{"query": "heat", "filters": {"year": {"gte": 3000}, "year": {"gte": 0}}}',
     "year"),
    (UpsertBody, b'{"documents": [{"id": "dupA", "text": "t", "id": "dupB"}]}', "id"),
    (SearchBody, b'{"query": "heat", "k": 5, "k": "many"}', "k"),  # not a 422 about k
    (SearchBody, ('{"query": "x", ' + "".join(f'"f{i}": 1, ' for i in range(50_000))
                  + '"f0": 2}').encode(), "f0"),  # 50,000 unknown fields: found by a set
]


@pytest.mark.parametrize(("model", "raw", "key"), REPEATED,
                         ids=["delete ids", "search filters", "filter field", "document id",
                              "wrong second value", "many keys"])
def test_a_key_given_twice_in_one_object_is_refused_by_name(model: type[BaseModel], raw: bytes,
                                                            key: str) -> None:
    """pydantic keeps the last value silently; the corpus reader refuses the same thing."""
    with pytest.raises(MalformedRequestError,
                       match=f"the key '{key}' appears twice in one object of the body"):
        parse(model, raw)


def test_the_same_key_in_different_objects_is_no_repeat() -> None:
    raw = (b'{"documents": [{"id": "a", "text": "x", "metadata": {"id2": 1, "n": 1e400}}, '
           b'{"id": "b", "text": "y", "metadata": {"id2": 2}}]}')
    assert [d.id for d in parse(UpsertBody, raw).documents] == ["a", "b"]
    with pytest.raises(MalformedRequestError, match="not valid JSON"):  # pydantic's verdict
        parse(SearchBody, b'{"query": "x", "query": ')


@pytest.mark.parametrize(("query", "named"), [
    (b"k=2&filters=year%20%3E%3D%203000", "'k', 'filters'"),
    (b"debug", "'debug'"),
    (b"&", "'&'"),
    (b"&".join(b"p%d=1" % i for i in range(12)), "'p0', 'p1', 'p2', 'p3', 'p4', 'p5', 'p6', "
                                                  "'p7', 'p8', 'p9' and 2 more"),
])
def test_a_query_string_on_a_json_route_is_refused_by_name(query: bytes, named: str) -> None:
    """``POST /v1/search?k=2&filters=...`` answered ten unfiltered hits."""
    with pytest.raises(MalformedRequestError) as caught:
        parse(SearchBody, b'{"query": "heat"}', query=query)
    assert str(caught.value) == (f"this route takes no query string (got {named}); give its "
                                 "parameters as fields of the JSON body")
