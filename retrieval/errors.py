"""Errors raised by the serving layer; the tree is drawn in ``indexes.errors``."""

from indexes.errors import (
    ArtifactError,
    CorpusError,
    CorruptArtifactError,
    EncoderMismatchError,
    FilterTypeError,
    FormatVersionError,
    InvalidQueryError,
    LimitExceededError,
    MalformedFilterError,
    MissingArtifactError,
    RetrievalError,
    UnknownFieldError,
)

__all__ = [
    "ArtifactError",
    "CorpusError",
    "CorruptArtifactError",
    "EncoderMismatchError",
    "FilterTypeError",
    "FormatVersionError",
    "InvalidQueryError",
    "LimitExceededError",
    "MalformedFilterError",
    "MissingArtifactError",
    "RetrievalError",
    "UnknownFieldError",
]
