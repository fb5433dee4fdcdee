"""Reading request bodies and writing JSON responses, shared by the service's routes."""

from __future__ import annotations

import json
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from indexes.corpus import RepeatedKey, distinct_keys
from indexes.errors import RetrievalError
from retrieval.service.errors import MalformedRequestError, RequestFieldError
from retrieval.service.schemas import Health

JSON = "application/json"
Body = TypeVar("Body", bound=BaseModel)
MAX_MESSAGES = 10  # the distinct problems a 4xx names
MAX_ERRORS_READ = 100  # pydantic's errors read to find them (a union repeats one per branch)
MAX_NAME = 40  # the characters of a client's name quoted back


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The JSON body as ``model``: 400 when it is not JSON, 422 when its fields are wrong
    (the ``Guard`` has read it whole, or answered 413 / 408)."""
    refuse_query_string(request)
    refuse_other_content_type(request)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":  # gzip bytes were read as JSON and refused as "not valid JSON"
        raise MalformedRequestError(f"Content-Encoding {encoding!r} is not accepted; send the "
                                    "JSON body uncompressed")
    raw = await request.body()
    try:
        body = model.model_validate_json(raw)
    except ValidationError as exc:
        error = describe_validation(exc)
        if isinstance(error, RequestFieldError):  # a key given twice may be why a field is wrong
            refuse_repeated_keys(raw)
        raise error from None
    refuse_repeated_keys(raw)
    return body


def refuse_other_content_type(request: Request) -> None:
    """400 unless the body is declared JSON. A missing Content-Type is refused too: a page on
    any website may POST a body without one (``fetch`` of a Blob, mode "no-cors") with no
    CORS preflight, and with ``server.open_writes`` that planted documents."""
    given = request.headers.get("content-type")
    if given is None:
        raise MalformedRequestError(f"the request has no Content-Type; send the JSON body "
                                    f"with the header 'content-type: {JSON}'")
    kind = given.split(";")[0].strip().lower()
    if kind != JSON and not kind.endswith("+json"):
        raise MalformedRequestError(f"the body must be a JSON object sent with Content-Type: "
                                    f"{JSON} (got {kind!r})")


def refuse_query_string(request: Request) -> None:
    """400 for a query string: a POST route reads the JSON body alone, and ``?k=2`` or
    ``?filters=...`` were dropped without a word (ten unfiltered hits)."""
    query = request.scope.get("query_string", b"").decode("latin-1")
    if not query:
        return
    names = list(dict.fromkeys(name[:MAX_NAME] for name, _ in
                               parse_qsl(query, keep_blank_values=True))) or [query[:MAX_NAME]]
    shown = ", ".join(map(repr, names[:MAX_MESSAGES]))
    more = f" and {len(names) - MAX_MESSAGES} more" if len(names) > MAX_MESSAGES else ""
    raise MalformedRequestError(f"this route takes no query string (got {shown}{more}); "
                                "give its parameters as fields of the JSON body")


# Keys alone matter, so a number is read as its length: no float is built (a 1 MiB body of
# vectors took 34 ms, 10 ms so).
_KEY_CHECKER = json.JSONDecoder(object_pairs_hook=distinct_keys, parse_int=len, parse_float=len)


def refuse_repeated_keys(raw: bytes) -> None:
    """400 when an object of the body names a key twice: pydantic keeps the last value
    silently, so ``{"ids": ["a"], "ids": ["b"]}`` deleted "b", and a second ``"filters":
    null`` dropped the filter. A second parse, by the standard library's C scanner: 4-9 us
    for a search body of 30-200 bytes, 6-11 ms for a 1 MiB write (pydantic's own parse:
    3-7 us, 6-8 ms); a body it cannot read is left to pydantic's verdict."""
    try:
        _KEY_CHECKER.decode(raw.decode("utf-8"))
    except RepeatedKey as exc:
        raise MalformedRequestError(f"the key {exc.key[:MAX_NAME]!r} appears twice in one "
                                    "object of the body, and only the last value would be "
                                    "kept; rename or remove one") from None
    except (ValueError, RecursionError):  # not JSON to this parser: pydantic has judged it
        pass


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
