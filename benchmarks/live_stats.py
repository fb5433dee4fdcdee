"""BM25 statistics of live writes, the alternative measured: ``python -m benchmarks.live_stats``.

The serving delta scores BM25 with the live corpus's statistics (N, df, avgdl of exactly the
live documents), equal to a fresh build. The alternative is Lucene's: keep the base build's
impacts as they are and score delta documents with frozen statistics, deleted documents still
counted, until compaction. This measures, on the equivalence scenario of the tests (base =
SciFact minus 1,000; those upserted, half new and half with changed text; 500 others
deleted) and on a 1% delta, how often the frozen variant's top-10 equals a fresh build's, and
what each costs to apply. Query time is the same for both: one kernel over one CSC matrix.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import DEFAULT_DATA, REPO, RESULTS_DIR, markdown_table, publish_report
from benchmarks.live import scifact
from indexes import BM25Index, BM25Params, Document, build_index, read_qrels, read_queries
from indexes.bm25 import idf_weights, impacts_for
from indexes.encoders import SentenceTransformerEncoder
from indexes.writer import IndexWriter
from retrieval import Retriever, RetrieverConfig

CONFIG = {"cache": {"backend": "none"}, "live_lag_seconds": None, "candidate_policy": "keyword"}


def frozen_bm25(snapshot: Any, base: Any) -> BM25Index:
    """The view's postings with Lucene-style frozen statistics: base impacts unchanged (their
    rows masked out when replaced), delta impacts from the base's N, df and avgdl plus the
    delta's own documents, replaced ones still counted."""
    live, stored = snapshot.bm25, base.bm25
    n_base = stored.n_docs
    params = BM25Params(**base.manifest.bm25)
    vocab = {t: i for i, t in enumerate(live.vocab_list)}
    base_df = np.zeros(len(vocab))
    for term, i in stored.vocab.items():
        if term in vocab:
            base_df[vocab[term]] = stored.indptr[i + 1] - stored.indptr[i]
    term_of = np.repeat(np.arange(len(vocab)), np.diff(live.indptr))
    in_delta = live.rows >= n_base
    delta_df = np.bincount(term_of[in_delta], minlength=len(vocab))
    n_delta = live.n_docs - n_base
    counts = {row: Counter(base.analyzer(snapshot.docs.get(row).content))
              for row in range(n_base, live.n_docs)}
    lengths = np.zeros(live.n_docs)
    for row, counter in counts.items():
        lengths[row] = sum(counter.values())
    base_avgdl = float(np.mean([len(base.analyzer(base.docs.get(r).content))
                                for r in range(n_base)]))
    avgdl = (base_avgdl * n_base + lengths[n_base:].sum()) / (n_base + n_delta)
    idf = idf_weights(base_df + delta_df, n_base + n_delta, params)
    impacts = live.impacts.astype(np.float64).copy()
    tf = np.array([counts[int(r)][t] for r, t in zip(live.rows[in_delta],
                                   np.asarray(live.vocab_list, dtype=object)[term_of[in_delta]],
                                   strict=True)], dtype=np.float64)
    impacts[in_delta] = impacts_for(tf, lengths[live.rows[in_delta]], idf[term_of[in_delta]],
                                    avgdl, params)
    base_rows = ~in_delta
    for term, i in stored.vocab.items():  # base postings keep the stored (frozen) impacts
        j = vocab.get(term)
        if j is None:
            continue
        lo, hi = live.indptr[j], live.indptr[j + 1]
        mine = live.rows[lo:hi]
        keep = mine < n_base
        theirs = dict(zip(stored.rows[stored.indptr[i]:stored.indptr[i + 1]].tolist(),
                          stored.impacts[stored.indptr[i]:stored.indptr[i + 1]].tolist(),
                          strict=True))
        impacts[lo:hi][keep] = [theirs[int(r)] for r in mine[keep]]
    assert base_rows.sum() + in_delta.sum() == live.rows.size
    return BM25Index(live.vocab_list, live.indptr, live.rows, impacts.astype(np.float32),
                     live.n_docs, params)


def scenario(docs: list[Document], vectors: np.ndarray, info: Any, work: Path,
             n_changed: int, n_new: int, n_deleted: int) -> tuple[Path, Path]:
    rng = random.Random(15)
    picked = rng.sample(range(len(docs)), n_new + n_changed + n_deleted)
    new, changed = picked[:n_new], set(picked[n_new:n_new + n_changed])
    deleted = picked[n_new + n_changed:]
    base = [Document(d.id, d.text[: len(d.text) // 3] + " (draft)", d.title, d.metadata)
            if i in changed else d for i, d in enumerate(docs) if i not in set(new)]
    base_vectors = np.stack([vectors[(i + 1) % len(docs)] if i in changed else vectors[i]
                             for i in range(len(docs)) if i not in set(new)])
    root = work / f"live-{n_new}"
    build_index(base, root, vectors=base_vectors, encoder_info=info, progress=False)
    upserts = new + sorted(changed)
    with IndexWriter(root) as writer:
        writer.upsert([docs[i] for i in upserts], vectors=vectors[upserts])
        if deleted:
            writer.delete([docs[i].id for i in deleted])
    gone = {docs[i].id for i in upserts + deleted}
    keep = [i for i, d in enumerate(base) if d.id not in gone]
    fresh = work / f"fresh-{n_new}"
    build_index([base[i] for i in keep] + [docs[i] for i in upserts], fresh,
                vectors=np.concatenate([base_vectors[keep], vectors[upserts]]),
                encoder_info=info, progress=False)
    return root, fresh


def agreement(root: Path, fresh_root: Path, queries: list[str], vectors: np.ndarray
              ) -> dict[str, Any]:
    config = RetrieverConfig(**CONFIG)
    with Retriever.load(root, config) as live, Retriever.load(fresh_root, config) as fresh:
        base = Retriever.load(resolve(root), config)
        started = time.perf_counter()
        frozen_index = frozen_bm25(live.snapshot, base.snapshot)
        frozen_build_s = time.perf_counter() - started
        frozen = Retriever(dataclasses.replace(live.snapshot, bm25=frozen_index), config, None)
        truth = fresh.search_batch(queries, k=10, query_vectors=vectors)
        out: dict[str, Any] = {"frozen_index_seconds": frozen_build_s}
        for name, retriever in (("live", live), ("frozen", frozen)):
            got = retriever.search_batch(queries, k=10, query_vectors=vectors)
            same = [[h.doc_id for h in a.hits] == [h.doc_id for h in b.hits]
                    for a, b in zip(got, truth, strict=True)]
            overlap = [len({h.doc_id for h in a.hits} & {h.doc_id for h in b.hits}) / 10
                       for a, b in zip(got, truth, strict=True)]
            drift = max((abs(x.score - y.score) for a, b in zip(got, truth, strict=True)
                         for x, y in zip(a.hits, b.hits, strict=False)), default=0.0)
            out[name] = {"same_top10": float(np.mean(same)), "mean_overlap": float(
                np.mean(overlap)), "max_score_diff": drift}
        base.close()
    return out


def resolve(root: Path) -> Path:
    from indexes.manifest import resolve_build_dir

    return resolve_build_dir(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--vectors-from", type=Path,
                        default=REPO / "build" / "test-indexes" / "scifact")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    docs, vectors, info = scifact(args.data, args.vectors_from)
    qrels = read_qrels(args.data / "qrels" / "test.tsv")
    queries = [t for q, t in read_queries(args.data / "queries.jsonl").items() if q in qrels]
    query_vectors = SentenceTransformerEncoder().encode(queries)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in (("1,000 upserted + 500 deleted", (500, 500, 500)),
                            ("1% new", (0, 52, 0))):
            root, fresh = scenario(docs, vectors, info, Path(tmp), *sizes)
            results[name] = agreement(root, fresh, queries, query_vectors)
    rows = [[name, f"{r[v]['same_top10']:.1%}", f"{r[v]['mean_overlap']:.1%}",
             f"{r[v]['max_score_diff']:.2g}", v] for name, r in results.items()
            for v in ("live", "frozen")]
    markdown = "\n\n".join([
        "## BM25 statistics of the delta vs a fresh build (300 SciFact test queries, top-10)",
        markdown_table(["scenario", "identical top-10", "mean overlap", "max score diff",
                        "statistics"], rows)])
    publish_report("live_stats", args, results, markdown)


if __name__ == "__main__":
    main()
