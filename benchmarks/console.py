"""The search console on loopback, in one run: ``python -m benchmarks.console``.

1. **Time to first results**: a fresh browser page (Debian's chromium, headless, driven by
   Playwright) opens ``/console``, waits for the schema to render, types a query and presses
   Enter; the clock stops when the hits are in the page. Reported by the page's own clock
   (User Timing: navigation start to controls ready, submit to hits rendered, and the sum)
   and as the harness sees it (Playwright's round trips to the browser added), p50/p95/p99
   over ``--pages`` fresh pages; each page searches another query, so nothing is cached.
2. **The console's overhead on a search**: the same uncached searches over HTTP (httpx, one
   client, keep-alive) as ``POST /v1/search`` with the console off, with it on, and through
   ``POST /v1/console/search`` with a ranking side (``fusion="rrf"``, its retriever kept
   after the first call), p50/p95/p99. The page's own searches are ``/v1/search`` with
   ``explain``, also measured.

The index is SciFact with demo metadata, its vectors from an existing build
(``--vectors-from``); the server runs one worker with the result cache off.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DATA, REPO, RESULTS_DIR, markdown_table, publish_report
from benchmarks.http import serving
from benchmarks.live import scifact
from indexes import build_index
from indexes.corpus import read_queries
from retrieval.latency import summarize

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NO_CACHE = {"cache": {"backend": "none"}}


IN_PAGE = ("[performance.getEntriesByName('console-ready')[0].startTime, "
           "performance.getEntriesByName('search')[0].duration]")


def first_results(url: str, queries: list[str]) -> dict[str, dict[str, float]]:
    """Page load, first search and both, in ms, one fresh page per query: by the page's own
    clock (User Timing marks) and as the driving harness sees it."""
    from playwright.sync_api import sync_playwright

    load, search, both, seen = [], [], [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for query in queries:
                page = browser.new_page()
                started = time.perf_counter()
                page.goto(f"{url}/console")
                page.wait_for_selector("body[data-ready=true]")
                ready = time.perf_counter()
                page.fill("#q", query)
                typed = time.perf_counter()
                page.press("#q", "Enter")
                page.wait_for_selector("#hits > li")
                done = time.perf_counter()
                page_load, first_search = page.evaluate(IN_PAGE)
                load.append(page_load)
                search.append(first_search)
                both.append(page_load + first_search)
                seen.append((ready - started + done - typed) * 1e3)
                page.close()
        finally:
            browser.close()
    return {"page load (navigation start to controls ready)": summarize(load),
            "first search (submit to hits in the page)": summarize(search),
            "time to first results": summarize(both),
            "time to first results, seen by Playwright": summarize(seen)}


def request_latency(url: str, path: str, bodies: list[dict[str, Any]]) -> dict[str, float]:
    import httpx

    samples = []
    with httpx.Client(base_url=url, timeout=30) as client:
        client.post(path, json=bodies[0]).raise_for_status()  # the first call builds a side
        for body in bodies[1:]:
            started = time.perf_counter()
            client.post(path, json=body).raise_for_status()
            samples.append((time.perf_counter() - started) * 1e3)
    return summarize(samples)


def run(args: argparse.Namespace) -> dict[str, Any]:
    docs, vectors, info = scifact(args.data, args.vectors_from)
    queries = list(dict.fromkeys(read_queries(args.data / "queries.jsonl").values()))
    with tempfile.TemporaryDirectory(prefix="bench-console-") as tmp:
        root = Path(tmp) / "index"
        build_index(docs, root, vectors=vectors, encoder_info=info, progress=False)
        pages = queries[:args.pages]
        searched = queries[args.pages:args.pages + args.requests]
        plain = [{"query": q, "k": 10} for q in searched]
        results: dict[str, Any] = {"documents": len(docs), "pages": len(pages),
                                   "requests": len(searched) - 1}
        with serving(root, 1, NO_CACHE, {"console": "off"}) as (url, _):
            requests = {"/v1/search, console off": request_latency(url, "/v1/search", plain)}
        with serving(root, 1, NO_CACHE) as (url, _):
            requests["/v1/search, console on"] = request_latency(url, "/v1/search", plain)
            requests["/v1/search with explain (the page's)"] = request_latency(
                url, "/v1/search", [{**b, "explain": True} for b in plain])
            requests["/v1/console/search, fusion rrf"] = request_latency(
                url, "/v1/console/search",
                [{**b, "side": {"ranking": {"fusion": "rrf"}}} for b in plain])
            results["browser"] = first_results(url, pages)
        results["requests_ms"] = requests
    return results


def markdown(results: dict[str, Any]) -> str:
    def rows(figures: dict[str, dict[str, float]]) -> list[list[object]]:
        return [[name, f"{s['p50']:.2f}", f"{s['p95']:.2f}", f"{s['p99']:.2f}"]
                for name, s in figures.items()]

    headers = ["ms", "p50", "p95", "p99"]
    return "\n".join([
        f"# The console on loopback: SciFact, {results['documents']} documents",
        "", f"Time to first results, {results['pages']} fresh pages in headless chromium:", "",
        markdown_table(headers, rows(results["browser"])), "",
        f"A search over HTTP, {results['requests']} uncached queries, one keep-alive client:",
        "", markdown_table(headers, rows(results["requests_ms"]))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--vectors-from", type=Path,
                        default=REPO / "build" / "test-indexes" / "scifact")
    parser.add_argument("--pages", type=int, default=30, help="fresh pages, one query each")
    parser.add_argument("--requests", type=int, default=300, help="searches per route")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    results = run(args)
    publish_report("console", args, results, markdown(results))



if __name__ == "__main__":
    main()
