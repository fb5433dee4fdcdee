"""The in-process runtime: every shard loaded in this process, searched by threads.

For one big machine: the shards' kernels (numba, numpy, BLAS) release the GIL, so S shards are
searched in parallel by S - 1 pool threads plus the caller's thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from indexes.encoders import Encoder
from indexes.manifest import read_manifest
from indexes.sharding import read_layout
from retrieval.cache import Cache, make_cache
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.models import Hit
from retrieval.request import SearchRequest
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.router import ShardRouter, router_encoder
from retrieval.sharding.shard import HitRequest, Shard, ShardAnswer


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
    benchmarks/README.md: on 2 busy cores the hand-off costs more than it saves).
    """

    def __init__(self, shards: Sequence[Shard], config: RetrieverConfig,
                 parallel: bool = False) -> None:
        self.shards = list(shards)
        self.names = [s.name for s in self.shards]
        self.config = config
        self.parallel = parallel
        self._pool = ThreadPoolExecutor(max(1, len(self.shards) - 1),
                                        thread_name_prefix="shard")

    def answer_all(self, request: SearchRequest, vector: np.ndarray
                   ) -> list[ShardAnswer | ShardUnavailableError]:
        if not self.parallel:
            return [s.answer(request, vector, self.config) for s in self.shards]
        first, *rest = self.shards
        futures = [self._pool.submit(s.answer, request, vector, self.config) for s in rest]
        mine = first.answer(request, vector, self.config)
        return [mine, *(f.result() for f in futures)]

    def hydrate(self, wanted: dict[int, list[HitRequest]]) -> dict[int, list[Hit]]:
        return {shard: self.shards[shard].hits(items) for shard, items in wanted.items()}

    def close(self) -> None:
        self._pool.shutdown(wait=False)


class ShardedRetriever(ShardRouter):
    """``Retriever.search`` over a sharded build, every shard in this process."""

    calls: LocalShards

    @classmethod
    def load(cls, path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
             encoder: Encoder | None = None, cache: Cache | None = None,
             parallel: bool = False) -> ShardedRetriever:
        """Load every shard of a sharded build (or of the live build of an index root);
        ``parallel`` as ``LocalShards``."""
        if not isinstance(config, RetrieverConfig):
            config = RetrieverConfig(**(config or {}))
        directory, shards = load_shards(path, config)
        manifest = read_manifest(directory)
        if encoder is None:
            encoder = router_encoder(manifest, config)
        retriever = cls(manifest, [s.start for s in shards], LocalShards(shards, config, parallel),
                        config, encoder, cache or make_cache(config.cache))
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
        if self.cache is not None:
            self.cache.cache.close()

    def __enter__(self) -> ShardedRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
