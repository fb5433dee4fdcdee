"""Framework objects built from values the engine already validated, without validating again.

A ``Hit`` is validated once, when the engine builds it (or the cache decodes it). Building a
LangChain ``Document`` or a LlamaIndex ``TextNode`` from it with the validating constructor
checks the same strings, floats and dicts a second time, and was most of an adapter's own cost.
pydantic's ``model_construct`` skips validation but resolves every field in a Python loop
(defaults, aliases, default factories whose signatures it inspects on each call): with
pydantic 2.14 it is slower than validating (6.7 against 3.6 us for a ``TextNode``).

``TrustedModel`` does what ``model_construct`` does, with that loop done once: the defaults
come from one validated instance of the model (so they are the framework's own, whatever its
version), and each object gets a copy of them, the given values, fresh copies of mutable
defaults, and pydantic's bookkeeping as ``model_construct`` sets it (the fields set, no extra
fields, no private attributes). A model that needs more than that (a post-init hook, private
attributes, extra fields) is built by its validating constructor instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

__all__ = ["TrustedModel"]

Model = TypeVar("Model", bound=BaseModel)
_MUTABLE = (dict, list, set)
_set = object.__setattr__  # pydantic models refuse plain attribute setting of these names


class TrustedModel(Generic[Model]):
    """``build(**values)``: a ``model`` equal to ``model(**values)`` for valid values, built
    without validation. ``example`` names the fields every call sets (and only those)."""

    def __init__(self, model: type[Model], **example: Any) -> None:
        prototype = model(**example)
        self.model = model
        self.defaults = dict(prototype.__dict__)
        self.fields_set = frozenset(prototype.model_fields_set)
        self.fresh = tuple(name for name, value in self.defaults.items()
                           if isinstance(value, _MUTABLE) and name not in example)
        self.trusted = (model.__pydantic_post_init__ is None
                        and not model.__private_attributes__
                        and model.model_config.get("extra") != "allow"
                        and self.defaults.keys() == model.model_fields.keys())
        self.build: Callable[..., Model] = self._construct if self.trusted else model

    def _construct(self, **values: Any) -> Model:
        fields = {**self.defaults, **values}
        for name in self.fresh:  # a default list or dict is the object's own, as validated
            fields[name] = fields[name].copy()
        built = self.model.__new__(self.model)
        _set(built, "__dict__", fields)
        _set(built, "__pydantic_fields_set__", set(self.fields_set))
        _set(built, "__pydantic_extra__", None)
        _set(built, "__pydantic_private__", None)
        return built
