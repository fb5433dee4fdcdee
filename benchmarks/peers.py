"""Peer systems a user would otherwise pick, run on our index's own corpus and query vectors.

Shared by ``benchmarks.search`` and ``benchmarks.suite``. Every peer is given the same query
vectors as ours (precomputed), so the encoder is not part of any comparison here:

- rank-bm25 ``BM25Okapi`` top-C, then a numpy gather/matmul re-rank and min-max fusion;
- bm25s (numba backend) top-C, then an exact faiss re-rank (``IDSelectorArray``) and fusion;
- faiss exact dense search over every vector (no BM25 gate), as ``quality.dense_run``;
- LanceDB hybrid (native full-text index + flat vector search, RRF k=60);
- txtai hybrid (its BM25 + exact faiss ``IDMap,Flat``, convex fusion with the same weight).

rank-bm25 and bm25s index the tokens of the index's own analyzer, so BM25 does the same work
as ours; LanceDB and txtai tokenize with their own analyzers, as their users would.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from indexes import Analyzer

Runner = Callable[[int], Any]
Candidates = Callable[[list[str]], tuple[np.ndarray, np.ndarray]]
Rerank = Callable[[np.ndarray, np.ndarray], np.ndarray]
# What a system's runner returns per query: stage timings (None: not reported), ids, scores.
Output = tuple[dict[str, float] | None, list[str], list[float]]
K, CANDIDATES, VECTOR_WEIGHT = 10, 300, 0.7


# -- building blocks (benchmarks.search imports these) ---------------------------------------


def minmax(scores: np.ndarray) -> np.ndarray:
    scores = scores.astype(np.float64)
    if scores.size == 0:
        return scores
    low, high = scores.min(), scores.max()
    return np.ones_like(scores) if high <= low else (scores - low) / (high - low)


def tokenize_corpus(analyzer: Analyzer, texts: Sequence[str]) -> tuple[list[str], list[list[int]]]:
    """Terms and each document's term ids; every occurrence of a term shares one str object,
    which keeps the peers' token lists at 1M documents within memory."""
    vocab: dict[str, int] = {}
    terms: list[str] = []
    ids: list[list[int]] = []
    for text in texts:
        row = []
        for token in analyzer(text):
            term_id = vocab.get(token)
            if term_id is None:
                term_id = vocab[token] = len(terms)
                terms.append(token)
            row.append(term_id)
        ids.append(row)
    return terms, ids


def _top(scores: np.ndarray, c: int) -> np.ndarray:
    if c >= scores.size:
        return np.arange(scores.size)
    return np.argpartition(-scores, c - 1)[:c]


def rank_bm25_candidates(tokens: list[list[str]], candidates: int = CANDIDATES) -> Candidates:
    from rank_bm25 import BM25Okapi

    okapi = BM25Okapi(tokens)

    def top(query: list[str]) -> tuple[np.ndarray, np.ndarray]:
        scores = okapi.get_scores(query)
        rows = _top(scores, candidates)
        return rows, scores[rows]

    return top


def bm25s_candidates(terms: list[str], ids: list[list[int]], candidates: int = CANDIDATES
                     ) -> Candidates:
    import bm25s
    from bm25s.tokenization import Tokenized

    model = bm25s.BM25(backend="numba")
    model.index(Tokenized(ids=ids, vocab={t: i for i, t in enumerate(terms)}),
                show_progress=False)
    c = min(candidates, len(ids))  # bm25s refuses k above the corpus size

    def top(query: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not query:  # bm25s cannot take an empty query; no term matches nothing
            return np.empty(0, np.int64), np.empty(0, np.float32)
        result = model.retrieve([query], k=c, n_threads=1, show_progress=False)
        return result.documents[0], result.scores[0]

    return top


def numpy_rerank(vectors: np.ndarray) -> Rerank:
    """Cosines of the candidate rows: a gather and a matmul, what a numpy user writes."""
    def rerank(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        return vectors[rows] @ query
    return rerank


def faiss_rerank(vectors: np.ndarray) -> Rerank:
    """Exact faiss inner products restricted to the candidates (``IDSelectorArray``: it visits
    only those ids; ``IDSelectorBatch`` would scan the whole index), in the order of ``rows``."""
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))

    def rerank(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if rows.size == 0:
            return np.empty(0, dtype=np.float32)
        params = faiss.SearchParameters(sel=faiss.IDSelectorArray(rows))  # type: ignore[call-arg]
        scores, labels = index.search(query.reshape(1, -1), rows.size, params=params)
        # faiss returns best first: put each score back at its candidate's position.
        order = np.argsort(rows)
        cosine = np.empty(rows.size, dtype=np.float32)
        cosine[order[np.searchsorted(rows, labels[0], sorter=order)]] = scores[0]
        return cosine

    return rerank


def fuse_top(bm25: np.ndarray, cosine: np.ndarray, k: int, weight: float
             ) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the best ``k`` by ``weight * minmax(cos) + (1 - weight) * minmax(bm25)``."""
    fused = weight * minmax(cosine) + (1 - weight) * minmax(bm25)
    top = np.argpartition(-fused, k - 1)[:k] if fused.size > k else np.arange(fused.size)
    return top[np.argsort(-fused[top], kind="stable")], fused


def peer(ds: Any, candidates: Candidates, k: int = K, weight: float = VECTOR_WEIGHT,
         rerank: Rerank | None = None, with_scores: bool = False) -> Runner:
    """BM25 top-C from ``candidates``, then the re-rank and fusion a numpy user would write.

    ``ds`` has ``analyzer``, ``queries``, ``query_vectors``, ``vectors`` and ``doc_ids``.
    The runner returns (stage timings, ids) — and the fused scores with ``with_scores``.
    """
    analyzer, queries, qvecs = ds.analyzer, ds.queries, ds.query_vectors
    doc_ids, clock = ds.doc_ids, time.perf_counter
    rerank = rerank or numpy_rerank(ds.vectors)

    def run(i: int) -> Any:
        t0 = clock()
        rows, bm25 = candidates(analyzer(queries[i]))
        t1 = clock()
        cosine = rerank(rows, qvecs[i])
        t2 = clock()
        top, fused = fuse_top(bm25, cosine, k, weight)
        hits = doc_ids[rows[top]].tolist()
        t3 = clock()
        timings = {"bm25": (t1 - t0) * 1e3, "rerank": (t2 - t1) * 1e3,
                   "fuse": (t3 - t2) * 1e3, "total": (t3 - t0) * 1e3}
        return (timings, hits, fused[top].tolist()) if with_scores else (timings, hits)

    return run


# -- systems for the suite -------------------------------------------------------------------


@dataclass
class PeerData:
    """What peers index and query: our corpus, our vectors, the same query vectors."""

    analyzer: Analyzer
    texts: list[str]
    doc_ids: np.ndarray  # object array of external ids, by row
    vectors: np.ndarray  # float32 (n, d)
    queries: list[str]
    query_vectors: np.ndarray  # float32 (q, d)
    _tokens: tuple[list[str], list[list[int]]] | None = field(default=None, repr=False)

    @classmethod
    def from_snapshot(cls, snapshot: Any, queries: list[str], query_vectors: np.ndarray,
                      tokens: tuple[list[str], list[list[int]]] | None = None) -> PeerData:
        """``tokens``: the corpus already through ``tokenize_corpus``, if the caller has it."""
        docs = [snapshot.docs.get(r) for r in range(len(snapshot.docs))]
        return cls(snapshot.analyzer, [d.content for d in docs],
                   np.array([d.id for d in docs], dtype=object),
                   snapshot.vectors.reconstruct_all(), queries, query_vectors, tokens)

    def tokens(self) -> tuple[list[str], list[list[int]]]:
        if self._tokens is None:
            self._tokens = tokenize_corpus(self.analyzer, self.texts)
        return self._tokens


@dataclass
class System:
    """One configuration under test; ``runner(k)`` returns a per-query-index callable."""

    name: str
    runner: Callable[[int], Callable[[int], Output]]
    kind: str = "peer"  # "ours" or "peer"
    notes: str = ""
    setup_seconds: float = 0.0
    max_queries: int | None = None  # slow systems are timed on a prefix of the queries


def fusion_system(name: str, data: PeerData, candidates: Candidates, rerank: Rerank,
                  weight: float, notes: str) -> System:
    def runner(k: int) -> Callable[[int], Output]:
        return peer(data, candidates, k, weight, rerank, with_scores=True)
    return System(name, runner, notes=notes)


def rank_bm25_system(data: PeerData, c: int, weight: float) -> System:
    terms, ids = data.tokens()
    candidates = rank_bm25_candidates([[terms[t] for t in row] for row in ids], c)
    return fusion_system("rank-bm25 + numpy re-rank", data, candidates,
                         numpy_rerank(data.vectors), weight,
                         f"BM25Okapi top-{c}, gather+matmul, minmax {weight}")


def bm25s_system(data: PeerData, c: int, weight: float) -> System:
    terms, ids = data.tokens()
    return fusion_system("bm25s + faiss re-rank", data, bm25s_candidates(terms, ids, c),
                         faiss_rerank(data.vectors), weight,
                         f"bm25s numba top-{c}, faiss IDSelectorArray, minmax {weight}")


def dense_system(data: PeerData, snapshot: Any) -> System:
    """Exact flat inner-product search over every vector (same call as ``quality.dense_run``)."""
    vectors, qvecs, clock = snapshot.vectors, data.query_vectors, time.perf_counter

    def runner(k: int) -> Callable[[int], Output]:
        def run(i: int) -> Output:
            t0 = clock()
            rows, scores = vectors.dense_top_k(qvecs[i], k)
            ids = [snapshot.docs.doc_id(int(r)) for r in rows]
            return {"dense": (clock() - t0) * 1e3}, ids, scores.tolist()
        return run

    vectors.dense_top_k(qvecs[0], 1)  # builds the flat index outside the timings
    return System("faiss dense exact", runner, notes="IndexFlatIP over all vectors, no BM25")


def lancedb_system(data: PeerData, work: Path) -> System:
    os.environ.setdefault("LANCEDB_LOG", "error")  # its Rust logger warns on every query
    import lancedb
    import pyarrow as pa
    from lancedb.index import FTS

    db = lancedb.connect(str(work / "lancedb"))
    dim = data.vectors.shape[1]
    table = db.create_table("docs", pa.table({
        "id": pa.array(data.doc_ids.tolist(), pa.string()), "text": data.texts,
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(data.vectors.ravel()), dim),
    }), mode="overwrite")
    table.create_index("text", config=FTS(), replace=True)  # native full-text (BM25) index
    queries, qvecs = data.queries, data.query_vectors

    def runner(k: int) -> Callable[[int], Output]:
        def run(i: int) -> Output:
            rows = (table.search(query_type="hybrid").vector(qvecs[i]).text(queries[i])
                    .distance_type("dot").limit(k).select(["id"]).to_arrow())
            return None, rows["id"].to_pylist(), rows["_relevance_score"].to_pylist()
        return run

    return System(f"LanceDB {lancedb.__version__} hybrid", runner,
                  notes="native FTS + flat vector scan, RRF k=60 (its default reranker)")


def txtai_system(data: PeerData, weight: float) -> System:
    from txtai import Embeddings

    # txtai embeds through a "transform": hand it our vectors, looked up by text.
    lookup = dict(zip(data.texts, data.vectors, strict=True))
    lookup.update(zip(data.queries, data.query_vectors, strict=True))

    def transform(texts: list[str]) -> np.ndarray:
        return np.stack([lookup[t] for t in texts])

    # Exact flat faiss: above 5,000 documents txtai otherwise switches to IVF (approximate).
    embeddings = Embeddings(method="external", transform=transform, backend="faiss",
                            faiss={"components": "IDMap,Flat"}, hybrid=True, content=False)
    embeddings.index((doc_id, text, None)
                     for doc_id, text in zip(data.doc_ids.tolist(), data.texts, strict=True))
    queries = data.queries

    def runner(k: int) -> Callable[[int], Output]:
        def run(i: int) -> Output:
            hits = embeddings.search(queries[i], k, weights=weight)
            return None, [h[0] for h in hits], [float(h[1]) for h in hits]
        return run

    from txtai.version import __version__

    return System(f"txtai {__version__} hybrid", runner,
                  notes=f"its BM25 + faiss IDMap,Flat (exact), convex fusion {weight} dense")


PEERS = ("rank-bm25", "bm25s", "dense", "lancedb", "txtai")


def make_peers(names: Sequence[str], data: PeerData, snapshot: Any, c: int, weight: float,
               work: Path | None = None) -> tuple[list[System], dict[str, str]]:
    """The requested peers, each timed while it indexes; an uninstalled one is skipped with
    the reason (LanceDB and txtai are optional: ``pip install lancedb txtai``)."""
    work = work or Path(tempfile.mkdtemp(prefix="bench-peers-"))
    makers: dict[str, Callable[[], System]] = {
        "rank-bm25": lambda: rank_bm25_system(data, c, weight),
        "bm25s": lambda: bm25s_system(data, c, weight),
        "dense": lambda: dense_system(data, snapshot),
        "lancedb": lambda: lancedb_system(data, work),
        "txtai": lambda: txtai_system(data, weight),
    }
    systems, skipped = [], {}
    for name in names:
        started = time.perf_counter()
        try:
            system = makers[name]()
        except ImportError as exc:
            skipped[name] = f"not installed ({exc.name or exc})"
            continue
        system.setup_seconds = round(time.perf_counter() - started, 2)
        systems.append(system)
    return systems, skipped
