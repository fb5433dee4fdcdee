"""The two sides of a comparison: the serving build, another build of the root, or either
with ranking settings changed.

Another build is opened as a serving process opens it (verified, memory-mapped) and kept
while it is compared (at most ``MAX_OPEN_BUILDS``); a configuration is
``Retriever.with_ranking`` over that build, kept per (build, settings) (at most
``MAX_VARIANTS``) and dropped when it falls out or the build it reads was replaced. The
serving retriever itself answers the side that changes nothing, with its cache.

A request holds the retriever of its side by a lease (``lease``, ``alease``): a variant dropped
while leased is retired, and closed when its last lease ends, not under a search still
running on it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
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


@dataclass(eq=False)
class Variant:
    """A ``with_ranking`` retriever and the leases on it (counted under ``Sides``' lock)."""

    retriever: Retriever
    leases: int = 0


@dataclass(frozen=True)
class Lease:
    """A side's retriever, held until ``Sides.release``; ``variant`` is None for the serving
    retriever, which the service closes itself."""

    retriever: Retriever
    variant: Variant | None


class Sides:
    """Retrievers for sides, opened on first use and closed when no longer kept nor leased."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._builds: OrderedDict[str, tuple[LoadedBuild, Encoder | None]] = OrderedDict()
        self._variants: OrderedDict[tuple[int, str], Variant] = OrderedDict()
        self._retiring: set[Variant] = set()  # dropped while leased

    @contextmanager
    def lease(self, serving: Retriever, side: Side) -> Iterator[Retriever]:
        """The retriever that answers ``side`` (the serving one when nothing changes), open
        until the block ends."""
        held = self.acquire(serving, side)
        try:
            yield held.retriever
        finally:
            self.release(held)

    @asynccontextmanager
    async def alease(self, serving: Retriever, side: Side) -> AsyncIterator[Retriever]:
        """``lease`` for the event loop: opening a build or a variant, and closing the last
        lease of a retired one, run in a worker thread."""
        acquiring = asyncio.ensure_future(asyncio.to_thread(self.acquire, serving, side))
        try:
            # shield: a cancelled request still gets the lease its thread takes, to end it
            held = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            acquiring.add_done_callback(self._end_unclaimed)
            raise
        try:
            yield held.retriever
        finally:
            closing = self._unlease(held)
            if closing is not None:
                await asyncio.to_thread(closing.close)

    def acquire(self, serving: Retriever, side: Side) -> Lease:
        """A lease on the retriever that answers ``side``; end it with ``release``."""
        changes = side.ranking.changes()
        other = side.build not in (None, serving.build_id)
        if not other and not changes:
            return Lease(serving, None)
        snapshot, encoder = (self._open(serving, side.build) if other and side.build
                             else (serving.snapshot, serving.encoder))
        key = (id(snapshot), side.ranking.model_dump_json())
        with self._lock:
            kept = self._lease_kept(key)
        if kept is not None:
            return kept
        made = Variant(serving.with_ranking(snapshot, encoder, **changes), leases=1)
        with self._lock:
            # Another request may have made the same variant meanwhile: the first one kept
            # is used and this one closed (replacing it in the map left it open for good).
            kept = self._lease_kept(key)
            if kept is None:
                self._variants[key] = made
                closing = self._drop_stale(serving, keep=key)
        if kept is not None:
            made.retriever.close()
            return kept
        for retriever in closing:
            retriever.close()
        return Lease(made.retriever, made)

    def release(self, held: Lease) -> None:
        """End a lease; the last one of a retired variant closes it."""
        closing = self._unlease(held)
        if closing is not None:
            closing.close()

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
        """Close every variant, leased ones too: the service closes it once it has stopped
        answering."""
        with self._lock:
            variants = [*self._variants.values(), *self._retiring]
            self._variants.clear()
            self._retiring.clear()
            self._builds.clear()
        for variant in variants:
            variant.retriever.close()

    def _lease_kept(self, key: tuple[int, str]) -> Lease | None:
        """A lease on the variant kept for ``key``, if any; the lock is held."""
        kept = self._variants.get(key)
        if kept is None:
            return None
        self._variants.move_to_end(key)
        kept.leases += 1
        return Lease(kept.retriever, kept)

    def _unlease(self, held: Lease) -> Retriever | None:
        """Count a lease ended; the retriever to close when it was a retired variant's last."""
        variant = held.variant
        if variant is None:
            return None
        with self._lock:
            variant.leases -= 1
            if variant.leases or variant not in self._retiring:
                return None
            self._retiring.discard(variant)
        return variant.retriever

    def _end_unclaimed(self, acquiring: asyncio.Future[Lease]) -> None:
        """End the lease a cancelled ``alease`` took in its thread (nobody holds it)."""
        if acquiring.cancelled() or acquiring.exception() is not None:
            return
        closing = self._unlease(acquiring.result())
        if closing is not None:
            asyncio.get_running_loop().run_in_executor(None, closing.close)

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
            # One copy per build, so the variants over it share their key's snapshot.
            opened = self._builds.setdefault(build_id, (snapshot, encoder))
            self._builds.move_to_end(build_id)
            while len(self._builds) > MAX_OPEN_BUILDS:
                self._builds.popitem(last=False)
        return opened

    def _drop_stale(self, serving: Retriever, keep: tuple[int, str]) -> list[Retriever]:
        """Drop the variants past the bound, or over a build no longer kept (nor serving),
        except ``keep`` (about to answer); the lock is held. Returns the dropped ones to close
        now; a leased one is retired, and closed by its last lease."""
        alive = {id(serving.snapshot), keep[0]} | {id(s) for s, _ in self._builds.values()}
        stale = [key for key in self._variants if key[0] not in alive]
        stale += [key for key in list(self._variants)[:-MAX_VARIANTS] if key not in stale]
        closing = []
        for key in stale:
            variant = self._variants.pop(key)
            if variant.leases:
                self._retiring.add(variant)
            else:
                closing.append(variant.retriever)
        return closing
