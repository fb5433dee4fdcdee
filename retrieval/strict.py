"""Config models whose validation errors are ours: ``ConfigError`` naming the key and the fix.

pydantic's ``ValidationError`` lists locations and internal error types; a user wants to read
which key is wrong, what it should be, and, for a typo, the key they probably meant.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from retrieval.errors import ConfigError, closest

_SHOWN = 3  # errors spelled out per message; the rest are counted


_depth = threading.local()


class StrictConfig(BaseModel):
    """A pydantic model that raises ``ConfigError`` (never ``ValidationError``) when built.

    Only the outermost model converts: a nested one (pydantic calls ``__init__`` for it too)
    lets pydantic fold its errors into the parent's, so keys come out fully dotted.
    """

    def __init__(self, **data: Any) -> None:
        depth = getattr(_depth, "value", 0)
        _depth.value = depth + 1
        try:
            super().__init__(**data)
        except ValidationError as exc:
            if depth:
                raise
            raise config_error(type(self), exc) from exc
        finally:
            _depth.value = depth


def config_error(model: type[BaseModel], exc: ValidationError) -> ConfigError:
    """One readable ``ConfigError`` for every problem in ``exc`` (the first names ``key``)."""
    errors = exc.errors(include_url=False)
    lines = [_describe(model, error) for error in errors[:_SHOWN]]
    more = f" (and {len(errors) - _SHOWN} more)" if len(errors) > _SHOWN else ""
    key = _dotted(errors[0]["loc"]) if errors else None
    return ConfigError(f"invalid {model.__name__}: " + "; ".join(lines) + more, key)


def problems(exc: ValidationError, key: Callable[[str], str] | None = None) -> str:
    """Every error of ``exc`` as ``key: message`` joined by "; " (a model-level error as its
    message alone); ``key`` names the last part of a location (a flag, say), else dotted."""
    return "; ".join(
        f"{key(str(e['loc'][-1])) if key else _dotted(e['loc'])}: "
        f"{e['msg'].removeprefix('Value error, ')}" if e["loc"] else e["msg"]
        for e in exc.errors(include_url=False))


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _describe(model: type[BaseModel], error: ErrorDetails) -> str:
    key = _dotted(error["loc"]) or "(top level)"
    if error["type"] == "extra_forbidden":
        known = fields_at(model, error["loc"][:-1])
        name = str(error["loc"][-1])
        return (f"unknown key {key!r}{closest(name, known)}; remove it or use one of "
                f"{sorted(known)}")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] in ("value_error", "assertion_error"):
        return f"{key}: {message}"
    shown = repr(error.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{key}: {message} (got {shown}); set {key} to a value that satisfies this"


def fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc`` (list indices are skipped)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not _is_model(current):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
    return list(current.model_fields) if _is_model(current) else []


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside ``X | None``, ``tuple[X, ...]``, ``list[X]`` (else None)."""
    if _is_model(annotation):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
