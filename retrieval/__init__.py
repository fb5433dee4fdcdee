"""Serving layer: ``from retrieval import Retriever``."""

from retrieval.config import Limits, RetrieverConfig
from retrieval.errors import (
    ArtifactError,
    ConfigError,
    CorpusError,
    CorruptArtifactError,
    EncoderMismatchError,
    FilterTypeError,
    FormatVersionError,
    InvalidQueryError,
    LimitExceededError,
    MalformedFilterError,
    MissingArtifactError,
    OverloadedError,
    RetrievalError,
    UnknownFieldError,
)
from retrieval.models import CacheInfo, Hit, SearchResult
from retrieval.retriever import Retriever

__all__ = [
    "ArtifactError",
    "CacheInfo",
    "ConfigError",
    "CorpusError",
    "CorruptArtifactError",
    "EncoderMismatchError",
    "FilterTypeError",
    "FormatVersionError",
    "Hit",
    "InvalidQueryError",
    "LimitExceededError",
    "Limits",
    "MalformedFilterError",
    "MissingArtifactError",
    "OverloadedError",
    "RetrievalError",
    "Retriever",
    "RetrieverConfig",
    "SearchResult",
    "UnknownFieldError",
]
