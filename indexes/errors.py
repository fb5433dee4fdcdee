"""Typed errors shared by the offline and serving layers.

The tree of every error the library raises on purpose (each says what was wrong and how to fix
it); ``from retrieval import ...`` gives every one of them::

    RetrievalError
    ├── ArtifactError                 an index directory cannot be used (``.path``)
    │   ├── MissingArtifactError      a file named by the manifest is absent
    │   ├── CorruptArtifactError      a file's sha256 differs from the manifest
    │   │   ├── LogCorruptionError    (indexes.wal) a damaged write-ahead log record that
    │   │   │                         acknowledged records follow: nothing is dropped
    │   │   └── SnapshotCorruptError  (indexes.snapshot) a snapshot file or member is damaged
    │   │       └── UnsafeMemberError a member named outside the root, or not a plain file
    │   ├── RestoreTargetError        (indexes.snapshot) restore into a root that is not empty
    │   ├── SnapshotConflictError     (indexes.snapshot) the root changed under every attempt
    │   └── FormatVersionError        the build was written by an unknown format version
    ├── EncoderMismatchError          query encoder and index disagree (model or dimension)
    ├── DistilledEncoderError         (indexes.distilled_encoder) a distilled query encoder's
    │                                 files are missing, damaged or of another format
    ├── UnknownBackendError           (indexes.onnx_encoder; also ValueError) an encoder
    │                                 backend name ``make_encoder`` does not know
    ├── CorpusError                   a document source cannot be read or is malformed
    │   ├── InvalidWriteError         (also ValueError) an upsert or delete refused before
    │   │   │                         anything was written (ids, text, vectors, metadata)
    │   │   ├── SchemaMismatchError   an upsert adds or retypes a metadata field (``.field``)
    │   │   └── RequestReplayError    a request id already used for a different write
    │   └── ShardCountError           (indexes.sharding) a corpus cannot be split into S shards
    ├── WriterLockedError             another writer holds the root's write-ahead log
    ├── WriterClosedError             a write to an IndexWriter after its close()
    ├── InvalidQueryError             (also ValueError) bad search input
    │   ├── UnknownFieldError         filter names a field the index does not have
    │   ├── FilterTypeError           filter value has the wrong type for its field
    │   ├── QueryDimensionError       a given query vector of another dimension than the
    │   │                             index's (also an EncoderMismatchError)
    │   ├── MalformedFilterError      filter structure or syntax is wrong
    │   ├── LimitExceededError        input exceeds a configured limit
    │   │   ├── PayloadTooLargeError  (retrieval.service) 413: body over server.max_body_bytes
    │   │   └── HeaderTooLargeError   (retrieval.service) 431: too many or too long headers
    │   ├── UnknownNamedFilterError   (retrieval.errors) no filter is registered by that name
    │   ├── MalformedRequestError     (retrieval.service) 400: the HTTP body is not JSON
    │   │   └── RequestTimeoutError   (retrieval.service) 408: the head or body came too late
    │   ├── RequestFieldError         (retrieval.service) 422: unknown, missing or mistyped field
    │   ├── FeatureRequestError       (retrieval.features) bad feature-read input
    │   └── UnsupportedFilterError    (retrieval.integrations) a framework filter we cannot
    │                                 express exactly (also an IntegrationError)
    ├── ConfigError                   (retrieval.errors; also ValueError) a config key is invalid
    │   │                             or does not match reality (store, views, Redis
    │   │                             credentials); ``key`` names it
    │   ├── CacheConfigError          (retrieval.cache) a cache setting
    │   ├── FeatureConfigError        (retrieval.features) a view, store or weights setting
    │   ├── GateConfigError           (retrieval.publishing) a gate, canary or labeled-log file
    │   └── ServiceConfigError        (retrieval.service) a serve config file or override
    ├── PublishError                  a publish or rollback cannot be done
    │   ├── UnknownBuildError         (indexes.publish) the build id names no build under the root
    │   ├── NoRollbackTargetError     (indexes.publish) no previously live build in the history
    │   ├── LogGapError               the build lacks live writes the log no longer holds
    │   └── LiveBuildChangedError     the build it was made from is no longer live
    ├── OverloadedError               (retrieval.errors) too many searches in flight: shed
    ├── RetrieverClosedError          (retrieval.errors) the retriever was closed: load a new one
    ├── SearchAbandonedError          (retrieval.errors) the caller left; the queued search was
    │                                 dropped unrun (499 in the service)
    ├── SequenceNotReachedError       (retrieval.errors) 409: a search's min_seq is past every
    │                                 write this index has applied
    ├── ShardUnavailableError         (retrieval.sharding) a shard has no live replica (``shard``)
    ├── CacheError                    (retrieval.cache) raised at construction only:
    │   │                             cache reads and writes never raise, they miss
    │   ├── CacheConfigError          (also a ConfigError)
    │   └── CacheValueError           (also ValueError) a value the cache cannot encode
    ├── FeatureError                  (retrieval.features) root of feature-store errors
    │   ├── FeatureConfigError        (also a ConfigError)
    │   ├── FeatureSchemaError        (also ValueError) a bad source column (``.column``, ``.row``)
    │   ├── FeatureSourceError        an offline source cannot be read at all
    │   ├── FeatureStoreError         the store failed during materialization or administration
    │   └── FeatureRequestError       (also an InvalidQueryError)
    ├── AuthenticationError           (retrieval.service) 401: missing or wrong API key
    │   └── ForbiddenError            403: the key's scope does not allow the route (writes)
    ├── NotFoundError                 (retrieval.service) 404 / 405: no such route or method
    ├── ServiceUnavailableError       (retrieval.service) 503: loading, draining, no usable build
    │   └── WriteTimeoutError         (retrieval.service) a write the client had no answer to in
    │                                 time (``retrieval.client``): it may have
    │                                 been applied; resending its ``request_id`` is safe
    ├── ServerError                   (retrieval.service) 500: a bug; never a traceback to clients
    └── IntegrationError              (retrieval.integrations) a framework adapter cannot be used
        ├── MissingExtraError         the framework's extra is not installed (also ImportError)
        ├── NotASearchBackendError    the wrapped object lacks the search methods (also TypeError)
        └── UnsupportedFilterError    (also an InvalidQueryError)

The classes down to ``InvalidQueryError``'s filter errors live here; the serving layer
re-exports them from ``retrieval.errors`` and defines the config, overload, cache,
feature-store and integration families.
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


class InvalidWriteError(CorpusError, ValueError):
    """An upsert or delete is malformed; nothing of it was written."""


class SchemaMismatchError(InvalidWriteError):
    """An upsert's metadata adds a field the index does not have, or gives a field a value of
    another type; the message names the field (``.field``) and the index's schema."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class RequestReplayError(InvalidWriteError):
    """A write reuses the request id of an earlier, different write: a retry must resend the
    same documents (or ids), and a new write needs a new request id."""


class PublishError(RetrievalError):
    """A publish or rollback cannot be done as asked; the message says why and what to do."""


class LogGapError(PublishError):
    """The build to publish lacks writes that the live build holds and that the write-ahead
    log no longer has: publishing it would lose them."""


class LiveBuildChangedError(PublishError):
    """Another build went live while one made from the live build was written (a compaction
    during a publish or rollback): publishing it would undo that flip."""


class WriterLockedError(RetrievalError):
    """Another writer (this or another process) holds the index root's write-ahead log."""


class WriterClosedError(RetrievalError):
    """A write to an ``IndexWriter`` after its ``close()``: open a new writer."""


class InvalidQueryError(RetrievalError, ValueError):
    """Search input is invalid; the message says which part and how to fix it."""


class UnknownFieldError(InvalidQueryError):
    """A filter names a metadata field the index does not have."""


class FilterTypeError(InvalidQueryError):
    """A filter value has the wrong type for its field."""


class QueryDimensionError(InvalidQueryError, EncoderMismatchError):
    """A caller's query vector has another dimension than the index's vectors: bad search
    input (400 over HTTP), and an encoder mismatch for code that catches those."""


class MalformedFilterError(InvalidQueryError):
    """A filter's structure or syntax is wrong."""


class LimitExceededError(InvalidQueryError):
    """Search input exceeds a configured limit (query length, k, filter clauses, IN values)."""
