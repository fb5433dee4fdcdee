"""Framework adapter overhead: ``python -m benchmarks.adapters``.

On SciFact, side by side in one run (the calls take turns in chunks of queries), the same
queries through ``Retriever.search`` and through each adapter (LangChain ``invoke``, LlamaIndex
``retrieve``; ``asearch`` against ``ainvoke`` / ``aretrieve`` on one event loop), k=10:

- result-cache hit: an in-process cache primed with every query, so the engine's share is
  smallest and the adapter's share most visible;
- full miss: no cache, every call encodes its query (ONNX INT8) and runs the whole pipeline.

The added time is measured per call: the adapter call's wall time minus the wall time of the
engine call it made (a forwarding backend times it), so a burst of load from a neighbour on a
shared machine lands in the added figure only when it hits the adapter's own code; p95 of the
difference of two noisy end-to-end distributions would mostly measure the neighbours. The
conversion alone (``to_documents`` / ``to_nodes`` on a 10-hit result) is timed too: the part
of the overhead that is ours rather than the framework's callback and instrumentation layer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    markdown_table,
    measure,
    measure_side_by_side,
    package_version,
    percentile_cells,
    publish_report,
    verdict,
)
from indexes.build import build_index
from indexes.corpus import read_corpus, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import SentenceTransformerEncoder
from retrieval import Retriever, SearchResult
from retrieval.latency import summarize

K = 10
TARGET_MS = 0.1  # p95 an adapter may add over Retriever.search
FLOOR_LANGCHAIN = "LangChain invoke of a retriever returning nothing"
FLOOR_LLAMAINDEX = "LlamaIndex retrieve of a retriever returning nothing"
AFLOOR_LANGCHAIN = "LangChain ainvoke of a retriever returning nothing"
AFLOOR_LLAMAINDEX = "LlamaIndex aretrieve of a retriever returning nothing"
FLOORS = (FLOOR_LANGCHAIN, FLOOR_LLAMAINDEX, AFLOOR_LANGCHAIN, AFLOOR_LLAMAINDEX)


class EngineClock:
    """A SearchBackend forwarding to the Retriever; ``last`` is the (wall, this thread's CPU)
    seconds of the last call it forwarded."""

    def __init__(self, engine: Retriever) -> None:
        self.engine, self.last = engine, (0.0, 0.0)

    def search(self, *args: Any, **kwargs: Any) -> SearchResult:
        started = now()
        try:
            return self.engine.search(*args, **kwargs)
        finally:
            self.last = since(started)

    def search_batch(self, *args: Any, **kwargs: Any) -> list[SearchResult]:
        started = now()
        try:
            return self.engine.search_batch(*args, **kwargs)
        finally:
            self.last = since(started)

    async def asearch(self, *args: Any, **kwargs: Any) -> SearchResult:
        started = now()
        try:
            return await self.engine.asearch(*args, **kwargs)
        finally:
            self.last = since(started)

    async def asearch_batch(self, *args: Any, **kwargs: Any) -> list[SearchResult]:
        started = now()
        try:
            return await self.engine.asearch_batch(*args, **kwargs)
        finally:
            self.last = since(started)


def now() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def since(started: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = now()
    return wall - started[0], cpu - started[1]


def load(data: Path, work: Path, config: dict[str, Any]) -> Retriever:
    """Documents encoded by the torch reference; queries by the default (ONNX INT8) encoder."""
    root = work / data.name
    if not (root / "CURRENT").is_file():
        build_index(with_demo_metadata(read_corpus(data)), root,
                    encoder=SentenceTransformerEncoder())
    return Retriever.load(root, config)


class Calls:
    """The runners of one scenario, and the milliseconds each adapter call added: wall time,
    and CPU time of the calling thread (which a neighbour's load does not inflate)."""

    def __init__(self, engine: Retriever, loop: asyncio.AbstractEventLoop) -> None:
        from retrieval.integrations.langchain import LangChainRetriever
        from retrieval.integrations.llamaindex import LlamaIndexRetriever

        self.loop, self.backend = loop, EngineClock(engine)
        chain = LangChainRetriever(self.backend, k=K)
        index = LlamaIndexRetriever(self.backend, k=K)
        floor_chain, floor_index = framework_floors()
        self.added: dict[str, dict[str, list[float]]] = {}
        self.runners: dict[str, Callable[[str], Any]] = {
            "Retriever.search": lambda q: engine.search(q, k=K),
            "LangChain invoke": self._sync("LangChain invoke", chain.invoke),
            "LlamaIndex retrieve": self._sync("LlamaIndex retrieve", index.retrieve),
            "Retriever.asearch": lambda q: loop.run_until_complete(engine.asearch(q, k=K)),
            "LangChain ainvoke": self._async("LangChain ainvoke", chain.ainvoke),
            "LlamaIndex aretrieve": self._async("LlamaIndex aretrieve", index.aretrieve),
            FLOOR_LANGCHAIN: self._sync(FLOOR_LANGCHAIN, floor_chain.invoke),
            FLOOR_LLAMAINDEX: self._sync(FLOOR_LLAMAINDEX, floor_index.retrieve),
            AFLOOR_LANGCHAIN: self._async(AFLOOR_LANGCHAIN, floor_chain.ainvoke),
            AFLOOR_LLAMAINDEX: self._async(AFLOOR_LLAMAINDEX, floor_index.aretrieve),
        }

    def _record(self, name: str, started: tuple[float, float]) -> None:
        wall, cpu = since(started)
        inner_wall, inner_cpu = self.backend.last
        self.backend.last = (0.0, 0.0)  # a floor retriever makes no engine call
        added = self.added.setdefault(name, {"wall": [], "cpu": []})
        added["wall"].append((wall - inner_wall) * 1e3)
        added["cpu"].append((cpu - inner_cpu) * 1e3)

    def _sync(self, name: str, call: Callable[[str], Any]) -> Callable[[str], Any]:
        def run(query: str) -> Any:
            started = now()
            output = call(query)
            self._record(name, started)
            return output
        return run

    def _async(self, name: str, call: Callable[[str], Awaitable[Any]]) -> Callable[[str], Any]:
        async def timed(query: str) -> Any:  # timed inside the loop, as the sync calls are
            started = now()
            output = await call(query)
            self._record(name, started)
            return output
        return lambda query: self.loop.run_until_complete(timed(query))


def framework_floors() -> tuple[Any, Any]:
    """A retriever of each framework that returns nothing at once, sync and async (without
    the async method each framework would run the sync one in a thread): the framework's own
    cost."""
    from langchain_core.retrievers import BaseRetriever as LangChainBase
    from llama_index.core.retrievers import BaseRetriever as LlamaIndexBase

    class NothingLangChain(LangChainBase):
        def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Any]:
            return []

        async def _aget_relevant_documents(self, query: str, *, run_manager: Any) -> list[Any]:
            return []

    class NothingLlamaIndex(LlamaIndexBase):
        def _retrieve(self, query_bundle: Any) -> list[Any]:
            return []

        async def _aretrieve(self, query_bundle: Any) -> list[Any]:
            return []

    return NothingLangChain(), NothingLlamaIndex()


def scenario(engine: Retriever, queries: Sequence[str], warmup: int) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    try:
        calls = Calls(engine, loop)
        samples = measure_side_by_side(calls.runners, queries[warmup:], warmup=queries[:warmup],
                                       chunk=50)
    finally:
        loop.close()
    for name, sample in samples.items():  # every call returned k results for every query
        expected = 0 if name in FLOORS else K
        assert all(len(getattr(out, "hits", out)) == expected for out in sample.outputs), name
    return {"end_to_end": {name: sample.summary() for name, sample in samples.items()},
            "added": {name: {kind: summarize(ms[warmup:]) for kind, ms in added.items()}
                      for name, added in calls.added.items()}}


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
                "conversion only": conversion(hit, queries, args.warmup),
                "frameworks": {name: package_version(name)
                               for name in ("langchain-core", "llama-index-core")}}
    finally:
        hit.close()
        miss.close()


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    scenarios = ("result-cache hit", "full miss (no cache)")
    end_rows = [[s, name, summary["n"], percentile_cells(summary)]
                for s in scenarios for name, summary in results[s]["end_to_end"].items()]
    added_rows, checks = [], []
    for s in scenarios:
        for name, added in results[s]["added"].items():
            wall, cpu = added["wall"], added["cpu"]
            added_rows.append([s, name, wall["n"], percentile_cells(wall), percentile_cells(cpu)])
            if "nothing" not in name:
                checks.append(f"- {name}, {s}: adds {wall['p95']:.3f} ms wall / "
                              f"{cpu['p95']:.3f} ms CPU at p95, target <= {TARGET_MS} ms "
                              f"{verdict(max(wall['p95'], cpu['p95']) <= TARGET_MS)}")
    convert = results["conversion only"]
    return "\n".join([
        f"# Adapter overhead ({args.data.name}, k={K}, ONNX INT8 query encoder)", "",
        ", ".join(f"{name} {version}" for name, version in results["frameworks"].items()), "",
        "End to end, side by side:", "",
        markdown_table(["scenario", "call", "n", "p50 / p95 / p99 ms"], end_rows), "",
        "Added per call (the adapter call minus the engine call it made; for the retrievers "
        "returning nothing, the whole call):", "",
        markdown_table(["scenario", "call", "n", "added wall p50 / p95 / p99 ms",
                        "added CPU p50 / p95 / p99 ms"], added_rows), "",
        markdown_table(["conversion of a 10-hit result", "p50 / p95 / p99 ms"],
                       [[name, percentile_cells(s)] for name, s in convert.items()]), "",
        *checks,
    ])


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
