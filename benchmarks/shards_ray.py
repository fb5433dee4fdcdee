"""The Ray Serve hop: the same on-disk sharded build searched in this process
(``Retriever.load``) and through Ray Serve shard deployments (``Retriever.connect``), side by
side (a local Ray cluster with 2 CPUs).

    python -m benchmarks.shards_ray --docs 50000

Query vectors given, no cache; both return the same hits (checked). The hop is the p50 / p95
difference: serialization of the calls and answers, three fan-outs over Ray (BM25 top C; the
dense leg with the candidates' cosines; hydration), the replicas' thread hand-offs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, measure_side_by_side, publish_report
from benchmarks.synthetic import random_unit_vectors
from benchmarks.synthetic_corpus import CorpusSpec, generate
from benchmarks.synthetic_corpus import queries as corpus_queries
from indexes.build import BuildConfig, build_index
from indexes.docstore import Document
from indexes.manifest import EncoderInfo
from retrieval import Retriever

DIM = 384
CONFIG: dict[str, Any] = {"cache": {"backend": "none"}}


def write_sharded(root: Path, n_docs: int, shards: int) -> list[str]:
    """A sharded build of the synthetic corpus; returns query texts of its vocabulary."""
    corpus = generate(CorpusSpec(n_docs))
    docs = [Document(f"doc-{i}", " ".join(corpus.tokens(i))) for i in range(n_docs)]
    info = EncoderInfo(encoder_id="bench:random:fp32:384", model="bench", dim=DIM,
                       vector_dtype="float32")
    config = BuildConfig(analyzer={"stemmer": None, "stop_words": ()})
    build_index(docs, root, shards=shards, vectors=random_unit_vectors(n_docs, DIM, seed=3),
                        encoder_info=info, config=config, progress=False, dense="exact")
    return [" ".join(t) for t in corpus_queries(corpus, 1000, seed=1)]


def ray_hop(n_docs: int, n_queries: int, warmup: int, shards: int = 2) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        texts = write_sharded(Path(tmp), n_docs, shards)[:n_queries]
        vectors = random_unit_vectors(len(texts), DIM, seed=4)
        return {"docs": n_docs, "shards": shards,
                **hop_over(Path(tmp), texts, vectors, warmup)}


def hop_over(root: Path, texts: list[str], vectors: Any, warmup: int) -> dict[str, Any]:
    """The sharded build under ``root`` searched in this process and on Ray Serve (a local
    cluster with 2 CPUs, one replica per shard), side by side: e2e p50/p95/p99 of each, the
    hop, and whether both returned the same hits."""
    import ray
    from ray import serve

    from retrieval.sharding.ray_serve import serve_shards

    local = Retriever.load(root, CONFIG)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve_shards(root, CONFIG)
        remote = Retriever.connect(root, CONFIG)
        runners = {
            "in-process": lambda i: local.search(texts[i], None, 10, query_vector=vectors[i]),
            "Ray Serve": lambda i: remote.search(texts[i], None, 10, query_vector=vectors[i]),
        }
        samples = measure_side_by_side(runners, list(range(warmup, len(texts))),
                                       list(range(warmup)), chunk=50)
        remote.close()
    finally:
        serve.shutdown()
        ray.shutdown()
        local.close()
    e2e = {name: s.summary() for name, s in samples.items()}
    same = [[h.doc_id for h in o.hits] for o in samples["in-process"].outputs] == [
        [h.doc_id for h in o.hits] for o in samples["Ray Serve"].outputs]
    return {"e2e": e2e, "equal": same,
            "hop_ms_p50": e2e["Ray Serve"]["p50"] - e2e["in-process"]["p50"],
            "hop_ms_p95": e2e["Ray Serve"]["p95"] - e2e["in-process"]["p95"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=50_000)
    p.add_argument("--queries", type=int, default=600)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    result = ray_hop(args.docs, args.queries, args.warmup)
    rows = "\n".join(f"| {k} | {v['p50']:.3f} / {v['p95']:.3f} / {v['p99']:.3f} |"
                     for k, v in result["e2e"].items())
    markdown = (f"## Ray Serve hop: {args.docs:,} passages in {result['shards']} shards\n\n"
                f"| search | p50 / p95 / p99 ms |\n|---|---|\n{rows}\n\n"
                f"hop: {result['hop_ms_p50']:.2f} ms at p50, {result['hop_ms_p95']:.2f} ms at "
                f"p95; same hits: {result['equal']}")
    publish_report("shards-ray", args, result, markdown)


if __name__ == "__main__":
    main()
