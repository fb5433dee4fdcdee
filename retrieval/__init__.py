"""Serving layer: ``from retrieval import Retriever``.

Exports the ``Retriever``, every configuration model a user writes (``RetrieverConfig`` and the
sections it holds) and every error family; the error tree is drawn in ``indexes.errors``.
"""

from indexes.distilled_encoder import DistilledEncoderError
from indexes.errors import LiveBuildChangedError, LogGapError
from indexes.onnx_encoder import UnknownBackendError
from indexes.publish import NoRollbackTargetError, PublishError, UnknownBuildError
from indexes.sharding.layout import ShardCountError
from indexes.snapshot import (
    RestoreTargetError,
    SnapshotConflictError,
    SnapshotCorruptError,
    UnsafeMemberError,
)
from indexes.wal.log import LogCorruptionError
from indexes.writer import IndexWriter
from retrieval.cache.base import CacheConfigError, CacheError
from retrieval.cache.codec import CacheValueError
from retrieval.cache.config import CacheConfig
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
    InvalidWriteError,
    LimitExceededError,
    MalformedFilterError,
    MissingArtifactError,
    OverloadedError,
    QueryDimensionError,
    RequestReplayError,
    RetrievalError,
    RetrieverClosedError,
    SchemaMismatchError,
    SearchAbandonedError,
    SequenceNotReachedError,
    UnknownFieldError,
    UnknownNamedFilterError,
    WriterClosedError,
    WriterLockedError,
)
from retrieval.features.config import FeatureStoreConfig
from retrieval.features.errors import (
    FeatureConfigError,
    FeatureError,
    FeatureRequestError,
    FeatureSchemaError,
    FeatureSourceError,
    FeatureStoreError,
)
from retrieval.features.ranking import FeatureWeights
from retrieval.integrations.errors import (
    IntegrationError,
    MissingExtraError,
    NotASearchBackendError,
    UnsupportedFilterError,
)
from retrieval.models import CacheInfo, Explanation, Hit, SearchResult
from retrieval.publishing.config import GateConfigError
from retrieval.request_path.batching import BatchingConfig
from retrieval.request_path.feature_stage import RecencyWeight
from retrieval.retriever import Retriever
from retrieval.service.errors import (
    AuthenticationError,
    ForbiddenError,
    HeaderTooLargeError,
    MalformedRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RequestFieldError,
    RequestTimeoutError,
    ServerError,
    ServiceConfigError,
    ServiceUnavailableError,
    WriteTimeoutError,
)
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.tracing import TracingConfig

__all__ = [
    "ArtifactError",
    "AuthenticationError",
    "BatchingConfig",
    "CacheConfig",
    "CacheConfigError",
    "CacheError",
    "CacheInfo",
    "CacheValueError",
    "ConfigError",
    "CorpusError",
    "CorruptArtifactError",
    "DistilledEncoderError",
    "EncoderMismatchError",
    "Explanation",
    "FeatureConfigError",
    "FeatureError",
    "FeatureRequestError",
    "FeatureSchemaError",
    "FeatureSourceError",
    "FeatureStoreConfig",
    "FeatureStoreError",
    "FeatureWeights",
    "FilterTypeError",
    "ForbiddenError",
    "FormatVersionError",
    "GateConfigError",
    "HeaderTooLargeError",
    "Hit",
    "IndexWriter",
    "IntegrationError",
    "InvalidQueryError",
    "InvalidWriteError",
    "LimitExceededError",
    "Limits",
    "LiveBuildChangedError",
    "LogCorruptionError",
    "LogGapError",
    "MalformedFilterError",
    "MalformedRequestError",
    "MissingArtifactError",
    "MissingExtraError",
    "NoRollbackTargetError",
    "NotASearchBackendError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "PublishError",
    "QueryDimensionError",
    "RecencyWeight",
    "RequestFieldError",
    "RequestReplayError",
    "RequestTimeoutError",
    "RestoreTargetError",
    "RetrievalError",
    "Retriever",
    "RetrieverClosedError",
    "RetrieverConfig",
    "SchemaMismatchError",
    "SearchAbandonedError",
    "SearchResult",
    "SequenceNotReachedError",
    "ServerError",
    "ServiceConfigError",
    "ServiceUnavailableError",
    "ShardCountError",
    "ShardUnavailableError",
    "SnapshotConflictError",
    "SnapshotCorruptError",
    "TracingConfig",
    "UnknownBackendError",
    "UnknownBuildError",
    "UnknownFieldError",
    "UnknownNamedFilterError",
    "UnsafeMemberError",
    "UnsupportedFilterError",
    "WriteTimeoutError",
    "WriterClosedError",
    "WriterLockedError",
]
