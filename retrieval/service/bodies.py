"""Reading request bodies and writing JSON responses, shared by the service's routes."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from indexes.errors import RetrievalError
from retrieval.service.errors import MalformedRequestError, RequestFieldError
from retrieval.service.schemas import Health

JSON = "application/json"
Body = TypeVar("Body", bound=BaseModel)


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The JSON body as ``model``: 400 when it is not JSON, 422 when its fields are wrong
    (the ``Guard`` has read it whole, or answered 413 / 408)."""
    kind = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if kind != JSON and not kind.endswith("+json"):
        raise MalformedRequestError(f"the body must be a JSON object sent with Content-Type: "
                                    f"{JSON} (got {kind!r})")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise describe_validation(exc.errors()) from None


def describe_validation(errors: Any) -> RetrievalError:
    """One clear message for pydantic's list: bad JSON is 400, anything else about fields 422."""
    for item in errors:
        if item.get("type") == "json_invalid":
            where = item.get("ctx", {}).get("error", "")
            return MalformedRequestError(f"request body is not valid JSON ({where}); send a "
                                         f"JSON object with Content-Type: {JSON}")
    parts = []
    for item in errors:
        field = ".".join(str(p) for p in item.get("loc", ())) or "body"
        if item.get("type") == "extra_forbidden":
            parts.append(f"unknown field {field!r}")
        elif item.get("type") == "missing":
            parts.append(f"{field} is required")
        else:
            parts.append(f"{field}: {item.get('msg')}")
    return RequestFieldError("invalid request: " + "; ".join(parts[:10]))


def json_response(model: BaseModel, status: int = 200) -> Response:
    return Response(model.model_dump_json(exclude_none=isinstance(model, Health)),
                    status_code=status, media_type=JSON)
