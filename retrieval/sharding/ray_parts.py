"""The parts of a build served by Ray Serve shard deployments (``ray_serve``): BM25, vectors,
dense leg and doc store as calls to every shard at once, with retries on a lost replica; what
a search has fetched on its thread spares it further trips (see ``ray_serve``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retrieval.integrations.errors import MissingExtraError

try:
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.serve.exceptions import (
        BackPressureError,
        DeploymentUnavailableError,
        ReplicaUnavailableError,
        RequestCancelledError,
    )
    from ray.serve.handle import DeploymentHandle, DeploymentResponse
except ImportError as exc:
    raise MissingExtraError("ray", "ray[data,serve]", __name__) from exc

from indexes.ann import ExactDense
from indexes.bm25 import BM25Index, BM25Params
from indexes.bm25_strategy import Kernel
from indexes.docstore import DocStore, Document
from indexes.typos import LiveTypos, TypoIndex
from indexes.vectors import VectorStore
from retrieval.request_path.deadline import CURRENT, NO_DEADLINE
from retrieval.sharding.errors import ShardUnavailableError
from retrieval.sharding.whole import MaskSlices, RowOwners, ShardedDocs, merged_top

# What a dead or unreachable replica (or a deployment being redeployed, or too busy) raises;
# anything else (a bad request) is not retried.
REPLICA_LOST = (RayActorError, ActorUnavailableError, TimeoutError, BackPressureError,
                DeploymentUnavailableError, ReplicaUnavailableError, RequestCancelledError)


# Each trip waits for the shards at least this long, deadline or not: a healthy shard answers
# in milliseconds, and a search whose budget an earlier trip spent still needs the rows of
# the shards that answered it (hydration); a hung shard, left out once, is not asked again.
SHARD_GRACE_SECONDS = 0.1


class ShardCalls:
    """Calls to every shard deployment at once, with retries on a lost replica; each call
    names the shard build it is for, so one search never mixes builds."""

    def __init__(self, handles: Sequence[DeploymentHandle], names: Sequence[str],
                 dirs: Sequence[str], retry_seconds: float, timeout_seconds: float) -> None:
        self.handles = list(handles)
        self.names = list(names)
        self.dirs = list(dirs)  # each shard's build directory: every call names its build
        self.retry_seconds = retry_seconds
        self.timeout_seconds = timeout_seconds

    def gather(self, method: str, args: dict[int, tuple[Any, ...]]
               ) -> dict[int, Any | ShardUnavailableError]:
        """Send every call at once, then collect each, re-sending those whose replica died:
        all within one ``timeout_seconds`` (S slow shards took S times it) and one
        ``retry_seconds``, and within the search's deadline (``deadline.CURRENT``), past
        which a shard that has not answered is unavailable (left out with allow_partial)."""
        started = time.monotonic()
        remaining = CURRENT.get().remaining()
        deadline_end = (started + max(remaining, SHARD_GRACE_SECONDS) if remaining is not None
                        else float("inf"))
        window = Window(answer_by=min(started + self.timeout_seconds, deadline_end),
                        give_up=min(started + self.retry_seconds, deadline_end),
                        cut_at=deadline_end if deadline_end < started + max(
                            self.timeout_seconds, self.retry_seconds) else float("inf"))
        pending = {shard: self._send(shard, method, a) for shard, a in args.items()}
        return {shard: self._collect(shard, method, args[shard], response, window)
                for shard, response in pending.items()}

    def _send(self, shard: int, method: str, args: tuple[Any, ...]) -> DeploymentResponse:
        return getattr(self.handles[shard], method).remote(self.dirs[shard], *args)

    def _collect(self, shard: int, method: str, args: tuple[Any, ...],
                 response: DeploymentResponse, window: Window) -> Any:
        answer_by = window.answer_by
        while True:
            try:
                return response.result(timeout_s=max(0.0, answer_by - time.monotonic()))
            except REPLICA_LOST as exc:
                if isinstance(exc, TimeoutError):
                    response.cancel()  # queued with no replica to take it: do not run it later
                now = time.monotonic()
                if now >= window.give_up:
                    return self._unavailable(shard, exc, by_deadline=now >= window.cut_at)
                time.sleep(0.05)
                answer_by = max(answer_by, min(time.monotonic() + self.timeout_seconds,
                                               window.give_up))  # a re-sent call's own wait
                response = self._send(shard, method, args)

    def _unavailable(self, shard: int, exc: BaseException, by_deadline: bool
                     ) -> ShardUnavailableError:
        name = self.names[shard]
        if by_deadline:
            return ShardUnavailableError(
                f"shard {name} did not answer within the search's deadline (last error: "
                f"{type(exc).__name__}); a longer deadline_ms may get its answer, or "
                "allow_partial leaves it out", name, by_deadline=True)
        return ShardUnavailableError(
            f"shard {name} has no live replica (last error: {type(exc).__name__}); retry "
            "later or add replicas", name)


@dataclass(frozen=True)
class Window:
    """When one fan-out stops waiting for an answer (``answer_by``, a re-sent call's own
    wait added), gives up re-sending (``give_up``), both cut by the search's deadline; and
    from when giving up is the deadline's doing (``cut_at``: the deadline's end when it
    came before the shard calls' own ``timeout_seconds`` and ``retry_seconds``, else never):
    the error then says ``by_deadline``."""

    answer_by: float
    give_up: float
    cut_at: float


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
        """A new search on this thread: at its start (``begin_search``: a search on a live
        snapshot may make no BM25 trip), and at its BM25 trip."""
        self._local.fetched = Fetched(tokens=list(tokens))
        return self._local.fetched

    def begin_search(self) -> None:
        """A search starts on this thread, in the context its deadline is set for
        (``deadline.within``, one per search)."""
        self.start([])
        self._local.search = CURRENT.get()

    def end_search(self) -> list[str]:
        """What the search on this thread left out (``partial:<shard>``), taken once at its
        end."""
        fetched = self.fetched
        left_out, fetched.left_out = fetched.left_out, []
        self._local.search = None
        return left_out

    def drops_unreadable_hits(self) -> bool:
        """Whether the documents of a shard that cannot be read are left out (None) instead
        of failing: with ``allow_partial``, in a search only. ``get_documents`` and live
        writes reading texts need every document they ask for. The search is known by its
        deadline, still this context's: one that raised before its end leaves no lenience
        behind on its thread."""
        search = getattr(self._local, "search", None)
        return (self.allow_partial and search is not None and search is not NO_DEADLINE
                and search is CURRENT.get())

    def is_left_out(self, shard: int) -> bool:
        """Whether this thread's search does without ``shard`` (not asked again)."""
        return f"partial:{self.calls.names[shard]}" in self.fetched.left_out

    def leave_out(self, name: str) -> None:
        """Record that this thread's search does without shard ``name``."""
        if f"partial:{name}" not in self.fetched.left_out:
            self.fetched.left_out.append(f"partial:{name}")

    def answers(self, method: str, args: dict[int, tuple[Any, ...]]) -> dict[int, Any]:
        """Each shard's answer; an unavailable shard raises, or is left out (and recorded)
        with ``allow_partial`` while another shard answered."""
        left_out = self.fetched.left_out  # this search does without them: not asked again
        outcomes = self.calls.gather(method, {
            k: a for k, a in args.items() if f"partial:{self.calls.names[k]}" not in left_out})
        failed = [o for o in outcomes.values() if isinstance(o, ShardUnavailableError)]
        if failed and (not self.allow_partial or len(failed) == len(outcomes)):
            raise failed[0]
        self.fetched.left_out.extend(f"partial:{f.shard}" for f in failed
                                     if f"partial:{f.shard}" not in self.fetched.left_out)
        return {k: o for k, o in outcomes.items() if not isinstance(o, ShardUnavailableError)}

    def per_owner(self, method: str, rows: np.ndarray, dtype: Any, *head: Any) -> np.ndarray:
        """``method(*head, own rows)`` of each owning shard, as one array in ``rows`` order.
        With ``allow_partial`` the rows of a shard left out are NaN (the search drops them);
        without, an unavailable shard raises."""
        split = self.owners.split(rows)
        left_out = self.fetched.left_out
        asked = {k: (*head, local) for k, _, local in split
                 if not (self.allow_partial and f"partial:{self.calls.names[k]}" in left_out)}
        found = self.calls.gather(method, asked)
        out: np.ndarray = np.full(np.asarray(rows).size, np.nan, dtype=dtype)
        for k, at, _ in split:
            answer = found.get(k)
            if isinstance(answer, ShardUnavailableError):
                if not self.allow_partial:
                    raise answer
                left_out.append(f"partial:{answer.shard}")
            elif answer is not None:
                out[at] = answer
        return out


class RemoteBM25(BM25Index):
    """BM25 over the shard deployments (every shard holds the global vocabulary)."""

    def __init__(self, parts: RemoteParts, vocab: list[str], n_docs: int,
                 doc_freqs: np.ndarray, params: BM25Params,
                 typos: TypoIndex | LiveTypos | None = None) -> None:
        self.parts = parts
        self.typos = typos
        self.vocab_list, self.vocab = vocab, {t: i for i, t in enumerate(vocab)}
        self.n_docs = self.stats_docs = n_docs
        self.params = params
        self._doc_freqs = doc_freqs
        self.idf_floor = None

    def doc_freq(self, term: str) -> int:
        """Rows holding ``term`` in the whole collection (``doc_freqs``: the shards' postings
        lengths summed at connect; live writes are applied over this layout as over any
        other)."""
        i = self.vocab.get(term)
        return 0 if i is None else int(self._doc_freqs[i])

    def vocabulary_doc_freqs(self) -> np.ndarray:
        return self._doc_freqs

    def top_candidates(self, tokens: Sequence[str], n: int, mask: np.ndarray | None = None,
                       kernel: Kernel | str | None = None) -> tuple[np.ndarray, np.ndarray]:
        fetched = self.parts.start(tokens)
        views = self.parts.slices(mask)
        forced = None if kernel is None else str(kernel)
        found = self.parts.answers("top_candidates", {k: (list(tokens), int(n), view, forced)
                                                      for k, view in enumerate(views)})
        starts = self.parts.owners.starts
        rows, scores = merged_top([found[k] for k in sorted(found)], starts[sorted(found)],
                                  max(int(n), 0))
        fetched.rows = rows
        return rows, scores

    def score_rows(self, tokens: Sequence[str], rows: np.ndarray) -> np.ndarray:
        fetched = self.parts.fetched
        known = fetched.bm25  # whole-query scores: no answer for a subset of the tokens
        wanted = np.asarray(rows, np.int64).tolist()
        if same_terms(tokens, fetched.tokens) and all(r in known for r in wanted):
            return np.array([known[r] for r in wanted], dtype=np.float64)
        return self.parts.per_owner("score_rows", rows, np.float64, list(tokens))


def same_terms(asked: Sequence[str], fetched: Sequence[str]) -> bool:
    """Whether ``asked`` are the terms whose scores were fetched, typo weights included: a
    ``Corrected("alpha", 0.7)`` equals the string "alpha", but scores 0.7 times it, and
    explain (asking for "alpha" to weigh it itself) weighed a one-word corrected query twice."""
    def weighed(terms: Sequence[str]) -> list[tuple[str, float]]:
        return [(str(t), getattr(t, "weight", 1.0)) for t in terms]
    return weighed(asked) == weighed(fetched)


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
        # By value: a live snapshot's vectors hand on a reshaped copy of the query
        if (fetched.query is not None and np.array_equal(fetched.query, query)
                and all(r in fetched.cosine for r in wanted)):
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
    """The shard deployments' documents: a hit list is one trip to each owning shard.

    Which document id each row holds is read here instead (``ids``: the shards' doc stores
    mapped in this process at connect, as their metadata is, and read for ids alone): it
    is part of the index, so finding a document's rows (``get_documents``, the id filter, a
    write replacing a document) never waits on a shard, and works with one down."""

    def __init__(self, parts: RemoteParts, n_docs: int, ids: ShardedDocs) -> None:
        self.parts = parts
        self._n = n_docs
        self._ids_of = ids
        self._ids: list[str] | None = None
        self._rows: dict[str, int] | None = None

    def __len__(self) -> int:
        return self._n

    def get(self, row: int) -> Document:
        # Asked for by itself (get_documents, a passage's context): never dropped
        return self.documents([row], drop_unreadable=False)[0]

    def doc_id(self, row: int) -> str:
        return self._ids_of.doc_id(row)

    def get_many(self, rows: Sequence[int] | np.ndarray) -> list[Document]:
        """The documents of ``rows``; ``ShardUnavailableError`` naming the first shard asked
        that has no live replica (the rows of the others are there to read: ask for them
        alone). A search's hits with ``allow_partial`` are the exception: such a shard's
        documents are None, the search drops those hits, and its result says
        ``partial:<shard>`` (``RemoteParts.drops_unreadable_hits``)."""
        return self.documents(rows, self.parts.drops_unreadable_hits())

    def documents(self, rows: Sequence[int] | np.ndarray, drop_unreadable: bool
                  ) -> list[Document]:
        """The documents of ``rows``, one trip to each owning shard; with
        ``drop_unreadable`` those of a shard that cannot be read (or that the search already
        left out: not asked again) are None and the shard is left out."""
        rows = np.asarray(rows, np.int64)
        split = self.parts.owners.split(rows)
        found = self.parts.calls.gather("documents", {
            k: (local,) for k, _, local in split
            if not (drop_unreadable and self.parts.is_left_out(k))})
        out: list[Document | None] = [None] * rows.size
        for k, at, _ in split:
            docs = found.get(k)
            if isinstance(docs, ShardUnavailableError):
                if not drop_unreadable:
                    raise unreadable(docs)
                self.parts.leave_out(docs.shard)
            elif docs is not None:
                for position, doc in zip(at.tolist(), docs, strict=True):
                    out[position] = doc
        return out  # type: ignore[return-value]

    def all_ids(self) -> list[str]:
        if self._ids is None:
            self._ids = self._ids_of.all_ids()
        return self._ids

    def row_of(self, doc_id: str) -> int | None:
        if self._rows is None:  # a dict: applying a log batch looks up every id it replaced
            self._rows = {doc_id: row for row, doc_id in enumerate(self.all_ids())}
        return self._rows.get(doc_id)


def unreadable(error: ShardUnavailableError) -> ShardUnavailableError:
    """``error`` said of the documents a shard with no live replica keeps from being read
    (one only slower than a search's deadline says so itself). Reading every shard's texts
    is also what applying the first live writes on a build takes (its keyword statistics):
    the write-ahead log's failure then says why those writes wait."""
    if error.by_deadline:
        return error
    return ShardUnavailableError(
        f"the documents of shard {error.shard} cannot be read until it answers again (live "
        f"writes that need its texts wait for it too): {error}", error.shard)
