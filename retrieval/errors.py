"""Errors raised by the serving layer; the whole tree is drawn in ``indexes.errors``."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from indexes.errors import (
    ArtifactError,
    CorpusError,
    CorruptArtifactError,
    EncoderMismatchError,
    FilterTypeError,
    FormatVersionError,
    InvalidQueryError,
    InvalidWriteError,
    LimitExceededError,
    MalformedFilterError,
    MissingArtifactError,
    QueryDimensionError,
    RequestReplayError,
    RetrievalError,
    SchemaMismatchError,
    UnknownFieldError,
    WriterClosedError,
    WriterLockedError,
)


class ConfigError(RetrievalError, ValueError):
    """A configuration key is invalid, or names something that does not exist.

    ``key`` is the dotted path of the offending key (``"cache.url"``, ``"features.0.view"``)
    when one key is to blame.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class OverloadedError(RetrievalError):
    """Too many searches are in flight; this one was refused at once instead of queued.

    Retry after a short back-off, or raise ``max_in_flight`` if the machine has headroom.
    """


class SearchAbandonedError(RetrievalError):
    """The caller stopped waiting (``asearch(abandoned=...)`` completed first, e.g. an HTTP
    client that disconnected): a search still queued for a thread was dropped, never run."""


class RetrieverClosedError(RetrievalError):
    """The retriever was closed (``close()``, or the end of its ``with`` block): it searches
    no more. Load a new one."""

    def __init__(self, message: str = "this retriever is closed; load a new one "
                                      "(Retriever.load) to search") -> None:
        super().__init__(message)


class SequenceNotReachedError(RetrievalError):
    """A search asked to see writes up to a sequence number (``min_seq``) this index has not
    applied: no write with that number has been acknowledged on this root (yet)."""


class UnknownNamedFilterError(InvalidQueryError):
    """A search referred (``{"$named": name}``) to a filter name that was never registered."""


def closest(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or ``""``."""
    match = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


__all__ = [
    "ArtifactError",
    "ConfigError",
    "CorpusError",
    "CorruptArtifactError",
    "EncoderMismatchError",
    "FilterTypeError",
    "FormatVersionError",
    "InvalidQueryError",
    "InvalidWriteError",
    "LimitExceededError",
    "MalformedFilterError",
    "MissingArtifactError",
    "OverloadedError",
    "QueryDimensionError",
    "RequestReplayError",
    "RetrievalError",
    "SchemaMismatchError",
    "SearchAbandonedError",
    "SequenceNotReachedError",
    "UnknownFieldError",
    "UnknownNamedFilterError",
    "WriterClosedError",
    "WriterLockedError",
    "closest",
]
