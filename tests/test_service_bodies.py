"""What the service says about a body it cannot take, without a server: the words a client
reads in a 400 or 422."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from retrieval.service.bodies import describe_validation
from retrieval.service.errors import MalformedRequestError, RequestFieldError
from retrieval.service.schemas import BatchBody, SearchBody


def message_for(model: type[SearchBody] | type[BatchBody], raw: bytes) -> Exception:
    with pytest.raises(ValidationError) as caught:
        model.model_validate_json(raw)
    return describe_validation(caught.value.errors())


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


def test_plain_bad_json_is_not_blamed_on_surrogates() -> None:
    error = message_for(SearchBody, b'{"query": ')
    assert isinstance(error, MalformedRequestError) and "surrogate" not in str(error)
