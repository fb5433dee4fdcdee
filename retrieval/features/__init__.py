"""Feature store: views, offline sources, nightly materialization, fail-open online reads."""

from retrieval.features.batch import FeatureBatch, FeatureColumns, FeatureStatus
from retrieval.features.config import FeatureStoreConfig, make_store
from retrieval.features.errors import (
    FeatureConfigError,
    FeatureError,
    FeatureRequestError,
    FeatureSchemaError,
    FeatureSourceError,
    FeatureStoreError,
)
from retrieval.features.local import LocalStore
from retrieval.features.materialize import MaterializeReport, materialize
from retrieval.features.ranking import FeatureWeights, feature_adjustment, normalize, recency
from retrieval.features.redis_store import RedisStore
from retrieval.features.scoring import FeatureScores, score_features, snapshot_key
from retrieval.features.sources import (
    CallableSource,
    CsvSource,
    FeatureSource,
    JsonlSource,
    ParquetSource,
    open_source,
)
from retrieval.features.store import OnlineStore, SnapshotWriter
from retrieval.features.view import Feature, FeatureView, SnapshotMeta, load_view

__all__ = [
    "CallableSource",
    "CsvSource",
    "Feature",
    "FeatureBatch",
    "FeatureColumns",
    "FeatureConfigError",
    "FeatureError",
    "FeatureRequestError",
    "FeatureSchemaError",
    "FeatureScores",
    "FeatureSource",
    "FeatureSourceError",
    "FeatureStatus",
    "FeatureStoreConfig",
    "FeatureStoreError",
    "FeatureView",
    "FeatureWeights",
    "JsonlSource",
    "LocalStore",
    "MaterializeReport",
    "OnlineStore",
    "ParquetSource",
    "RedisStore",
    "SnapshotMeta",
    "SnapshotWriter",
    "feature_adjustment",
    "load_view",
    "make_store",
    "materialize",
    "normalize",
    "open_source",
    "recency",
    "score_features",
    "snapshot_key",
]
