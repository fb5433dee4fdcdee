"""Build throughput with vectors given, side by side with tantivy's writer, on the realistic
synthetic corpus (``benchmarks.synthetic_corpus``: Zipfian vocabulary, 60-140 words a passage,
metadata) with clustered vectors (so the dense leg trains and calibrates IVF as on real
embeddings).

    python -m benchmarks.build_speed --docs 111269 1000000

Each build runs in a fresh process (so its peak RSS is its own), after the corpus is made:
``build_index`` with 1 and 2 analysis workers and with compact postings (its stage times,
index size, bytes per BM25 posting, peak RSS), and tantivy 0.27 (``en_stem``, an id and the
text, one and two writer threads, committed and merged). tantivy builds only a keyword index;
the project's build also writes the metadata index, the typo dictionary, the document store
and the dense leg (IVF trained, filled and calibrated). With vectors given and more than one
core the dense leg runs in a thread beside the keyword side from the start
(``indexes.ann_built.dense_beside``), so the keyword side's seconds are its wall time with the
dense leg beside it, and "write+publish" holds the writers and the wait for what is left of
the dense leg; pinned to one core (``--cores 1``) the dense leg is built in "write+publish".

Each build also reports its CPU seconds over all its threads: a one-worker build of the
project still runs faiss and the checksums on every core, so wall seconds alone mix a
build's work with its parallelism. ``--cores N`` pins every build to N cores (1: what each
engine does per core):

    python -m benchmarks.build_speed --docs 1000000 --configs project:1 tantivy:1 --cores 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, markdown_table, publish_report
from benchmarks.synthetic import clustered_unit_vectors
from benchmarks.synthetic_corpus import CorpusSpec, generate

CONFIGS = ("project:1", "project:2", "project:1:compact", "tantivy:1", "tantivy:2")
# The files holding a BM25 format's postings (per posting; per-term arrays are apart).
POSTING_FILES = {"plain": ("rows", "impacts"),
                 "compact": ("row_bytes", "tf", "tf_exceptions", "norms")}


def corpus_texts(n_docs: int) -> tuple[list[str], list[dict[str, object]]]:
    corpus = generate(CorpusSpec(n_docs=n_docs))
    vocab = np.array(corpus.vocab)
    texts = [" ".join(vocab[corpus.words[corpus.offsets[i]:corpus.offsets[i + 1]]])
             for i in range(n_docs)]
    return texts, [corpus.record(i) for i in range(n_docs)]


def build_project(n_docs: int, workers: int, work: Path, postings: str = "plain"
                  ) -> dict[str, Any]:
    from indexes.build import BuildConfig, build_index
    from indexes.docstore import Document
    from indexes.manifest import EncoderInfo

    texts, records = corpus_texts(n_docs)
    docs = [Document(id=f"p{i}", text=t, metadata=r)
            for i, (t, r) in enumerate(zip(texts, records, strict=True))]
    vectors = clustered_unit_vectors(n_docs, 384)
    info = EncoderInfo(encoder_id="given", model="given", dim=384, vector_dtype="float32")
    began, cpu_began = time.perf_counter(), time.process_time()
    report = build_index(docs, work, vectors=vectors, encoder_info=info, progress=False,
                         config=BuildConfig(analysis_workers=workers,
                                            postings=postings))  # type: ignore[arg-type]
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
    bm25 = report.path / "bm25"
    size = sum((bm25 / f"{name}.npy").stat().st_size for name in POSTING_FILES[postings])
    nnz = int(np.load(bm25 / "indptr.npy", mmap_mode="r")[-1])
    ann = json.loads((report.path / "ann" / "ann.json").read_text())
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "stages": report.seconds,
            "size_bytes": report.size_bytes,
            "peak_rss_bytes": report.peak_rss_bytes, "postings": nnz,
            "bytes_per_posting": size / nnz, "ann": ann.get("kind"),
            "nprobe": ann.get("nprobe")}


def build_tantivy(n_docs: int, threads: int, work: Path) -> dict[str, Any]:
    import resource

    import tantivy

    texts, _ = corpus_texts(n_docs)
    schema = tantivy.SchemaBuilder()
    schema.add_text_field("id", stored=True, tokenizer_name="raw")
    schema.add_text_field("body", tokenizer_name="en_stem")
    work.mkdir(parents=True)
    # Made before the clock starts, as the project's Documents are (~2.4 s of Python a 1M).
    documents = [tantivy.Document(id=f"p{i}", body=text) for i, text in enumerate(texts)]
    began, cpu_began = time.perf_counter(), time.process_time()
    index = tantivy.Index(schema.build(), path=str(work))
    writer = index.writer(heap_size=512_000_000, num_threads=threads)
    for document in documents:
        writer.add_document(document)
    writer.commit()
    writer.wait_merging_threads()
    seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - cpu_began
    size = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "size_bytes": size,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_one(config: str, n_docs: int) -> dict[str, Any]:
    """One build in this process; the JSON line the parent reads. ``cpu_seconds``: the
    build's CPU time over all its threads (the corpus is made before, and not counted)."""
    engine, workers, *postings = config.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        if engine == "project":
            return build_project(n_docs, int(workers), Path(tmp) / "index", *postings)
        return build_tantivy(n_docs, int(workers), Path(tmp) / "index")


def on_cores(cores: int | None) -> Callable[[], None] | None:
    """A child's set-up pinning it to the first ``cores`` usable cores (None: all), before it
    imports anything: BLAS, OpenMP (faiss) and numba size their threads by the cores they
    see, so a pinned build runs as it would on a machine of that many cores."""
    if cores is None:
        return None
    chosen = sorted(os.sched_getaffinity(0))[:cores]
    return lambda: os.sched_setaffinity(0, chosen)


def in_fresh_process(config: str, n_docs: int, cores: int | None = None) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.build_speed", "--one", config,
                          "--docs", str(n_docs)], check=True, capture_output=True, text=True,
                         preexec_fn=on_cores(cores))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{n_docs} {config}: {result['seconds']:.1f} s", file=sys.stderr)
    return result


def rows_of(n_docs: int, results: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for config, r in results.items():
        stages = r.get("stages", {})
        keyword = sum(v for k, v in stages.items() if k not in ("vectors", "write+publish"))
        rows.append([f"{n_docs:,}", config, f"{r['seconds']:.1f}",
                     f"{r['cpu_seconds']:.1f}", f"{n_docs / r['seconds']:,.0f}",
                     f"{keyword:.1f}" if stages else "",
                     f"{stages.get('write+publish', 0):.1f}" if stages else "",
                     f"{r['size_bytes'] / 2**20:,.0f}", f"{r['peak_rss_bytes'] / 2**20:,.0f}",
                     f"{r['bytes_per_posting']:.2f}" if "bytes_per_posting" in r else ""])
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, nargs="+", default=[111_269])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS))
    p.add_argument("--cores", type=int, default=None,
                   help="pin every build to this many cores (default: all usable)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.docs[0])))
        return
    results: dict[str, dict[str, dict[str, Any]]] = {}
    rows = []
    for n_docs in args.docs:
        results[str(n_docs)] = {c: in_fresh_process(c, n_docs, args.cores)
                                 for c in args.configs}
        rows += rows_of(n_docs, results[str(n_docs)])
    cores = f", pinned to {args.cores} core(s)" if args.cores else ""
    table = markdown_table(["passages", "build (engine:workers)", "seconds", "CPU s", "docs/s",
                            "analysis+BM25+typos+metadata s (dense leg beside)",
                            "write+publish s (docstore, checksums, the dense leg's rest)",
                            "index MiB", "peak RSS MiB", "bytes/posting"], rows)
    publish_report("build-speed", args, results,
                   f"## Build throughput, vectors given, against tantivy{cores}\n\n" + table)


if __name__ == "__main__":
    main()
