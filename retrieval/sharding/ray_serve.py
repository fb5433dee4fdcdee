"""Shards on Ray Serve: a deployment per shard (with replicas) answers the parts of the one
request path, and ``Retriever.connect`` searches them. Needs the ``ray`` extra.

``serve_shards`` deploys every shard of a sharded build; ``Retriever.connect`` opens the build
as a ``RayShardedBuild``: a ``LoadedBuild`` whose BM25, vectors, dense leg and doc store are
calls to the shard deployments, so the caller's ``Retriever`` runs the same request path as for
a whole build (validation, caches, deadlines, features, grouping, hydration). Its metadata is
one index joined from the shards' at connect (read from the build directory, which the
replicas load too), so filters, named filters and features are evaluated by the caller; each
shard receives its slice of the mask.

Three round trips a search, all shards at once in each: BM25 top C; the dense leg with the
cosines of the shard's merged candidates and the BM25 scores of its dense rows (so re-rank and
fusion need no further trip; without the dense leg, the cosines alone); hydration of the final
hits. A call whose replica died is sent again (Serve routes it to another replica); when every
attempt fails within ``retry_seconds`` the search fails with ``ShardUnavailableError`` naming
the shard, or, with ``allow_partial``, the other shards answer and the result is flagged
``partial:<shard>``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.integrations.errors import MissingExtraError

try:
    import ray
    from ray import serve
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve.handle import DeploymentHandle, DeploymentResponse
except ImportError as exc:
    raise MissingExtraError("ray", "ray[data,serve]", __name__) from exc

from indexes.ann import ExactDense
from indexes.bm25 import BM25Index
from indexes.docstore import DocStore, Document
from indexes.errors import RetrievalError
from indexes.manifest import read_manifest
from indexes.metadata import MetadataIndex
from indexes.sharding import read_layout
from indexes.vectors import VectorStore
from indexes.warmup import warm_bm25
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.whole import MaskSlices, RowOwners, joined_metadata, merged_top

# What a dead or unreachable replica raises; anything else (a bad request) is not retried.
REPLICA_LOST = (RayActorError, ActorUnavailableError, TimeoutError)
APP_NAME = "retrieval-shards"


@serve.deployment
class ShardReplica:
    """One replica of one shard: the shard build loaded (verified, memory-mapped) once; each
    method is one part of the request path over the shard's own rows."""

    def __init__(self, shard_dir: str, config: dict[str, Any]) -> None:
        settings = RetrieverConfig(**config)
        self.build = LoadedBuild.load(shard_dir, verify=settings.verify_checksums,
                                      mmap=settings.mmap)
        warm_bm25(self.build.bm25)

    def top_candidates(self, tokens: list[str], n: int, mask: np.ndarray | None
                       ) -> tuple[np.ndarray, np.ndarray]:
        return self.build.bm25.top_candidates(tokens, n, mask)

    def dense(self, query: np.ndarray, k: int, mask: np.ndarray | None, tokens: list[str],
              rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The dense top ``k`` in ``mask``, then the cosines of ``rows`` (the shard's merged
        candidates) followed by the dense rows', and the dense rows' BM25 scores."""
        dense_rows, dense_scores = self.build.dense.search(query, k, mask)
        both = np.concatenate([np.asarray(rows, np.int64), dense_rows.astype(np.int64)])
        return (dense_rows, dense_scores, self.build.vectors.scores(query, both),
                self.build.bm25.score_rows(tokens, dense_rows))

    def scores(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.build.vectors.scores(query, rows)

    def score_rows(self, tokens: list[str], rows: np.ndarray) -> np.ndarray:
        return self.build.bm25.score_rows(tokens, rows)

    def documents(self, rows: np.ndarray) -> list[Document]:
        return self.build.docs.get_many(rows)

    def all_ids(self) -> list[str]:
        return self.build.docs.all_ids()


@serve.deployment
class ShardSet:
    """The application's ingress: names the build its shard deployments serve."""

    def __init__(self, build_dir: str, *shards: DeploymentHandle) -> None:
        self.build_dir = build_dir

    def describe(self) -> dict[str, str]:
        return {"build_dir": self.build_dir}


class ShardCalls:
    """Calls to every shard deployment at once, with retries on a lost replica."""

    def __init__(self, handles: Sequence[DeploymentHandle], names: Sequence[str],
                 retry_seconds: float, timeout_seconds: float) -> None:
        self.handles = list(handles)
        self.names = list(names)
        self.retry_seconds = retry_seconds
        self.timeout_seconds = timeout_seconds

    def gather(self, method: str, args: dict[int, tuple[Any, ...]]
               ) -> dict[int, Any | ShardUnavailableError]:
        """Send every call at once, then collect each, re-sending those whose replica died."""
        pending = {shard: self._send(shard, method, a) for shard, a in args.items()}
        return {shard: self._collect(shard, method, args[shard], response)
                for shard, response in pending.items()}

    def _send(self, shard: int, method: str, args: tuple[Any, ...]) -> DeploymentResponse:
        return getattr(self.handles[shard], method).remote(*args)

    def _collect(self, shard: int, method: str, args: tuple[Any, ...],
                 response: DeploymentResponse) -> Any:
        give_up = time.monotonic() + self.retry_seconds
        while True:
            try:
                return response.result(timeout_s=self.timeout_seconds)
            except REPLICA_LOST as exc:
                if isinstance(exc, TimeoutError):
                    response.cancel()  # queued with no replica to take it: do not run it later
                if time.monotonic() >= give_up:
                    return ShardUnavailableError(
                        f"shard {self.names[shard]} has no live replica (last error: "
                        f"{type(exc).__name__}); retry later or add replicas", self.names[shard])
                time.sleep(0.05)
                response = self._send(shard, method, args)


@dataclass
class Fetched:
    """What this thread's search has fetched so far: its merged candidates, and the scores
    the dense trip brought back (so re-rank and fusion ask no shard again)."""

    tokens: list[str] = field(default_factory=list)
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    query: np.ndarray | None = None
    cosine: dict[int, float] = field(default_factory=dict)
    bm25: dict[int, float] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


class RemoteParts:
    """The fan-out shared by the remote parts: shard calls, row owners, mask slices, and the
    state of the search running on each thread."""

    def __init__(self, calls: ShardCalls, owners: RowOwners, allow_partial: bool) -> None:
        self.calls = calls
        self.owners = owners
        self.slices = MaskSlices(owners.bounds)
        self.allow_partial = allow_partial
        self._local = threading.local()

    @property
    def fetched(self) -> Fetched:
        state = getattr(self._local, "fetched", None)
        if state is None:
            state = self._local.fetched = Fetched()
        return state

    def start(self, tokens: Sequence[str]) -> Fetched:
        """A new search on this thread (its first call: BM25)."""
        self._local.fetched = Fetched(tokens=list(tokens))
        return self._local.fetched

    def answers(self, method: str, args: dict[int, tuple[Any, ...]]) -> dict[int, Any]:
        """Each shard's answer; an unavailable shard raises, or is left out (and recorded)
        with ``allow_partial`` while another shard answered."""
        outcomes = self.calls.gather(method, args)
        failed = [o for o in outcomes.values() if isinstance(o, ShardUnavailableError)]
        if failed and (not self.allow_partial or len(failed) == len(outcomes)):
            raise failed[0]
        self.fetched.left_out.extend(f"partial:{f.shard}" for f in failed
                                     if f"partial:{f.shard}" not in self.fetched.left_out)
        return {k: o for k, o in outcomes.items() if not isinstance(o, ShardUnavailableError)}

    def per_owner(self, method: str, rows: np.ndarray, dtype: Any, *head: Any) -> np.ndarray:
        """``method(*head, own rows)`` of each owning shard, as one array in ``rows`` order."""
        split = self.owners.split(rows)
        found = self.calls.gather(method, {k: (*head, local) for k, _, local in split})
        out: np.ndarray = np.zeros(np.asarray(rows).size, dtype=dtype)
        for k, at, _ in split:
            if isinstance(found[k], ShardUnavailableError):
                raise found[k]  # its rows were merged: they cannot be left out now
            out[at] = found[k]
        return out


class RemoteBM25(BM25Index):
    """BM25 over the shard deployments (every shard holds the global vocabulary)."""

    def __init__(self, parts: RemoteParts, vocab: list[str], n_docs: int) -> None:
        self.parts = parts
        self.vocab_list, self.vocab = vocab, {t: i for i, t in enumerate(vocab)}
        self.n_docs = n_docs

    def top_candidates(self, tokens: Sequence[str], n: int, mask: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        fetched = self.parts.start(tokens)
        views = self.parts.slices(mask)
        found = self.parts.answers("top_candidates", {k: (list(tokens), int(n), view)
                                                      for k, view in enumerate(views)})
        starts = self.parts.owners.starts
        rows, scores = merged_top([found[k] for k in sorted(found)], starts[sorted(found)],
                                  max(int(n), 0))
        fetched.rows = rows
        return rows, scores

    def score_rows(self, tokens: Sequence[str], rows: np.ndarray) -> np.ndarray:
        known = self.parts.fetched.bm25
        wanted = np.asarray(rows, np.int64).tolist()
        if all(r in known for r in wanted):
            return np.array([known[r] for r in wanted], dtype=np.float64)
        return self.parts.per_owner("score_rows", rows, np.float64, list(tokens))


class RemoteVectors(VectorStore):
    """Cosines from the shard deployments (or from what this search's dense trip fetched)."""

    def __init__(self, parts: RemoteParts, dim: int, n_docs: int) -> None:
        self.parts = parts
        self._dim, self._n = dim, n_docs
        self.dtype, self.scale, self.low = "float32", None, None

    @property
    def n_docs(self) -> int:
        return self._n

    @property
    def dim(self) -> int:
        return self._dim

    def scores(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        fetched = self.parts.fetched
        wanted = np.asarray(rows, np.int64).tolist()
        if fetched.query is query and all(r in fetched.cosine for r in wanted):
            return np.array([fetched.cosine[r] for r in wanted], dtype=np.float32)
        return self.parts.per_owner("scores", rows, np.float32, self.check_query(query))


class RemoteDense(ExactDense):
    """Each shard's dense leg inside its mask slice, merged by score; the same trip brings
    the cosines of the shard's merged BM25 candidates and its dense rows' BM25 scores."""

    kind = "remote"

    def __init__(self, parts: RemoteParts, vectors: RemoteVectors) -> None:
        super().__init__(vectors)
        self.parts = parts

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "shards": len(self.parts.calls.names)}

    def search(self, query: np.ndarray, k: int, mask: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        fetched, owners = self.parts.fetched, self.parts.owners
        own = {s: local for s, _, local in owners.split(fetched.rows)}
        views = self.parts.slices(mask)
        found = self.parts.answers("dense", {
            s: (query, int(k), views[s], fetched.tokens, own.get(s, np.empty(0, np.int64)))
            for s in range(len(views))})
        fetched.query = query
        answers = []
        for s in sorted(found):
            dense_rows, dense_scores, cosines, bm25 = found[s]
            start = int(owners.starts[s])
            mine = np.concatenate([own.get(s, np.empty(0, np.int64)), dense_rows]) + start
            fetched.cosine.update(zip(mine.tolist(), cosines.tolist(), strict=True))
            fetched.bm25.update(zip((dense_rows + start).tolist(), bm25.tolist(), strict=True))
            answers.append((dense_rows, dense_scores))
        rows, scores = merged_top(answers, owners.starts[sorted(found)], k)
        return rows, scores.astype(np.float32, copy=False)


class RemoteDocs(DocStore):
    """The shard deployments' documents: a hit list is one trip to each owning shard."""

    def __init__(self, parts: RemoteParts, n_docs: int) -> None:
        self.parts = parts
        self._n = n_docs
        self._ids: list[str] | None = None

    def __len__(self) -> int:
        return self._n

    def get(self, row: int) -> Document:
        return self.get_many([row])[0]

    def doc_id(self, row: int) -> str:
        return self.get(row).id

    def get_many(self, rows: Sequence[int] | np.ndarray) -> list[Document]:
        rows = np.asarray(rows, np.int64)
        split = self.parts.owners.split(rows)
        found = self.parts.calls.gather("documents", {k: (local,) for k, _, local in split})
        out: list[Document | None] = [None] * rows.size
        for k, at, _ in split:
            docs = found[k]
            if isinstance(docs, ShardUnavailableError):
                raise docs
            for position, doc in zip(at.tolist(), docs, strict=True):
                out[position] = doc
        return out  # type: ignore[return-value]

    def all_ids(self) -> list[str]:
        if self._ids is None:
            found = self.parts.calls.gather("all_ids", {k: () for k in
                                                        range(len(self.parts.calls.names))})
            ids: list[str] = []
            for k in sorted(found):
                answer = found[k]
                if isinstance(answer, ShardUnavailableError):
                    raise answer
                ids.extend(answer)
            self._ids = ids
        return self._ids

    def row_of(self, doc_id: str) -> int | None:
        ids = self.all_ids()
        return ids.index(doc_id) if doc_id in ids else None


@dataclass(frozen=True)
class RayShardedBuild(LoadedBuild):
    """A sharded build served by Ray Serve deployments, as one ``LoadedBuild``."""

    remote: RemoteParts | None = None

    def local_builds(self) -> Sequence[LoadedBuild]:
        return ()  # the replicas hold the rows (and warm their own kernels)

    def degradations(self) -> list[str]:
        assert self.remote is not None
        fetched = self.remote.fetched
        left_out, fetched.left_out = fetched.left_out, []
        return left_out

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
        handles = [serve.get_deployment_handle(name, app_name=app_name) for name in names]
        owners = RowOwners([entry.start for entry in layout.shards], manifest.n_docs)
        parts = RemoteParts(ShardCalls(handles, names, retry_seconds, timeout_seconds), owners,
                            allow_partial)
        shard_dirs = [layout.shard_dir(directory, i) for i in range(len(names))]
        metadata = joined_metadata([MetadataIndex.load(d / "metadata") for d in shard_dirs],
                                   owners.bounds[:-1], manifest.n_docs)
        vocab = BM25Index.load(shard_dirs[0] / "bm25").vocab_list  # the global vocabulary
        vectors = RemoteVectors(parts, manifest.encoder.dim, manifest.n_docs)
        first = LoadedBuild.load(shard_dirs[0], verify=False)
        return cls(path=directory, manifest=manifest, analyzer=first.analyzer,
                   bm25=RemoteBM25(parts, vocab, manifest.n_docs), metadata=metadata,
                   vectors=vectors, docs=RemoteDocs(parts, manifest.n_docs),
                   dense=RemoteDense(parts, vectors), remote=parts)


def shards_app(path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
               replicas: int = 1, num_cpus: float = 0.0) -> Any:
    """The Serve application of a sharded build (or the live one of an index root): one
    deployment ``shard-NNN`` of ``replicas`` replicas per shard. ``num_cpus``: CPUs each
    replica reserves in the Ray cluster."""
    if not isinstance(config, RetrieverConfig):
        config = RetrieverConfig(**(config or {}))
    directory, layout = read_layout(Path(path), verify=config.verify_checksums)
    settings = config.model_dump(mode="json")
    actor = {"num_cpus": num_cpus}
    shard_deployment: Any = ShardReplica  # a serve Deployment (the stubs see the class)
    ingress: Any = ShardSet
    shards = [shard_deployment.options(name=entry.name, num_replicas=replicas,
                                       ray_actor_options=actor).bind(
                  str(layout.shard_dir(directory, i)), settings)
              for i, entry in enumerate(layout.shards)]
    return ingress.options(name="shards", ray_actor_options=actor).bind(str(directory),
                                                                       *shards)


def serve_shards(path: str | Path, config: RetrieverConfig | dict[str, Any] | None = None, *,
                 app_name: str = APP_NAME, **options: Any) -> None:
    """Deploy every shard of the sharded build under ``path`` in the connected Ray cluster
    (``ray.init`` first); ``options`` as ``shards_app``. Then ``Retriever.connect(path)``."""
    if not ray.is_initialized():
        raise RetrievalError("connect to a Ray cluster first: ray.init() or ray.init(ADDRESS)")
    serve.run(shards_app(path, config, **options), name=app_name, route_prefix=None)
