"""Async adapters never block the event loop: 16 concurrent ``ainvoke`` / ``aretrieve`` calls
while a 1 ms heartbeat ticks; its longest stall must stay below the time of one search.

The bound is the search time measured in the same test, never a fixed number of milliseconds;
a control run with a blocking call shows the heartbeat does catch a stalled loop.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from retrieval import Retriever

langchain = pytest.importorskip("retrieval.integrations.langchain",
                                reason="needs the langchain extra", exc_type=ImportError)
llamaindex = pytest.importorskip("retrieval.integrations.llamaindex",
                                 reason="needs the llamaindex extra", exc_type=ImportError)

QUERIES = [
    "statins lower cardiovascular risk", "vitamin D deficiency and bone fractures",
    "gene expression in tumor cells", "immune response to viral infection",
    "sleep and memory consolidation", "antibiotic resistance in hospital bacteria",
    "insulin signalling and obesity", "tau protein in Alzheimer disease",
    "smoking and lung cancer incidence", "exercise improves cardiac function",
    "microRNA regulation of stem cell differentiation", "malaria vaccine efficacy in children",
    "gut microbiome and inflammation", "DNA repair after radiation damage",
    "blood pressure control in elderly patients", "mutations in BRCA1 and breast cancer",
]


@pytest.fixture(scope="module")
def scifact(beir_index, encoder):
    root, _, _ = beir_index("scifact")
    # No cache: every one of the calls below is a full search (encode, BM25, re-rank).
    retriever = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=encoder)
    yield retriever
    retriever.close()


def one_search_seconds(retriever: Retriever) -> float:
    """Median wall time of one full search, measured now, on this machine."""
    times = []
    for query in QUERIES[:6]:
        started = time.perf_counter()
        retriever.search(f"{query} baseline", k=5)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def longest_stall(calls: list[Callable[[], Awaitable[Any]]]) -> tuple[float, list[Any]]:
    """Run ``calls`` concurrently beside a 1 ms heartbeat; (longest gap between ticks, results)."""
    running = True
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.005)  # the heartbeat is ticking before the first search starts
    try:
        results = await asyncio.gather(*(call() for call in calls))
    finally:
        running = False
        await beat
    return max(gaps), results


def adapters(retriever: Retriever) -> dict[str, Callable[[str], Awaitable[Any]]]:
    chain = langchain.LangChainRetriever(retriever, k=5)
    index = llamaindex.LlamaIndexRetriever(retriever, k=5)
    return {"langchain": chain.ainvoke, "llamaindex": index.aretrieve}


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_sixteen_concurrent_calls_never_stall_the_loop(scifact, framework):
    search = one_search_seconds(scifact)
    call = adapters(scifact)[framework]
    stall, results = asyncio.run(longest_stall([lambda q=q: call(q) for q in QUERIES]))
    assert len(results) == 16 and all(len(r) == 5 for r in results)
    assert stall < search, (f"the loop stalled {stall * 1e3:.1f} ms; "
                            f"one search takes {search * 1e3:.1f} ms")


def test_the_heartbeat_catches_a_blocking_call(scifact):
    """Control: a coroutine that calls the blocking ``search`` stalls the loop for a search."""
    durations: list[float] = []

    async def blocking(query: str) -> Any:
        started = time.perf_counter()
        result = scifact.search(query, k=5)
        durations.append(time.perf_counter() - started)
        return result

    stall, _ = asyncio.run(longest_stall([lambda q=q: blocking(q) for q in QUERIES[:4]]))
    assert stall >= min(durations)
