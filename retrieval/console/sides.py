"""The two sides of a comparison: the serving build, another build of the root, or either
with ranking settings changed.

Another build is opened as a serving process opens it (verified, memory-mapped) and kept
while it is compared (at most ``MAX_OPEN_BUILDS``); a configuration is
``Retriever.with_ranking`` over that build, kept per (build, settings) (at most
``MAX_VARIANTS``) and closed when it falls out or the build it reads was replaced. The
serving retriever itself answers the side that changes nothing, with its cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import suppress
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from indexes.encoders import Encoder, compatible_query_encoder
from indexes.history import live_build_id
from indexes.publish import UnknownBuildError, build_dir, list_builds
from retrieval.loaded_build import LoadedBuild
from retrieval.query_encoder import default_encoder
from retrieval.retriever import Retriever
from retrieval.sharding.whole import open_build

MAX_OPEN_BUILDS = 2
MAX_VARIANTS = 4
NAME_MAX = 255  # bytes of one file name (Linux, macOS)


class Ranking(BaseModel):
    """Ranking settings one side changes (``Retriever.with_ranking``); unset keeps the
    server's."""

    model_config = ConfigDict(extra="forbid", strict=True)

    fusion: Literal["minmax", "zscore", "rrf"] | None = None
    vector_weight: float | None = Field(None, ge=0.0, le=1.0)
    rrf_k: int | None = Field(None, ge=1)
    candidate_policy: Literal["keyword", "guardrail", "union"] | None = None
    dense_candidates: int | None = Field(None, ge=1)

    def changes(self) -> dict[str, object]:
        return self.model_dump(exclude_none=True)


class Side(BaseModel):
    """One side: a build of the root (None: the one serving) and its ranking settings."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # min_length: "" was taken as the serving build, hiding a page or client that lost the id
    build: str | None = Field(None, min_length=1,
                              description="a build id of GET /v1/console/schema's builds; none: "
                              "the build this server serves (with its live writes)")
    ranking: Ranking = Field(default_factory=Ranking)


class Sides:
    """Retrievers for sides, opened on first use and closed when no longer kept."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._builds: OrderedDict[str, tuple[LoadedBuild, Encoder | None]] = OrderedDict()
        self._variants: OrderedDict[tuple[int, str], Retriever] = OrderedDict()

    def retriever(self, serving: Retriever, side: Side) -> Retriever:
        """The retriever that answers ``side`` (the serving one when nothing changes)."""
        changes = side.ranking.changes()
        other = side.build not in (None, serving.build_id)
        if not other and not changes:
            return serving
        snapshot, encoder = (self._open(serving, side.build) if other and side.build
                             else (serving.snapshot, serving.encoder))
        key = (id(snapshot), side.ranking.model_dump_json())
        with self._lock:
            kept = self._variants.get(key)
            if kept is not None:
                self._variants.move_to_end(key)
                return kept
        variant = serving.with_ranking(snapshot, encoder, **changes)
        with self._lock:
            self._variants[key] = variant
            stale = self._drop_stale(serving, keep=key)
        for retriever in stale:
            retriever.close()
        return variant

    def build_path(self, build_id: str | None) -> Path:
        """A build's directory (None: the live one); ``UnknownBuildError`` naming the builds
        there (not the server's paths)."""
        wanted = live_build_id(self.root) if build_id is None else build_id
        # A name longer than a file's can be is no build (looking for it raised OSError:
        # File name too long, a 500).
        if wanted is not None and len(wanted.encode("utf-8", "surrogatepass")) <= NAME_MAX:
            with suppress(UnknownBuildError):
                return build_dir(self.root, wanted)
        known = ", ".join(b.build_id for b in list_builds(self.root)) or "none"
        raise UnknownBuildError(f"no build {wanted!r} in this index (builds there: {known})")

    def close(self) -> None:
        with self._lock:
            variants = list(self._variants.values())
            self._variants.clear()
            self._builds.clear()
        for retriever in variants:
            retriever.close()

    def _open(self, serving: Retriever, build_id: str) -> tuple[LoadedBuild, Encoder | None]:
        with self._lock:
            kept = self._builds.get(build_id)
            if kept is not None:
                self._builds.move_to_end(build_id)
                return kept
        config = serving.config
        snapshot = open_build(self.build_path(build_id), verify=config.verify_checksums,
                              mmap=config.mmap)
        encoder = serving.encoder
        if encoder is None or not compatible_query_encoder(
                encoder.encoder_id, snapshot.manifest.encoder.encoder_id):
            encoder = default_encoder(snapshot, config, self.root)
        with self._lock:
            self._builds[build_id] = (snapshot, encoder)
            while len(self._builds) > MAX_OPEN_BUILDS:
                self._builds.popitem(last=False)
        return snapshot, encoder

    def _drop_stale(self, serving: Retriever, keep: tuple[int, str]) -> list[Retriever]:
        """Variants past the bound, or over a build no longer kept (nor serving), except
        ``keep`` (about to answer); the lock is held."""
        alive = {id(serving.snapshot), keep[0]} | {id(s) for s, _ in self._builds.values()}
        stale = [key for key in self._variants if key[0] not in alive]
        stale += [key for key in list(self._variants)[:-MAX_VARIANTS] if key not in stale]
        return [self._variants.pop(key) for key in stale]
