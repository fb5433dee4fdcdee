"""Async adapters never block the event loop: 16 concurrent ``ainvoke`` / ``aretrieve`` calls
while a 1 ms heartbeat ticks; its longest stall must stay below the time of one search.

The bound is measured in the same run, never a fixed number of milliseconds: the median of the
16 searches as the engine timed them (``timings["total"]``). A loop that ran a search itself
would stall for at least that search, and with 16 started together for the sum of those it ran
in one step. What remains is the machine's scheduling and GIL hand-over while the searches'
threads run (on a loaded 2-core machine it reached tens of ms, below the median search but not
always below the fastest one). A control run with a blocking call shows the heartbeat does
catch a stalled loop.
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



class Timed:
    """A SearchBackend forwarding to the real Retriever, keeping each async search's own time."""

    def __init__(self, inner: Retriever) -> None:
        self.inner, self.seconds = inner, []

    def search(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.search(*args, **kwargs)

    def search_batch(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.search_batch(*args, **kwargs)

    async def asearch(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.inner.asearch(*args, **kwargs)
        self.seconds.append(result.timings["total"] / 1e3)
        return result

    async def asearch_batch(self, *args: Any, **kwargs: Any) -> Any:
        return await self.inner.asearch_batch(*args, **kwargs)


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


def adapter(framework: str, backend: Timed) -> Callable[[str], Awaitable[Any]]:
    if framework == "langchain":
        return langchain.LangChainRetriever(backend, k=5).ainvoke
    return llamaindex.LlamaIndexRetriever(backend, k=5).aretrieve


@pytest.mark.parametrize("framework", ["langchain", "llamaindex"])
def test_sixteen_concurrent_calls_never_stall_the_loop(uncached_scifact, framework):
    backend = Timed(uncached_scifact)
    call = adapter(framework, backend)
    stall, results = asyncio.run(longest_stall([lambda q=q: call(q) for q in QUERIES]))
    assert len(results) == 16 and all(len(r) == 5 for r in results)
    assert len(backend.seconds) == 16
    one_search = statistics.median(backend.seconds)
    assert stall < one_search, (f"the loop stalled {stall * 1e3:.1f} ms; the median search "
                                f"took {one_search * 1e3:.1f} ms")


def test_the_heartbeat_catches_a_blocking_call(uncached_scifact):
    """Control: a coroutine that calls the blocking ``search`` stalls the loop for a search."""
    searches: list[float] = []

    async def blocking(query: str) -> Any:
        result = uncached_scifact.search(query, k=5)
        searches.append(result.timings["total"] / 1e3)
        return result

    stall, _ = asyncio.run(longest_stall([lambda q=q: blocking(q) for q in QUERIES[:4]]))
    assert stall >= min(searches)
