"""The in-process runtime: every shard loaded in this process, searched by threads.

For one big machine: the shards' kernels (numba, numpy, BLAS) release the GIL, so S shards are
searched in parallel by S - 1 pool threads plus the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from indexes.encoders import Encoder
from indexes.manifest import read_manifest
from indexes.sharding import read_layout
from retrieval.cache import Cache, make_cache
from retrieval.config import RetrieverConfig
from retrieval.feature_stage import FeatureStage
from retrieval.features import OnlineStore, make_store
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Hit
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.merge import LateScores
from retrieval.sharding.router import RouterFeatures, ShardRouter, router_encoder
from retrieval.sharding.shard import FinalHits, Shard, ShardAnswer, ShardQuery


def load_shards(path: str | Path, config: RetrieverConfig) -> tuple[Path, list[Shard]]:
    """(build directory, every shard loaded and verified) of a sharded build or index root."""
    directory, layout = read_layout(Path(path), verify=config.verify_checksums)
    shards = [Shard(i, LoadedBuild.load(layout.shard_dir(directory, i),
                                        verify=config.verify_checksums, mmap=config.mmap),
                    entry.start)
              for i, entry in enumerate(layout.shards)]
    return directory, shards


class LocalShards:
    """``ShardCalls`` over shards in this process.

    ``parallel``: shards answer in pool threads (a big machine with idle cores); otherwise one
    after the other on the caller's thread, which pays no thread hand-off (measured in
    benchmarks/README.md: on 2 busy cores the hand-off costs more than it saves). Either way
    the shards leave re-ranking to the router (``late``): only the merged candidates are scored.
    """

    def __init__(self, shards: Sequence[Shard], config: RetrieverConfig,
                 parallel: bool = False) -> None:
        self.shards = list(shards)
        self.names = [s.name for s in self.shards]
        self.starts = np.array([s.start for s in self.shards], dtype=np.int64)
        self.config = config
        self.parallel = parallel
        self.late: LateScores | None = self
        self._pool = ThreadPoolExecutor(max(1, len(self.shards) - 1),
                                        thread_name_prefix="shard")

    def answer_all(self, query: ShardQuery) -> list[ShardAnswer | ShardUnavailableError]:
        if not self.parallel:
            return [s.answer(query, self.config) for s in self.shards]
        first, *rest = self.shards
        futures = [self._pool.submit(s.answer, query, self.config) for s in rest]
        mine = first.answer(query, self.config)
        return [mine, *(f.result() for f in futures)]

    def cosines(self, query: ShardQuery, rows: np.ndarray) -> np.ndarray:
        return self._per_owner(rows, np.float32, lambda shard, local: shard.cosines(query, local))

    def bm25_of(self, query: ShardQuery, rows: np.ndarray) -> np.ndarray:
        return self._per_owner(rows, np.float64, lambda shard, local: shard.bm25_of(query, local))

    def _per_owner(self, rows: np.ndarray, dtype: type,
                   score: Callable[[Shard, np.ndarray], np.ndarray]) -> np.ndarray:
        """``score`` of global ``rows``, each asked of the shard that owns it."""
        owners = np.searchsorted(self.starts, rows, side="right") - 1
        by_owner = np.argsort(owners, kind="stable")  # each shard's rows, one slice each
        bounds = np.searchsorted(owners[by_owner], np.arange(len(self.shards) + 1)).tolist()
        out: np.ndarray = np.empty(rows.size, dtype=dtype)
        for shard, lo, hi in zip(self.shards, bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                at = by_owner[lo:hi]
                out[at] = score(shard, rows[at] - shard.start)
        return out

    def hydrate(self, final: FinalHits) -> list[Hit]:
        owners = np.searchsorted(self.starts, final.rows, side="right") - 1
        return [self.shards[owner].hit(*item)
                for owner, item in zip(owners.tolist(), final.items(), strict=True)]

    def close(self) -> None:
        self._pool.shutdown(wait=False)


class _AllIds:
    def __init__(self, shards: Sequence[Shard]) -> None:
        self._shards = shards

    def all_ids(self) -> list[str]:
        return [doc_id for shard in self._shards for doc_id in shard.snapshot.docs.all_ids()]


class _Columns:
    def __init__(self, shards: Sequence[Shard]) -> None:
        self._shards = shards
        self._columns: dict[str, np.ndarray] = {}  # joined once per field

    def numeric_column(self, field: str) -> np.ndarray:
        column = self._columns.get(field)
        if column is None:
            column = np.concatenate([np.asarray(s.snapshot.metadata.numeric_column(field))
                                     for s in self._shards])
            self._columns[field] = column
        return column


@dataclass(frozen=True)
class WholeRows:
    """What the feature stage reads of a build (``FeatureStage.apply``: the build id, the doc
    ids and the numeric metadata columns by row) over every shard, in global row order."""

    build_id: str
    docs: _AllIds
    metadata: _Columns

    @classmethod
    def of(cls, build_id: str, shards: Sequence[Shard]) -> WholeRows:
        return cls(build_id, _AllIds(shards), _Columns(shards))


def feature_stage(config: RetrieverConfig, store: OnlineStore | None) -> FeatureStage | None:
    """The feature stage ``Retriever`` would run with this config and store, or None."""
    if not ((store is not None and config.features) or config.recency):
        return None
    return FeatureStage(store, config.features, config.recency,
                        config.feature_snapshot_refresh_seconds)


class ShardedRetriever(ShardRouter):
    """``Retriever.search`` over a sharded build, every shard in this process. Features and
    recency, as configured for ``Retriever``, re-score the merged candidates at the router."""

    calls: LocalShards

    @classmethod
    def load(cls, path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
             encoder: Encoder | None = None, cache: Cache | None = None,
             parallel: bool = False, feature_store: OnlineStore | None = None
             ) -> ShardedRetriever:
        """Load every shard of a sharded build (or of the live build of an index root);
        ``parallel`` as ``LocalShards``; ``feature_store`` as ``Retriever.load``."""
        if not isinstance(config, RetrieverConfig):
            config = RetrieverConfig(**(config or {}))
        directory, shards = load_shards(path, config)
        manifest = read_manifest(directory)
        if encoder is None:
            encoder = router_encoder(manifest, config)
        if feature_store is None and config.feature_store is not None:
            feature_store = make_store(config.feature_store)
        stage = feature_stage(config, feature_store)
        rows = cast(LoadedBuild, WholeRows.of(manifest.build_id, shards))  # duck-typed
        features = RouterFeatures(stage, rows) if stage is not None else None
        retriever = cls(manifest, LocalShards(shards, config, parallel), config, encoder,
                        cache or make_cache(config.cache), features=features)
        if stage is not None:
            try:
                stage.check()
            except BaseException:
                retriever.close()
                raise
            stage.start()
            stage.doc_ids(rows)  # the ids feature reads are keyed by, joined once
        for shard in shards:
            shard.warm_up()
        if encoder is not None:
            encoder.encode(["warm up"])
        return retriever

    @property
    def shards(self) -> list[Shard]:
        return self.calls.shards

    def close(self) -> None:
        self.calls.close()
        if self.features is not None:
            self.features.stage.stop()
        if self.cache is not None:
            self.cache.cache.close()

    def __enter__(self) -> ShardedRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
