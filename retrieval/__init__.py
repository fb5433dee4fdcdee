"""Serving layer: ``from retrieval import Retriever``."""

from retrieval.config import Limits, RetrieverConfig
from retrieval.errors import (
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
from retrieval.models import CacheInfo, Hit, SearchResult
from retrieval.retriever import Retriever

__all__ = [
    "ArtifactError",
    "CacheInfo",
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
    "RetrievalError",
    "Retriever",
    "RetrieverConfig",
    "SearchResult",
    "UnknownFieldError",
]
