"""Shards on Ray Serve: a deployment per shard (with replicas) answers the parts of the one
request path, and ``Retriever.connect`` searches them. Needs the ``ray`` extra.

``serve_shards`` deploys every shard of a sharded build; ``Retriever.connect`` opens the build
as a ``RayShardedBuild``: a ``LoadedBuild`` whose BM25, vectors, dense leg and doc store are
calls to the shard deployments, so the caller's ``Retriever`` runs the same request path as for
a whole build (validation, caches, deadlines, features, grouping, hydration). Its metadata is
one index joined from the shards' at connect (read from the build directory, which the
replicas load too), so filters, named filters and features are evaluated by the caller; each
shard receives its slice of the mask. The document id of each row is read there too (the
shards' doc stores mapped at connect), so finding a document's rows never waits on a shard:
with one down, ``get_documents`` answers for the other shards' ids, and a call asking for an
id it holds fails naming it.

Three round trips a search, all shards at once in each: BM25 top C; the dense leg with the
cosines of the shard's merged candidates and the BM25 scores of its dense rows (so re-rank and
fusion need no further trip; without the dense leg, the cosines alone); hydration of the final
hits. A call whose replica died is sent again (Serve routes it to another replica); when every
attempt fails within ``retry_seconds`` the search fails with ``ShardUnavailableError`` naming
the shard, or, with ``allow_partial``, the other shards answer and the result is flagged
``partial:<shard>`` (a shard lost at hydration, after it answered the earlier trips: its hits
are dropped); one the search's deadline cut short says ``by_deadline`` (a search with more
time may get its answer). Every call names the shard build it is for, so a caller
that reloads a newly published build flips all shards at once (``ShardReplica``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.integrations.errors import MissingExtraError

try:
    import ray
    from ray import serve
    from ray.serve.handle import DeploymentHandle
except ImportError as exc:
    raise MissingExtraError("ray", "ray[data,serve]", __name__) from exc

from indexes.bm25 import BM25Index
from indexes.docstore import DocStore, Document
from indexes.errors import RetrievalError
from indexes.fan_out import search_alone
from indexes.manifest import current_build_dir, read_manifest
from indexes.metadata import MetadataIndex
from indexes.sharding import read_layout
from indexes.sharding.layout import joined_passages
from indexes.storage import load_array
from indexes.warmup import warm_bm25, warm_vectors
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.ray_parts import (
    RemoteBM25,
    RemoteDense,
    RemoteDocs,
    RemoteParts,
    RemoteVectors,
    ShardCalls,
)
from retrieval.sharding.whole import RowOwners, ShardedDocs, joined_metadata

APP_NAME = "retrieval-shards"


@serve.deployment
class ShardReplica:
    """One replica of one shard. Every call names the shard build it is for (its directory):
    the deployed one is loaded (verified, memory-mapped) at start, a newly published one on
    its first call, and the newest ``KEEP`` stay loaded, so searches still running on the
    previous build finish on it while new ones use the next (no search mixes builds)."""

    KEEP = 2

    def __init__(self, shard_dir: str, config: dict[str, Any], root: str | None = None
                 ) -> None:
        self.settings = RetrieverConfig(**config)
        self.builds: dict[str, LoadedBuild] = {}
        self._lock = threading.Lock()
        self.build(start_dir(shard_dir, root))

    def build(self, shard_dir: str) -> LoadedBuild:
        found = self.builds.get(shard_dir)
        if found is not None:
            return found
        with self._lock:  # one load per build, however many calls wait for it
            found = self.builds.get(shard_dir)
            if found is None:
                found = LoadedBuild.load(shard_dir, verify=self.settings.verify_checksums,
                                         mmap=self.settings.mmap)
                warm_bm25(found.bm25)
                warm_vectors(found.vectors)
                self.builds[shard_dir] = found
                while len(self.builds) > self.KEEP:
                    self.builds.pop(next(iter(self.builds)))
            return found

    def prepare(self, shard_dir: str) -> int:
        """Load a shard build ahead of its first search; its row count."""
        return self.build(shard_dir).manifest.n_docs

    def top_candidates(self, shard_dir: str, tokens: list[str], n: int,
                       mask: np.ndarray | None, kernel: str | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        search_alone(False)  # one part of a routed search: the other shards run beside it
        return self.build(shard_dir).bm25.top_candidates(tokens, n, mask, kernel)

    def dense(self, shard_dir: str, query: np.ndarray, k: int, mask: np.ndarray | None,
              tokens: list[str], rows: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The dense top ``k`` in ``mask``, then the cosines of ``rows`` (the shard's merged
        candidates) followed by the dense rows', and the dense rows' BM25 scores."""
        build = self.build(shard_dir)
        dense_rows, dense_scores = build.dense.search(query, k, mask)
        both = np.concatenate([np.asarray(rows, np.int64), dense_rows.astype(np.int64)])
        return (dense_rows, dense_scores, build.vectors.scores(query, both),
                build.bm25.score_rows(tokens, dense_rows))

    def scores(self, shard_dir: str, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.build(shard_dir).vectors.scores(query, rows)

    def score_rows(self, shard_dir: str, tokens: list[str], rows: np.ndarray) -> np.ndarray:
        return self.build(shard_dir).bm25.score_rows(tokens, rows)

    def documents(self, shard_dir: str, rows: np.ndarray) -> list[Document]:
        return self.build(shard_dir).docs.get_many(rows)


def start_dir(shard_dir: str, root: str | None) -> str:
    """The shard build a replica loads as it starts: the deployed one, or, once a ``gc`` has
    deleted it (a replica Serve restarts after newer builds went live), the same shard of the
    build the root's ``CURRENT`` names; each call then names the build it needs."""
    deployed = Path(shard_dir)
    if deployed.is_dir() or root is None:
        return shard_dir
    live = current_build_dir(Path(root))
    same_shard = live / deployed.parent.name / deployed.name if live is not None else None
    return str(same_shard) if same_shard is not None and same_shard.is_dir() else shard_dir


@serve.deployment
class ShardSet:
    """The application's ingress: names the build its shard deployments serve."""

    def __init__(self, build_dir: str, *shards: DeploymentHandle) -> None:
        self.build_dir = build_dir

    def describe(self) -> dict[str, str]:
        return {"build_dir": self.build_dir}


@dataclass(frozen=True)
class RayShardedBuild(LoadedBuild):
    """A sharded build served by Ray Serve deployments, as one ``LoadedBuild``."""

    remote: RemoteParts | None = None

    def local_builds(self) -> Sequence[LoadedBuild]:
        return ()  # the replicas hold the rows (and warm their own kernels)

    def begin_search(self) -> None:
        assert self.remote is not None
        self.remote.begin_search()

    def degradations(self) -> list[str]:
        assert self.remote is not None
        return self.remote.end_search()

    @classmethod
    def connect(cls, path: str | Path, config: RetrieverConfig, *, app_name: str = APP_NAME,
                allow_partial: bool = False, retry_seconds: float = 10.0,
                timeout_seconds: float = 30.0) -> RayShardedBuild:
        """The build ``serve_shards`` deployed from ``path`` under ``app_name``."""
        if not ray.is_initialized():
            raise RetrievalError("connect to a Ray cluster first: ray.init() or "
                                 "ray.init(ADDRESS)")
        directory, layout = read_layout(Path(path), verify=config.verify_checksums)
        manifest = read_manifest(directory)
        names = [entry.name for entry in layout.shards]
        shard_dirs = [layout.shard_dir(directory, i) for i in range(len(names))]
        calls = prepared(names, [str(d) for d in shard_dirs], app_name, retry_seconds,
                         timeout_seconds, directory)
        owners = RowOwners([entry.start for entry in layout.shards], manifest.n_docs)
        parts = RemoteParts(calls, owners, allow_partial)
        metadata = joined_metadata([MetadataIndex.load(d / "metadata") for d in shard_dirs],
                                   owners.bounds[:-1], manifest.n_docs)
        # The global vocabulary; its postings are read by the shards, never here.
        first_bm25 = BM25Index.load(shard_dirs[0] / "bm25", prefault=False)
        doc_freqs = sum(np.diff(load_array(d / "bm25" / "indptr.npy", True)) for d in shard_dirs)
        vectors = RemoteVectors(parts, manifest.encoder.dim, manifest.n_docs)
        first = LoadedBuild.load(shard_dirs[0], verify=False)
        return cls(path=directory, manifest=manifest, analyzer=first.analyzer,
                   bm25=RemoteBM25(parts, first_bm25.vocab_list, manifest.n_docs,
                                   np.asarray(doc_freqs), first_bm25.params, first_bm25.typos),
                   metadata=metadata,
                   vectors=vectors, docs=RemoteDocs(parts, manifest.n_docs,
                                                    local_ids(shard_dirs, owners)),
                   dense=RemoteDense(parts, vectors),
                   passages=joined_passages(directory, layout), remote=parts)


def local_ids(shard_dirs: Sequence[Path], owners: RowOwners) -> ShardedDocs:
    """The shards' doc stores mapped here (nothing read yet) for ``RemoteDocs`` to read their
    ids from: mapped at connect, they stay readable if a shard's directory is lost later."""
    return ShardedDocs([DocStore.load(d / "docstore", mmap=True, prefault=False)
                        for d in shard_dirs], owners)


def prepared(names: list[str], dirs: list[str], app_name: str, retry_seconds: float,
             timeout_seconds: float, directory: Path) -> ShardCalls:
    """Calls to the shard deployments of the build at ``directory``, after a replica of each
    has loaded its shard (the others load it on their first call). A build the deployments
    cannot serve (another shard count, a shard that fails to load) is a ``RetrievalError``:
    a reload then refuses it and the build before it serves on."""
    try:
        handles = [serve.get_deployment_handle(name, app_name=app_name) for name in names]
        calls = ShardCalls(handles, names, dirs, retry_seconds, timeout_seconds)
        answers = calls.gather("prepare", {k: () for k in range(len(names))})
    except Exception as exc:  # noqa: BLE001 - whatever Serve or the replica raised, named
        raise RetrievalError(f"the shard deployments of {app_name!r} cannot serve "
                             f"{directory}: {exc}; deploy it with serve_shards") from exc
    for answer in answers.values():
        if isinstance(answer, ShardUnavailableError):
            raise answer
    return calls


def shards_app(path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
               replicas: int = 1, num_cpus: float = 0.0) -> Any:
    """The Serve application of a sharded build (or the live one of an index root): one
    deployment ``shard-NNN`` of ``replicas`` replicas per shard. ``num_cpus``: CPUs each
    replica reserves in the Ray cluster."""
    if not isinstance(config, RetrieverConfig):
        config = RetrieverConfig(**(config or {}))
    directory, layout = read_layout(Path(path), verify=config.verify_checksums)
    # An index root (not a build directory): what its replicas fall back on (``start_dir``).
    root = str(Path(path).resolve()) if directory != Path(path) else None
    settings = config.model_dump(mode="json")
    actor = {"num_cpus": num_cpus}
    shard_deployment: Any = ShardReplica  # a serve Deployment (the stubs see the class)
    ingress: Any = ShardSet
    shards = [shard_deployment.options(name=entry.name, num_replicas=replicas,
                                       ray_actor_options=actor).bind(
                  str(layout.shard_dir(directory, i)), settings, root)
              for i, entry in enumerate(layout.shards)]
    return ingress.options(name="shards", ray_actor_options=actor).bind(str(directory),
                                                                       *shards)


def serve_shards(path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
                 app_name: str = APP_NAME, **options: Any) -> None:
    """Deploy every shard of the sharded build under ``path`` in the connected Ray cluster
    (``ray.init`` first); ``options`` as ``shards_app``. Then ``Retriever.connect(path)``.

    Serve, when it is not running yet, starts without HTTP proxies: the shards are reached
    through deployment handles only, and a proxy actor per node would hold a port and a
    process for nothing (on a loaded 2-CPU host its start alone outlasted Serve's 60 s
    timeout). To serve other applications over HTTP beside them, ``serve.start`` first."""
    if not ray.is_initialized():
        raise RetrievalError("connect to a Ray cluster first: ray.init() or ray.init(ADDRESS)")
    serve.start(proxy_location="Disabled")  # connects instead when Serve already runs
    serve.run(shards_app(path, config, **options), name=app_name, route_prefix=None)
