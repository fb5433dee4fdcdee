"""Feature store: views, offline sources, nightly materialization, fail-open online reads.

The offline names (``materialize``, the sources) are imported on first use: they need pyarrow
and tqdm, which serving (``import retrieval``) must not load.
"""

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING, Any

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
from retrieval.features.ranking import FeatureWeights, feature_adjustment, normalize, recency
from retrieval.features.redis_store import RedisStore
from retrieval.features.scoring import FeatureScores, score_features, snapshot_key
from retrieval.features.store import OnlineStore, SnapshotWriter
from retrieval.features.view import Feature, FeatureView, SnapshotMeta, load_view

if TYPE_CHECKING:  # the real imports happen in __getattr__, on first use
    from retrieval.features.materialize import MaterializeReport, materialize
    from retrieval.features.sources import (
        CallableSource,
        CsvSource,
        FeatureSource,
        JsonlSource,
        ParquetSource,
        open_source,
    )

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
    "MaterializeReport": "retrieval.features.materialize",
    "materialize": "retrieval.features.materialize",
    "CallableSource": "retrieval.features.sources",
    "CsvSource": "retrieval.features.sources",
    "FeatureSource": "retrieval.features.sources",
    "JsonlSource": "retrieval.features.sources",
    "ParquetSource": "retrieval.features.sources",
    "open_source": "retrieval.features.sources",
}


def __getattr__(name: str) -> Any:
    if name in _OFFLINE:
        value = getattr(import_module(_OFFLINE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    """Keeps ``retrieval.features.materialize`` naming the function: importing the submodule of
    the same name would otherwise rebind the package attribute to the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OFFLINE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
