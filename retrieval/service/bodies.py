"""Reading request bodies and writing JSON responses, shared by the service's routes."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from indexes.errors import RetrievalError
from retrieval.service.errors import MalformedRequestError, RequestFieldError
from retrieval.service.schemas import Health

JSON = "application/json"
Body = TypeVar("Body", bound=BaseModel)
MAX_MESSAGES = 10  # the distinct problems a 4xx names
MAX_ERRORS_READ = 100  # pydantic's errors read to find them (a union repeats one per branch)


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The JSON body as ``model``: 400 when it is not JSON, 422 when its fields are wrong
    (the ``Guard`` has read it whole, or answered 413 / 408)."""
    kind = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if kind != JSON and not kind.endswith("+json"):
        raise MalformedRequestError(f"the body must be a JSON object sent with Content-Type: "
                                    f"{JSON} (got {kind!r})")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":  # gzip bytes were read as JSON and refused as "not valid JSON"
        raise MalformedRequestError(f"Content-Encoding {encoding!r} is not accepted; send the "
                                    "JSON body uncompressed")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise describe_validation(exc) from None


def describe_validation(exc: ValidationError) -> RetrievalError:
    """One clear message for pydantic's list: bad JSON is 400, anything else about fields 422;
    at most ``MAX_MESSAGES`` distinct problems, however many errors the body has."""
    errors = first_errors(exc, MAX_ERRORS_READ)
    for item in errors:
        if item.get("type") == "json_invalid":
            return MalformedRequestError(f"request body is not valid JSON "
                                         f"({_json_problem(item)}); send a JSON object with "
                                         f"Content-Type: {JSON}")
    parts: dict[str, None] = {}  # a union's branches each report the same wrong value
    for item in errors:
        if len(parts) == MAX_MESSAGES:
            break
        loc = tuple(item.get("loc", ()))
        field = ".".join(str(p) for p in loc) or "body"
        if loc[:1] == ("filters",):
            part = (f"filters must be a filter object, a DSL string or null, not "
                    f"{json_type(item.get('input'))}; e.g. {{\"year\": {{\"gte\": 2010}}}} or "
                    f"\"year >= 2010\"")
        elif item.get("type") == "extra_forbidden":
            part = f"unknown field {field!r}"
        elif item.get("type") == "missing":
            part = f"{field} is required"
        else:
            part = f"{field}: {item.get('msg')}"
        parts.setdefault(part)
    return RequestFieldError("invalid request: " + "; ".join(parts))


def first_errors(exc: ValidationError, limit: int) -> list[Any]:
    """The first ``limit`` of ``exc``'s errors. ``exc.errors()`` builds a dict for every one
    (8 us apiece: 100,000 unknown fields of a 1 MiB body held the event loop 0.8 s); past
    ``limit`` their JSON text, written natively in 0.07 s, is read only as far as needed.
    (So many errors come from a parsed body: their inputs are JSON, unlike the raw bytes of a
    body that is not, which may not even be UTF-8.)"""
    if exc.error_count() <= limit:
        return list(exc.errors(include_url=False))
    text = exc.json(include_url=False)
    decoder = json.JSONDecoder()
    errors: list[Any] = []
    at = 1  # past the list's "["
    while len(errors) < limit and text[at] != "]":
        item, at = decoder.raw_decode(text, at)
        errors.append(item)
        at += text[at] == ","
    return errors


def _json_problem(item: Any) -> str:
    problem = str(item.get("ctx", {}).get("error", ""))
    if "hex escape" in problem:  # jiter's words for a lone surrogate such as \ud800
        problem += (": a \\u escape must name a whole character, and half of a surrogate "
                    "pair alone is not text")
    return problem


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, as a client wrote it."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def json_response(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(exclude_none=isinstance(model, Health)),
                    status_code=status, media_type=JSON)
