"""Framework adapter overhead: ``python -m benchmarks.adapters``.

On SciFact, side by side in one run (the runners take turns in chunks of queries), the same
queries through ``Retriever.search`` and through each adapter (LangChain ``invoke``, LlamaIndex
``retrieve``; ``asearch`` against ``ainvoke`` / ``aretrieve`` on one event loop), k=10:

- result-cache hit: an in-process cache primed with every query, so the engine's share is
  smallest and the adapter's share most visible;
- full miss: no cache, every call encodes its query (ONNX INT8) and runs the whole pipeline.

The added time is the adapter's percentile minus the engine's at the same percentile. The
conversion alone (``to_documents`` / ``to_nodes`` on a 10-hit result) is timed too: the part
of the overhead that is ours rather than the framework's callback and instrumentation layer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    fmt_ms,
    markdown_table,
    measure,
    measure_side_by_side,
    percentile_cells,
    publish_report,
    verdict,
)
from indexes.build import build_index
from indexes.corpus import read_corpus, read_queries
from indexes.encoders import SentenceTransformerEncoder
from indexes.synthetic import with_demo_metadata
from retrieval import Retriever

K = 10
TARGET_MS = 0.1  # p95 an adapter may add over Retriever.search
# Each adapter call against the engine call it wraps.
BASELINE = {"LangChain invoke": "Retriever.search", "LlamaIndex retrieve": "Retriever.search",
            "LangChain ainvoke": "Retriever.asearch", "LlamaIndex aretrieve": "Retriever.asearch"}


def load(data: Path, work: Path, config: dict[str, Any]) -> Retriever:
    """Documents encoded by the torch reference; queries by the default (ONNX INT8) encoder."""
    root = work / data.name
    if not (root / "CURRENT").is_file():
        build_index(with_demo_metadata(read_corpus(data)), root,
                    encoder=SentenceTransformerEncoder())
    return Retriever.load(root, config)


def runners(engine: Retriever, loop: asyncio.AbstractEventLoop
            ) -> dict[str, Callable[[str], Any]]:
    from retrieval.integrations.langchain import LangChainRetriever
    from retrieval.integrations.llamaindex import LlamaIndexRetriever

    chain, index = LangChainRetriever(engine, k=K), LlamaIndexRetriever(engine, k=K)
    return {
        "Retriever.search": lambda q: engine.search(q, k=K),
        "LangChain invoke": chain.invoke,
        "LlamaIndex retrieve": index.retrieve,
        "Retriever.asearch": lambda q: loop.run_until_complete(engine.asearch(q, k=K)),
        "LangChain ainvoke": lambda q: loop.run_until_complete(chain.ainvoke(q)),
        "LlamaIndex aretrieve": lambda q: loop.run_until_complete(index.aretrieve(q)),
    }


def scenario(engine: Retriever, queries: Sequence[str], warmup: int) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    try:
        samples = measure_side_by_side(runners(engine, loop), queries[warmup:],
                                       warmup=queries[:warmup], chunk=50)
    finally:
        loop.close()
    for name, sample in samples.items():  # every runner returned k results for every query
        assert all(len(getattr(out, "hits", out)) == K for out in sample.outputs), name
    return {name: sample.summary() for name, sample in samples.items()}


def conversion(engine: Retriever, queries: Sequence[str], warmup: int) -> dict[str, Any]:
    from retrieval.integrations.langchain import to_documents
    from retrieval.integrations.llamaindex import to_nodes

    results = [engine.search(q, k=K) for q in queries]
    return {"to_documents": measure(to_documents, results[warmup:], results[:warmup]).summary(),
            "to_nodes": measure(to_nodes, results[warmup:], results[:warmup]).summary()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    queries = list(read_queries(args.data / "queries.jsonl").values())[: args.queries]
    hit = load(args.data, args.work, {"cache": {"backend": "memory"}})
    for query in queries:  # prime: every timed call below is a result-cache hit
        hit.search(query, k=K)
    hit.flush_cache_writes(timeout=30)
    miss = load(args.data, args.work, {"cache": {"backend": "none"}})
    try:
        return {"result-cache hit": scenario(hit, queries, args.warmup),
                "full miss (no cache)": scenario(miss, queries, args.warmup),
                "conversion only": conversion(hit, queries, args.warmup)}
    finally:
        hit.close()
        miss.close()


def added(summary: dict[str, float], base: dict[str, float], key: str) -> float:
    return summary[key] - base[key]


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    rows, checks = [], []
    for scenario_name in ("result-cache hit", "full miss (no cache)"):
        block = results[scenario_name]
        for name, summary in block.items():
            extra = ""
            if name in BASELINE:
                base = block[BASELINE[name]]
                extra = " / ".join(fmt_ms(added(summary, base, p)) for p in ("p50", "p95"))
                checks.append((f"{name}, {scenario_name}", added(summary, base, "p95")))
            rows.append([scenario_name, name, summary["n"], percentile_cells(summary), extra])
    convert = results["conversion only"]
    lines = [
        f"# Adapter overhead ({args.data.name}, k={K}, ONNX INT8 query encoder)", "",
        markdown_table(["scenario", "call", "n", "p50 / p95 / p99 ms",
                        "added p50 / p95 ms"], rows), "",
        markdown_table(["conversion of a 10-hit result", "p50 / p95 / p99 ms"],
                       [[name, percentile_cells(s)] for name, s in convert.items()]), "",
        *(f"- {name}: p95 added {value:.3f} ms, target <= {TARGET_MS} ms "
          f"{verdict(value <= TARGET_MS)}" for name, value in checks),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.adapters", description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--queries", type=int, default=None, help="default: all")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if not (args.data / "corpus.jsonl").is_file():
        raise SystemExit(f"no BEIR dataset at {args.data}; pass --data")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = run(args)
    publish_report("adapters", args, results, render(results, args), key="results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
