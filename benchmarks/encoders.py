"""Query-encoder latency and document throughput: torch against ONNX fp32 and ONNX INT8.

    python -m benchmarks.encoders                 # all SciFact queries, 1,000 documents, nDCG
    python -m benchmarks.encoders --quick         # 300 queries, 200 documents, no nDCG

Side by side in one run, on the same texts:

- single-query latency (``encode([query])``, as the retriever embeds a query on a cache miss):
  p50/p95/p99/max over every SciFact query after a discarded warm-up; torch on one intra-op
  thread, the ONNX backends on 1 and 2;
- document throughput (docs/s, batch size 64) on SciFact documents, 1 and 2 threads each;
- the ceiling of dynamic batching: ms per query when 1, 4 or 16 queries of the median token
  length (no padding) go through one call on one thread, as a batching worker calls it;
- quality: cosine of each backend's vectors to torch's, and SciFact nDCG@10 of the default
  retriever (index built with torch) when queried with each backend's single-query vectors.

The recommended backend is the fastest single-query p50 whose nDCG@10 is within 0.005 of torch;
its recommended thread count the one with the lowest p95.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    environment,
    fmt_ms,
    markdown_table,
    measure_side_by_side,
    package_version,
    percentile_cells,
    plot_cdfs,
    write_results,
)
from indexes import build_index, read_corpus, read_qrels, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import Encoder, SentenceTransformerEncoder, default_model_path
from indexes.errors import RetrievalError
from indexes.manifest import current_build_dir, read_manifest
from indexes.onnx_encoder import OnnxEncoder, load_tokenizer

NDCG_TOLERANCE = 0.005
TORCH_ID = "all-MiniLM-L6-v2:torch:fp32:384"
EXTRA_PACKAGES = ("onnxruntime", "onnx", "tokenizers", "transformers")


@dataclass
class Config:
    """One encoder under test: a backend at an intra-op thread count."""

    name: str
    backend: str
    threads: int
    encoder: Encoder

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        if self.backend == "torch":
            import torch

            # torch's thread count is process-wide: set it for this configuration's call only.
            torch.set_num_threads(self.threads)
        return self.encoder.encode(texts, batch_size=batch_size)


def make_configs(cache_dir: Path | None) -> tuple[list[Config], list[Config]]:
    """(single-query configurations, document-throughput configurations)."""
    import torch

    torch_threads = torch.get_num_threads()
    reference = SentenceTransformerEncoder()
    onnx = {(q, t): OnnxEncoder(quantized=q, threads=t, cache_dir=cache_dir)
            for q in (False, True) for t in (1, 2)}

    def config(quantized: bool, threads: int) -> Config:
        backend = "onnx-int8" if quantized else "onnx"
        return Config(f"{backend} ({threads}t)", backend, threads, onnx[quantized, threads])

    torch_1 = Config("torch (1t)", "torch", 1, reference)
    torch_n = Config(f"torch ({torch_threads}t)", "torch", torch_threads, reference)
    onnx_configs = [config(q, t) for q in (False, True) for t in (1, 2)]
    # Single queries: torch on one thread, since its thread count is process-wide and changing
    # it per call would sit inside the timed calls; documents are timed per block instead.
    return [torch_1, *onnx_configs], [torch_1, torch_n, *onnx_configs]


# -- measurements ----------------------------------------------------------------------------


def _one_query(encoder: Encoder) -> Callable[[str], np.ndarray]:
    def run(query: str) -> np.ndarray:
        return encoder.encode([query])[0]
    return run


def _documents(config: Config) -> Callable[[list[str]], np.ndarray]:
    def run(texts: list[str]) -> np.ndarray:
        return config.encode(texts, batch_size=64)
    return run


def single_query_latency(configs: list[Config], queries: list[str], warmup: int, chunk: int
                         ) -> dict[str, Any]:
    """Per config: latency samples (ms) and the (n, dim) single-query vectors."""
    if configs[0].backend == "torch":
        configs[0].encode(["set the thread count before timing"])
    runners = {c.name: _one_query(c.encoder) for c in configs}
    samples = measure_side_by_side(runners, queries, warmup=queries[:warmup], chunk=chunk,
                                   rewarm=3)
    return {name: {"wall_ms": s.wall_ms, "summary": s.summary(), "vectors": np.vstack(s.outputs)}
            for name, s in samples.items()}


def document_throughput(configs: list[Config], docs: list[str], block: int) -> dict[str, Any]:
    """Per config: docs/s over ``docs`` encoded in blocks taken in turns, and the vectors."""
    blocks = [docs[i:i + block] for i in range(0, len(docs), block)]
    runners = {c.name: _documents(c) for c in configs}
    samples = measure_side_by_side(runners, blocks, warmup=[docs[:64]], chunk=1)
    return {name: {"docs_per_s": len(docs) / (sum(s.wall_ms) / 1e3),
                   "block_ms": s.wall_ms, "vectors": np.vstack(s.outputs)}
            for name, s in samples.items()}


BATCH_SIZES = (1, 4, 16)


def batch_ceiling(configs: list[Config], queries: list[str], rounds: int = 20
                  ) -> dict[str, Any]:
    """Per one-thread config: ms per query at each batch size, on queries of one token length.

    Equal lengths mean no padding: the gain over batch 1 is the most that grouping concurrent
    queries into one call can buy that encoder (a real batch also pads to its longest text).
    """
    tokenizer = load_tokenizer(default_model_path())
    lengths = [len(e.ids) for e in tokenizer.encode_batch(queries)]
    median = int(np.median(lengths))
    same = [q for q, n in zip(queries, lengths, strict=True) if n == median][:max(BATCH_SIZES)]
    sizes = [b for b in BATCH_SIZES if b <= len(same)]
    runners = {f"{c.name}|{b}": (lambda _, c=c, b=b: c.encode(same[:b], batch_size=b))
               for c in configs if c.threads == 1 for b in sizes}
    samples = measure_side_by_side(runners, list(range(rounds)), warmup=[0, 1], chunk=1)
    per_query: dict[str, dict[int, float]] = {}
    for key, sample in samples.items():
        name, b = key.split("|")
        per_query.setdefault(name, {})[int(b)] = float(np.median(sample.wall_ms)) / int(b)
    return {"tokens": median, "sizes": sizes, "ms_per_query": per_query}


def cosines(vectors: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    values = np.einsum("nd,nd->n", vectors.astype(np.float64), reference.astype(np.float64))
    return {"mean": float(values.mean()), "min": float(values.min())}


def scifact_index(data: Path, root: Path) -> Path:
    """The SciFact index built by the torch reference encoder (reused when already built)."""
    docs = list(with_demo_metadata(read_corpus(data)))
    live = current_build_dir(root)
    if live is not None:
        try:
            manifest = read_manifest(live)
            if manifest.n_docs == len(docs) and manifest.encoder.encoder_id == TORCH_ID:
                return root
        except RetrievalError as exc:  # e.g. a format change since it was built
            print(f"  build at {root} not usable ({exc}); rebuilding")
    # Publishing a new build only when needed: benchmarks.search may be reading this root.
    build_index(docs, root, encoder=SentenceTransformerEncoder(), progress=True)
    return root


def ndcg_per_config(configs: list[Config], latency: dict[str, Any], queries: list[str],
                    data: Path, root: Path) -> dict[str, float]:
    """SciFact test nDCG@10, each config's single-query vectors fed to the default retriever."""
    from benchmarks.quality import evaluate_run, retriever_run
    from retrieval import Retriever

    qrels = read_qrels(data / "qrels" / "test.tsv")
    test = {q: t for q, t in read_queries(data / "queries.jsonl").items() if q in qrels}
    row = {text: i for i, text in enumerate(queries)}
    scores = {}
    for c in configs:
        vectors = latency[c.name]["vectors"][[row[t] for t in test.values()]]
        retriever = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=c.encoder)
        try:
            run = retriever_run(retriever, test, query_vectors=vectors)
        finally:
            retriever.close()
        scores[c.name] = evaluate_run(qrels, run)["ndcg@10"]
    return scores


# -- report ----------------------------------------------------------------------------------


def recommend(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The backend of the fastest single-query p50 among configurations within NDCG_TOLERANCE
    of torch, with that backend's thread count of lowest p95 (a tail that grows with threads
    means they fight over the cores)."""
    torch_ndcg = next((r["ndcg@10"] for r in rows if r["backend"] == "torch"), None)
    fine = [r for r in rows if torch_ndcg is None or r["ndcg@10"] is None
            or abs(r["ndcg@10"] - torch_ndcg) <= NDCG_TOLERANCE]
    if not fine:
        return None
    backend = min(fine, key=lambda r: r["latency"]["p50"])["backend"]
    steady = min((r for r in fine if r["backend"] == backend), key=lambda r: r["latency"]["p95"])
    return {"backend": backend, "threads": steady["threads"],
            "ndcg_checked": torch_ndcg is not None}


def render_ceiling(ceiling: dict[str, Any]) -> list[str]:
    table = []
    for name, per_size in ceiling["ms_per_query"].items():
        cells = [f"{per_size[b]:.2f}" for b in ceiling["sizes"]]
        table.append([name, *cells, f"{per_size[1] / min(per_size.values()):.2f}x"])
    sizes = [f"ms/query at batch {b}" for b in ceiling["sizes"]]
    return [f"Batching ceiling ({ceiling['tokens']}-token queries, no padding, one thread):", "",
            markdown_table(["backend (threads)", *sizes, "most batching can gain"], table)]


def render(rows: list[dict[str, Any]], docs: dict[str, Any], best: dict[str, Any] | None
           ) -> str:
    torch_p50 = rows[0]["latency"]["p50"]
    torch_ndcg = rows[0]["ndcg@10"]
    table = []
    for r in rows:
        ndcg = "—" if r["ndcg@10"] is None else f"{r['ndcg@10']:.4f}"
        if r["ndcg@10"] is not None and torch_ndcg is not None and r is not rows[0]:
            ndcg += f" ({r['ndcg@10'] - torch_ndcg:+.4f})"
        table.append([r["name"], percentile_cells(r["latency"]), fmt_ms(r["latency"]["max"]),
                      f"{torch_p50 / r['latency']['p50']:.1f}x",
                      f"{r['query_cosine']['mean']:.4f} / {r['query_cosine']['min']:.4f}", ndcg])
    lines = [markdown_table(["backend (threads)", "query p50 / p95 / p99 ms", "max ms",
                             "speed-up p50", "query cos to torch mean / min",
                             "SciFact nDCG@10 (Δ torch)"], table), ""]
    lines.append(markdown_table(
        ["backend (threads)", "docs/s", "doc cos to torch mean / min"],
        [[name, f"{d['docs_per_s']:.1f}", f"{d['cosine']['mean']:.4f} / {d['cosine']['min']:.4f}"]
         for name, d in docs.items()]))
    if best is not None:
        within = f"within {NDCG_TOLERANCE} nDCG@10 of torch" if best["ndcg_checked"] else \
            "nDCG@10 not measured"
        lines += ["", f"Recommended query encoder: **{best['backend']}** (fastest p50, {within}); "
                      f"threads: **{best['threads']}** (its lowest p95)."]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.encoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SciFact BEIR folder")
    p.add_argument("--queries", type=int, default=None, help="queries to time (default: all)")
    p.add_argument("--warmup", type=int, default=50, help="queries run first and discarded")
    p.add_argument("--docs", type=int, default=1000, help="documents for throughput")
    p.add_argument("--block", type=int, default=250, help="documents per interleaving turn")
    p.add_argument("--chunk", type=int, default=100, help="queries per interleaving turn")
    p.add_argument("--no-ndcg", action="store_true", help="skip the nDCG@10 evaluation")
    p.add_argument("--work", type=Path, default=REPO / "build" / "bench",
                   help="where the SciFact index lives (shared with benchmarks.search)")
    p.add_argument("--cache-dir", type=Path, default=None, help="ONNX cache (default per model)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--quick", action="store_true", help="300 queries, 200 docs, no nDCG")
    args = p.parse_args(argv)
    if args.quick:
        args.queries, args.docs, args.no_ndcg = args.queries or 300, 200, True
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    queries = list(read_queries(args.data / "queries.jsonl").values())[:args.queries]
    docs = [d.content for d in itertools.islice(read_corpus(args.data), args.docs)]
    print(f"{len(queries)} queries, {len(docs)} documents from {args.data}")
    single, batch = make_configs(args.cache_dir)
    latency = single_query_latency(single, queries, args.warmup, args.chunk)
    throughput = document_throughput(batch, docs, args.block)
    ceiling = batch_ceiling(single, queries)
    reference_q = latency[single[0].name]["vectors"]
    reference_d = throughput[batch[0].name]["vectors"]
    ndcg: dict[str, float] = {}
    if not args.no_ndcg:
        root = scifact_index(args.data, args.work / args.data.name)
        ndcg = ndcg_per_config(single, latency, queries, args.data, root)
    rows = [{"name": c.name, "backend": c.backend, "threads": c.threads,
             "encoder_id": c.encoder.encoder_id, "latency": latency[c.name]["summary"],
             "query_cosine": cosines(latency[c.name]["vectors"], reference_q),
             "ndcg@10": ndcg.get(c.name)} for c in single]
    docs_out = {c.name: {"docs_per_s": throughput[c.name]["docs_per_s"],
                         "block_ms": throughput[c.name]["block_ms"],
                         "cosine": cosines(throughput[c.name]["vectors"], reference_d)}
                for c in batch}
    best = recommend(rows)
    markdown = "\n".join(["# Query encoders on SciFact", "", render(rows, docs_out, best), "",
                          *render_ceiling(ceiling)])
    print(markdown)
    env = environment()
    env["packages"].update({name: package_version(name) for name in EXTRA_PACKAGES})
    payload = {"benchmark": "encoders", "config": {k: str(v) for k, v in vars(args).items()},
               "n_queries": len(queries), "n_docs": len(docs), "environment": env,
               "single_query": rows, "documents": docs_out, "recommended": best,
               "batch_ceiling": ceiling,
               "raw_ms": {name: latency[name]["wall_ms"] for name in latency}}
    json_path, md_path = write_results("encoders", payload, markdown, args.out)
    plot = plot_cdfs({"SciFact single-query encode": {n: v["wall_ms"] for n, v in latency.items()}},
                     json_path.with_suffix(".png"), xlabel="encode latency (ms, log scale)")
    print(f"wrote {json_path}, {md_path}" + (f", {plot}" if plot else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
