"""One loaded, verified build: every index component of it, memory-mapped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from indexes.analyzer import Analyzer, AnalyzerConfig
from indexes.ann import ExactDense, load_dense
from indexes.bm25 import BM25Index
from indexes.doc_ids import BuildIds
from indexes.docstore import DocStore
from indexes.errors import ArtifactError, CorruptArtifactError
from indexes.manifest import MANIFEST, Manifest, read_manifest, resolve_build_dir, verify_build
from indexes.metadata import MetadataIndex
from indexes.passages import PassageMap
from indexes.sharding.layout import SHARDS_FILE
from indexes.vectors import VectorStore


@dataclass(frozen=True)
class LoadedBuild:
    """An immutable index build; a request holds one from start to end."""

    path: Path
    manifest: Manifest
    analyzer: Analyzer
    bm25: BM25Index
    metadata: MetadataIndex
    vectors: VectorStore
    docs: DocStore
    dense: ExactDense  # the dense leg: IVF when the build has one, else exact search
    passages: PassageMap | None = None  # rows are passages of documents (passage builds)

    def __post_init__(self) -> None:
        if self.metadata.ids is None:  # a live snapshot sets its own (``retrieval.live``)
            self.metadata.ids = BuildIds(self.docs)

    @property
    def build_id(self) -> str:
        return self.manifest.build_id

    def local_builds(self) -> Sequence[LoadedBuild]:
        """The whole builds in this process that hold its rows: itself, or its shards."""
        return (self,)

    def begin_search(self) -> None:
        """A search starts on this thread: a layout that keeps per-search state (what a
        remote layout fetched, the shards it left out) starts it afresh."""

    def degradations(self) -> list[str]:
        """What the search running on this thread lost to its layout (a remote shard left
        out: ``partial:<shard>``), taken once at its end; a loaded build loses nothing."""
        return []

    @classmethod
    def load(cls, path: str | Path, *, verify: bool = True, mmap: bool = True) -> LoadedBuild:
        """Load a build directory or the live build of an index root.

        Raises MissingArtifactError / CorruptArtifactError / FormatVersionError naming the file.
        """
        directory = resolve_build_dir(Path(path))
        if (directory / SHARDS_FILE).is_file():
            raise ArtifactError(f"{directory} is a sharded build: open it with "
                                "Retriever.load (or retrieval.sharding.open_build)", directory)
        manifest = read_manifest(directory)
        if verify:
            verify_build(directory, manifest)
        analyzer = Analyzer(AnalyzerConfig(**manifest.analyzer))
        if analyzer.fingerprint != manifest.analyzer_fingerprint:
            raise CorruptArtifactError(
                f"{directory / MANIFEST}: analyzer fingerprint {manifest.analyzer_fingerprint} "
                f"does not match this installation's {analyzer.fingerprint} (a different stemmer "
                "version?); rebuild the index",
                directory / MANIFEST,
            )
        vectors = VectorStore.load(directory / "vectors", mmap)
        build = cls(
            path=directory,
            manifest=manifest,
            analyzer=analyzer,
            bm25=BM25Index.load(directory / "bm25", mmap),
            metadata=MetadataIndex.load(directory / "metadata", mmap),
            vectors=vectors,
            docs=DocStore.load(directory / "docstore", mmap),
            dense=load_dense(directory, vectors),
            passages=(PassageMap.load(directory / "passages", mmap)
                      if manifest.passages is not None else None),
        )
        build._check_shapes()
        return build

    def _check_shapes(self) -> None:
        n = self.manifest.n_docs
        parts = {"bm25": self.bm25.n_docs, "metadata": self.metadata.n_docs,
                 "vectors": self.vectors.n_docs, "docstore": len(self.docs)}
        if self.passages is not None:
            parts["passages"] = self.passages.n_rows
        for name, count in parts.items():
            if count != n:
                raise CorruptArtifactError(
                    f"{self.path / name} holds {count} documents but the manifest says {n}; "
                    "rebuild the index", self.path / name)
        if self.vectors.dim != self.manifest.encoder.dim:
            raise CorruptArtifactError(
                f"{self.path / 'vectors'} has dimension {self.vectors.dim}, manifest says "
                f"{self.manifest.encoder.dim}; rebuild the index", self.path / "vectors")


@dataclass(frozen=True)
class LiveBuild(LoadedBuild):
    """A build with the log's writes applied (``retrieval.live``): its parts wrap those of
    ``base``, whose per-search state (a remote layout's) is this one's."""

    base: LoadedBuild | None = None

    def begin_search(self) -> None:
        assert self.base is not None
        self.base.begin_search()

    def degradations(self) -> list[str]:
        assert self.base is not None
        return self.base.degradations()
