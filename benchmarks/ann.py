"""The dense leg's index, IVF against HNSW: recall against exact search and latency per setting.

    python -m benchmarks.ann                              # SciFact and 100k generated vectors
    python -m benchmarks.ann --synthetic 100000 1000000 --skip-scifact

Per corpus, each kind is built as a build builds it (``indexes.ann.build_ann``: IVF nprobe and
HNSW ef calibrated on the corpus' own vectors), and beside the IVF the same lists holding
float32 vectors (IVF-Flat, what builds wrote before their lists became 8-bit); then, for every
setting of its ladder,
recall@30 and recall@100 of the queries against exact search (faiss ``IndexFlatIP``) and the
per-query latency (one thread, warm-up discarded) of a top-30 and a top-100 search. SciFact
uses its real document and test-query embeddings; generated corpora use clustered unit vectors
(``benchmarks.synthetic.clustered_unit_vectors``: uniform random vectors have no neighbours, so
no ANN index beats a full scan on them) and queries drawn from the same clusters.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, environment, fmt_ms, markdown_table, summarize, write_results
from benchmarks.synthetic import clustered_unit_vectors
from indexes.ann import ANN_DIR, NPROBE_LADDER, build_ann, ivf_params, load_dense, recall_at
from indexes.ann_hnsw import EF_LADDER, hnsw_params
from indexes.vectors import VectorStore

KS = (30, 100)
WARMUP = 20


def scifact_vectors(data: Path) -> tuple[np.ndarray, np.ndarray]:
    """SciFact's document vectors (the tuning build) and its test queries' vectors."""
    from benchmarks.tune import load_collection
    from indexes.encoders import SentenceTransformerEncoder
    from indexes.manifest import resolve_build_dir

    collection = load_collection("scifact", SentenceTransformerEncoder(), (1,))
    matrix = VectorStore.load(resolve_build_dir(collection.roots[1]) / "vectors"
                              ).reconstruct_all()
    queries = np.stack([collection.vectors[q] for q in collection.qrels["test"]])
    return np.ascontiguousarray(matrix, dtype=np.float32), queries.astype(np.float32)


def per_query_ms(index: Any, queries: np.ndarray, k: int, params: Any) -> dict[str, float]:
    times = []
    for i, query in enumerate(queries):
        began = time.perf_counter()
        index.search(query.reshape(1, -1), k, params=params)
        if i >= WARMUP:
            times.append((time.perf_counter() - began) * 1e3)
    return summarize(times)


def ladder_rows(kind: str, index: Any, queries: np.ndarray, truth: np.ndarray,
                settings: Sequence[int], params_for: Any) -> list[dict[str, Any]]:
    rows = []
    for setting in settings:
        params = params_for(setting)
        row: dict[str, Any] = {"kind": kind, "setting": setting}
        for k in KS:
            _, found = index.search(queries, k, params=params)
            row[f"recall@{k}"] = recall_at(found, truth[:, :k])
            row[f"latency_ms@{k}"] = per_query_ms(index, queries, k, params)
        rows.append(row)
        if row["recall@100"] >= 0.999:
            break
    return rows


def measure_corpus(name: str, matrix: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    import faiss

    faiss.omp_set_num_threads(1)
    exact = faiss.IndexFlatIP(matrix.shape[1])
    exact.add(matrix)
    _, truth = exact.search(queries, max(KS))
    store = VectorStore.build(matrix, "float32")
    out: dict[str, Any] = {"n_docs": int(matrix.shape[0]), "queries": int(queries.shape[0]),
                           "exact_ms@100": per_query_ms(exact, queries, 100, None), "kinds": {}}
    for kind in ("ivf", "hnsw"):
        with tempfile.TemporaryDirectory() as tmp:
            faiss.omp_set_num_threads(2)  # builds use the machine, searches one thread
            began = time.perf_counter()
            meta = build_ann(matrix, Path(tmp) / ANN_DIR, kind=kind)  # type: ignore[arg-type]
            build_s = time.perf_counter() - began
            faiss.omp_set_num_threads(1)
            dense: Any = load_dense(Path(tmp), store)
            index_bytes = sum(f.stat().st_size for f in (Path(tmp) / ANN_DIR).iterdir())
            if kind == "ivf":
                settings = [p for p in NPROBE_LADDER if p <= dense.nlist]
                rows = ladder_rows(kind, dense.index, queries, truth, settings, ivf_params)
                flat = float32_lists(dense.index, matrix)
                flat_rows = ladder_rows("ivf-flat", flat, queries, truth, settings, ivf_params)
            else:
                rows = ladder_rows(kind, dense.index, queries, truth, EF_LADDER, hnsw_params)
        calibration = {k: v for k, v in meta.items() if k in ("nlist", "nprobe", "ef_search", "M")}
        out["kinds"][kind] = {"build_s": build_s, "calibrated": calibration, "ladder": rows,
                              "bytes": index_bytes}
        if kind == "ivf":
            out["kinds"]["ivf-flat"] = {"build_s": None, "calibrated": {}, "ladder": flat_rows,
                                        "bytes": len(faiss.serialize_index(flat))}
        print(name, kind, f"build {build_s:.1f} s", calibration, flush=True)
    return out


def float32_lists(index: Any, matrix: np.ndarray) -> Any:
    """IVF-Flat over the same lists as ``index``: the 8-bit lists' float32 counterpart."""
    import faiss

    quantizer = faiss.IndexFlatIP(index.d)
    quantizer.add(index.quantizer.reconstruct_n(0, index.nlist))
    flat = faiss.IndexIVFFlat(quantizer, index.d, index.nlist, faiss.METRIC_INNER_PRODUCT)
    flat.add(matrix)
    return flat


def report(results: dict[str, dict[str, Any]]) -> str:
    headers = ["corpus", "index", "setting", "recall@30", "recall@100",
               "top-30 p50 / p95 ms", "top-100 p50 / p95 ms"]
    rows = []
    for name, r in results.items():
        rows.append([f"{name} ({r['n_docs']:,} docs)", "exact (IndexFlatIP)", "", "1", "1", "",
                     " / ".join(fmt_ms(r["exact_ms@100"][p]) for p in ("p50", "p95"))])
        for kind, k in r["kinds"].items():
            for row in k["ladder"]:
                label = "ef" if kind == "hnsw" else "nprobe"
                rows.append(["", kind, f"{label} {row['setting']}",
                             f"{row['recall@30']:.3f}", f"{row['recall@100']:.3f}",
                             *(" / ".join(fmt_ms(row[f"latency_ms@{n}"][p]) for p in ("p50", "p95"))
                               for n in KS)])
    builds = "; ".join(f"{name} {kind}: " + ("" if k["build_s"] is None else
                                             f"build {k['build_s']:.1f} s, calibrated "
                                             f"{k['calibrated']}, ") + f"{k['bytes']:,} bytes"
                       for name, r in results.items() for kind, k in r["kinds"].items())
    return (markdown_table(headers, rows) + f"\n\nBuilds (2 threads): {builds}.\n"
            "Searches: one query at a time, one thread; shared 2-core machine.")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--synthetic", type=int, nargs="*", default=[100_000])
    parser.add_argument("--queries", type=int, default=300, help="queries per generated corpus")
    parser.add_argument("--skip-scifact", action="store_true")
    args = parser.parse_args(argv)
    corpora: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if not args.skip_scifact:
        corpora["scifact"] = scifact_vectors(args.data)
    for n in args.synthetic:
        corpora[f"generated-{n}"] = (clustered_unit_vectors(n, 384, seed=3),
                                     clustered_unit_vectors(args.queries, 384, seed=4,
                                                            centers_of=n))
    results = {name: measure_corpus(name, *pair) for name, pair in corpora.items()}
    markdown = report(results)
    print(markdown)
    json_path, _ = write_results("ann", {"environment": environment(), "results": results},
                                 markdown)
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
