"""The router of a sharded search: validate, encode once, fan out, merge once, hydrate.

The router is the same for every runtime; a runtime (``ShardCalls``) only carries the two
calls to the shards: in-process threads over local shards (``local``) or Ray Serve handles
(``ray_serve``). The result cache and the embedding cache sit here, at the router, keyed like
the unsharded ``Retriever``'s (the sharded build's id is part of every key).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from indexes.analyzer import Analyzer, AnalyzerConfig
from indexes.encoders import DEFAULT_MODEL, Encoder, compatible_query_encoder
from indexes.errors import EncoderMismatchError, InvalidQueryError
from indexes.manifest import Manifest
from retrieval.cache import Cache
from retrieval.config import RetrieverConfig
from retrieval.errors import ConfigError
from retrieval.feature_stage import FeatureStage
from retrieval.loaded_build import LoadedBuild
from retrieval.models import CacheInfo, Hit, SearchResult
from retrieval.pipeline import apply_features, query_tokens
from retrieval.request import FilterMemo, SearchRequest, validate
from retrieval.request_cache import RequestCache
from retrieval.request_path import served_from_cache
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.merge import LateScores, merge_answers
from retrieval.sharding.shard import FinalHits, ShardAnswer, ShardQuery
from retrieval.timing import StageTimer


class ShardCalls(Protocol):
    """How a runtime reaches the shards. Both calls raise ``ShardUnavailableError`` (or
    return it in place of an answer) for a shard with no live replica. ``late``: where the
    merged candidates are re-ranked when the shards leave it to the router (in-process), None
    when the shards re-rank their own candidates (one round trip over the network)."""

    @property
    def names(self) -> Sequence[str]: ...

    @property
    def late(self) -> LateScores | None: ...

    def answer_all(self, query: ShardQuery) -> list[ShardAnswer | ShardUnavailableError]: ...

    def hydrate(self, final: FinalHits) -> list[Hit]: ...


def router_encoder(manifest: Manifest, config: RetrieverConfig) -> Encoder | None:
    """The query encoder a sharded build names (as ``retriever.default_encoder``)."""
    if config.encoder_model_path is None and manifest.encoder.model != DEFAULT_MODEL:
        return None
    from indexes.onnx_encoder import make_encoder

    if config.encoder_backend == "torch":
        from indexes.encoders import SentenceTransformerEncoder

        return SentenceTransformerEncoder(config.encoder_model_path)
    return make_encoder(config.encoder_backend, config.encoder_model_path)


def check_config(config: RetrieverConfig, features: RouterFeatures | None) -> None:
    wanted = config.features or config.recency is not None or config.feature_store is not None
    if wanted and features is None:
        raise ConfigError("features and recency are supported on sharded builds opened in "
                          "this process (Retriever.load) only; remove them from the config of "
                          "a sharded index served on Ray", "features")


@dataclass(frozen=True)
class RouterFeatures:
    """The feature stage at the router, applied after the merge as unsharded after fusion;
    ``rows``: what it reads of the index (doc ids, metadata columns) over global rows."""

    stage: FeatureStage
    rows: LoadedBuild


class ShardRouter:
    """Searches a sharded build through ``calls``; thread-safe."""

    def __init__(self, manifest: Manifest, calls: ShardCalls,
                 config: RetrieverConfig, encoder: Encoder | None, cache: Cache | None = None,
                 allow_partial: bool = False, features: RouterFeatures | None = None) -> None:
        check_config(config, features)
        if encoder is not None and (
                not compatible_query_encoder(encoder.encoder_id, manifest.encoder.encoder_id)
                or encoder.dim != manifest.encoder.dim):
            raise EncoderMismatchError(
                f"query encoder {encoder.encoder_id!r} does not match the index's "
                f"{manifest.encoder.encoder_id!r}; use the encoder the index was built with")
        self.manifest = manifest
        self.analyzer = Analyzer(AnalyzerConfig(**manifest.analyzer))  # the shards' analyzer
        self.calls = calls
        self.config = config
        self.encoder = encoder
        self.allow_partial = allow_partial
        self.features = features
        self.filters = FilterMemo(manifest.metadata_fields, config.limits)
        self.cache = RequestCache(cache, config.cache) if cache is not None else None
        self._config_key = config.fingerprint()

    @property
    def build_id(self) -> str:
        return self.manifest.build_id

    def search(self, query: str, filters: dict[str, Any] | str | None = None,
               k: int | None = None, *, candidates: int | None = None,
               query_vector: np.ndarray | None = None) -> SearchResult:
        """As ``Retriever.search``: the best ``k`` documents of all shards."""
        timer = StageTimer()
        request = validate(query, filters, k, candidates, self.config, self.filters)
        lookup = None
        if self.cache is not None and query_vector is None:
            lookup = self.cache.lookup_many([self._keys(request)], self.build_id,
                                            self.manifest.encoder.dim)[0]
            timer.lap("cache")
            if lookup.result is not None:
                return served_from_cache(lookup.result, request, timer)
        cached = lookup.embedding if lookup is not None else None
        vector = cached if cached is not None else query_vector
        if vector is None:
            vector = self._encode(request.query)
            timer.lap("embed")
        result = self._search(request, vector, timer)
        status: Any = "hit" if cached is not None else (
            "provided" if query_vector is not None else "miss")
        result.cache = CacheInfo(result="miss" if lookup is not None else "off",
                                 embedding=status)
        if lookup is not None and self.cache is not None and not result.degraded:
            self.cache.store(lookup, result, vector)
        return result

    def _keys(self, request: SearchRequest) -> tuple[str, str | None]:
        assert self.cache is not None
        return self.cache.keys(
            build_id=self.build_id,
            snapshot_id=self.features.stage.snapshot_key() if self.features else "",
            config_key=f"{self._config_key}:{request.candidates}", query=request.query,
            filter_key=request.filter_key, k=request.k,
            encoder_id=self.encoder.encoder_id if self.encoder is not None else None)

    def _encode(self, text: str) -> np.ndarray:
        if self.encoder is None:
            raise InvalidQueryError("this index was built from external vectors: pass "
                                    "query_vector (its encoder is not known here)")
        return np.asarray(self.encoder.encode([text])[0], dtype=np.float32)

    def _checked(self, vector: np.ndarray) -> np.ndarray:
        """The query vector as float32 (d,), its dimension checked once for every shard."""
        vector = np.asarray(vector, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.manifest.encoder.dim:
            raise EncoderMismatchError(
                f"query vector has dimension {vector.shape[0]} but the index holds "
                f"{self.manifest.encoder.dim}-dimensional vectors; use the encoder the index "
                "was built with")
        return vector

    def _search(self, request: SearchRequest, vector: np.ndarray, timer: StageTimer
                ) -> SearchResult:
        vector = self._checked(vector)
        tokens = query_tokens(self.analyzer, request.query, self.config)
        late = self.calls.late
        query = ShardQuery(request, tokens, vector, rerank=late is None)
        outcomes = self.calls.answer_all(query)
        timer.lap("shards")
        answers = [o for o in outcomes if not isinstance(o, ShardUnavailableError)]
        missing = [o for o in outcomes if isinstance(o, ShardUnavailableError)]
        if missing and (not self.allow_partial or not answers):
            raise missing[0]  # partial answers need at least one shard that answered
        merged = merge_answers(answers, query, self.config, late)
        timer.lap("merge")
        order, fused, outcome = merged.order, merged.fused, None
        if self.features is not None:
            order, fused, outcome = apply_features(self.features.rows, merged.rows, fused,
                                                   request.k, self.config, self.features.stage)
            timer.lap("features")
        hits = self.calls.hydrate(FinalHits(merged.rows[order], fused[order],
                                            merged.bm25[order], merged.cosine[order],
                                            outcome.per_hit if outcome is not None else None))
        timer.lap("hydrate")
        return SearchResult(query=request.query, hits=hits, timings=timer.finish(),
                            build_id=self.build_id, candidates=merged.candidates,
                            allowed=merged.allowed,
                            feature_snapshot_id=outcome.snapshot_id if outcome else None,
                            features_available=outcome.available if outcome else None,
                            degraded=[f"partial:{failure.shard}" for failure in missing])
