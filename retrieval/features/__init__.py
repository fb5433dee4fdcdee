"""Feature store: views and snapshot formats, fail-open online reads; the nightly job
(sources, materialization, writers) is the ``offline`` subpackage.

The offline names (``materialize``, the sources, ``SnapshotWriter``) are imported on first use:
they need pyarrow and tqdm, which serving (``import retrieval``) must not load, and the online
half never imports the offline one.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

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
from retrieval.features.ranking import FeatureWeights, feature_adjustment, normalize, recency
from retrieval.features.reads import FeatureBatch, FeatureColumns, FeatureStatus
from retrieval.features.redis_store import RedisStore
from retrieval.features.scoring import FeatureScores, score_features, snapshot_key
from retrieval.features.store import OnlineStore
from retrieval.features.view import Feature, FeatureView, SnapshotMeta, load_view

if TYPE_CHECKING:  # the real imports happen in __getattr__, on first use
    from retrieval.features.offline.materialize import MaterializeReport, materialize
    from retrieval.features.offline.sources import (
        CallableSource,
        CsvSource,
        FeatureSource,
        JsonlSource,
        ParquetSource,
        open_source,
    )
    from retrieval.features.offline.writer_base import SnapshotWriter

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

_OFFLINE = {
    "MaterializeReport": "retrieval.features.offline.materialize",
    "SnapshotWriter": "retrieval.features.offline.writer_base",
    "materialize": "retrieval.features.offline.materialize",
    "CallableSource": "retrieval.features.offline.sources",
    "CsvSource": "retrieval.features.offline.sources",
    "FeatureSource": "retrieval.features.offline.sources",
    "JsonlSource": "retrieval.features.offline.sources",
    "ParquetSource": "retrieval.features.offline.sources",
    "open_source": "retrieval.features.offline.sources",
}


def __getattr__(name: str) -> Any:
    if name in _OFFLINE:
        value = getattr(import_module(_OFFLINE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

