"""Typed errors shared by the offline and serving layers.

The tree (every error says what was wrong and how to fix it)::

    RetrievalError
    ├── ArtifactError                 an index directory cannot be used
    │   ├── MissingArtifactError      a file named by the manifest is absent
    │   ├── CorruptArtifactError      a file's sha256 differs from the manifest
    │   └── FormatVersionError        the build was written by an unknown format version
    ├── EncoderMismatchError          query encoder and index disagree (model or dimension)
    ├── CorpusError                   a document source cannot be read or is malformed
    ├── InvalidQueryError             bad search input
    │   ├── UnknownFieldError         filter names a field the index does not have
    │   ├── FilterTypeError           filter value has the wrong type for its field
    │   ├── MalformedFilterError      filter structure or syntax is wrong
    │   ├── LimitExceededError        input exceeds a configured limit
    │   └── FeatureRequestError       (retrieval.features) bad feature-read input
    ├── ConfigError                   (retrieval.errors) a config key is invalid or does not
    │   │                             match reality (store, views, Redis credentials); ``key``
    │   ├── CacheConfigError          (retrieval.cache) a cache setting
    │   └── FeatureConfigError        (retrieval.features) a view, store or weights setting
    ├── OverloadedError               (retrieval.errors) too many searches in flight: shed
    ├── CacheError                    (retrieval.cache) root of cache errors
    │   ├── CacheConfigError          (also a ConfigError)
    │   └── CacheValueError           a value cannot be encoded for the cache
    └── FeatureError                  (retrieval.features) root of feature-store errors
        ├── FeatureConfigError        (also a ConfigError)
        ├── FeatureSchemaError        a source does not fit its view
        ├── FeatureSourceError        a source cannot be read
        ├── FeatureStoreError         the online store failed in a batch or admin operation
        └── FeatureRequestError       (also an InvalidQueryError)

The serving layer re-exports these from ``retrieval.errors``.
"""

from __future__ import annotations

from pathlib import Path


class RetrievalError(Exception):
    """Root of every error this library raises on purpose."""


class ArtifactError(RetrievalError):
    """An index artifact cannot be used; ``path`` names the file."""

    def __init__(self, message: str, path: Path | str | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class MissingArtifactError(ArtifactError):
    """A file the index needs is absent."""


class CorruptArtifactError(ArtifactError):
    """A file's content does not match its recorded checksum or shape."""


class FormatVersionError(ArtifactError):
    """The build was written in a format version this library cannot read."""


class EncoderMismatchError(RetrievalError):
    """The query encoder does not match the one the index was built with."""


class CorpusError(RetrievalError):
    """A document source is unreadable or a document is malformed."""


class InvalidQueryError(RetrievalError, ValueError):
    """Search input is invalid; the message says which part and how to fix it."""


class UnknownFieldError(InvalidQueryError):
    """A filter names a metadata field the index does not have."""


class FilterTypeError(InvalidQueryError):
    """A filter value has the wrong type for its field."""


class MalformedFilterError(InvalidQueryError):
    """A filter's structure or syntax is wrong."""


class LimitExceededError(InvalidQueryError):
    """Search input exceeds a configured limit (query length, k, filter clauses, IN values)."""
