"""What the service makes of a body, without a server: the words a client reads in a 400 or
422, and the vectors of a write."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

from indexes.errors import InvalidWriteError
from retrieval.service.bodies import describe_validation
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
