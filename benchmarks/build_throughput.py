"""Document encoding throughput of a build: sentence-transformers against the fp32 ONNX export
on this machine, and the Ray build (Ray Data actor pool) with 1 and 2 encoder workers.

    python -m benchmarks.build_throughput --docs 400

SciFact documents (title + abstract), batch size 64, cut by length. The local rows time the
encoder alone (model loaded before timing); the Ray rows time ``indexes.ray_build.encode_on_ray``
on a local cluster (2 CPUs) end to end, including the actors' model load, as a nightly build
pays it. Cosines of every vector to the sentence-transformers one are reported.
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, markdown_table, publish_report
from indexes.corpus import read_corpus
from indexes.onnx_encoder import make_encoder
from indexes.ray_build import encode_on_ray

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact"


def timed(run: Any) -> tuple[float, np.ndarray]:
    began = time.perf_counter()
    vectors = run()
    return time.perf_counter() - began, vectors


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--docs", type=int, default=400)
    p.add_argument("--backend", default="onnx", help="encoder of the Ray rows")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    texts = [d.content for d in itertools.islice(read_corpus(args.data), args.docs)]
    rows: dict[str, dict[str, float]] = {}
    reference = None
    for backend in ("torch", "onnx"):
        encoder = make_encoder(backend)
        encoder.encode(texts[:8])  # warm up
        seconds, vectors = timed(lambda e=encoder: e.encode(texts, batch_size=64))
        reference = vectors if reference is None else reference
        rows[f"{backend} (local)"] = {"seconds": seconds, "docs_per_s": len(texts) / seconds,
                                      "min_cos": float(np.min(np.sum(vectors * reference, 1)))}
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for workers in (1, 2):
            seconds, vectors = timed(lambda w=workers: encode_on_ray(
                texts, list(range(len(texts))), args.backend, None, w, 64, 384))
            rows[f"{args.backend} on Ray, {workers} worker(s)"] = {
                "seconds": seconds, "docs_per_s": len(texts) / seconds,
                "min_cos": float(np.min(np.sum(vectors * reference, 1)))}
    finally:
        ray.shutdown()
    table = markdown_table(["encoder", "docs/s", "seconds", "min cosine to torch"],
                           [[k, f"{v['docs_per_s']:.1f}", f"{v['seconds']:.1f}",
                             f"{v['min_cos']:.5f}"] for k, v in rows.items()])
    publish_report("build-throughput", args, rows,
                   f"## Build encoding throughput: {len(texts)} SciFact documents\n\n{table}")


if __name__ == "__main__":
    main()
