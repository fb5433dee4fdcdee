"""``ShardCalls`` over shards loaded in this process: the reference the Ray Serve runtime's
answers are checked against. Searching a sharded build in this process is ``Retriever.load``
(``retrieval.sharding.whole``), through the one request path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from indexes.sharding import read_layout
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Hit
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.merge import LateScores
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
