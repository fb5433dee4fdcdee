"""The HTTP service against the in-process retriever: ``python -m benchmarks.http``.

Side by side in one run, on SciFact (its test queries):

- framework overhead: the same search endpoint (strict body validation, a canned result) on
  FastAPI and on bare Starlette, called as ASGI apps in this process (no network), so the
  difference is the framework's own per-request cost;
- latency p50/p95/p99 and requests/s at concurrency 1, 4, 16 and 64 from a closed-loop load
  generator, for result-cache hits and for full misses (cache off): the ``Retriever`` in this
  process (threads) and ``retrieval serve`` with 1 and 2 workers (``wrk`` when installed, a C
  load generator that leaves the cores to the server; httpx async otherwise);
- memory: RSS, PSS and private memory (USS) of each worker, and what the second worker adds.

The load generator shares the 2 cores with the server; other work on the machine adds noise.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from benchmarks.common import (
    DEFAULT_DATA,
    REPO,
    RESULTS_DIR,
    free_port,
    markdown_table,
    measure_side_by_side,
    percentile_cells,
    publish_report,
)
from benchmarks.http_load import closed_loop_threads, httpx_load, wrk_load
from indexes.build import BuildConfig, build_index
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.demo_metadata import with_demo_metadata
from indexes.encoders import SentenceTransformerEncoder
from retrieval import Retriever, RetrieverConfig

MODES = {"hits": {}, "misses": {"cache": {"backend": "none"}}}
ONE_CORE = {0}
HIT_QUERIES = 64  # a working set every worker's result cache holds after the warm-up


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "bench-http")
    parser.add_argument("--reuse-from", type=Path, default=REPO / "build" / "test-indexes" /
                        "scifact", help="an index of the same corpus whose vectors to reuse")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured time per cell")
    parser.add_argument("--warmup-seconds", type=float, default=1.0)
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--framework-calls", type=int, default=3000)
    parser.add_argument("--generator", choices=["auto", "wrk", "httpx"], default="auto")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


# -- framework overhead -----------------------------------------------------------------------


def framework_apps(canned: bytes) -> dict[str, Any]:
    """The same endpoint on FastAPI and on Starlette: validate the body, return bytes."""
    from fastapi import FastAPI
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from retrieval.service.schemas import SearchBody

    async def fast_search(body: SearchBody) -> Response:
        return Response(canned, media_type="application/json")

    # Real classes, not this module's postponed (string) annotations of local imports.
    fast_search.__annotations__ = {"body": SearchBody, "return": Response}
    fast = FastAPI()
    fast.post("/v1/search")(fast_search)

    async def star_search(request: Request) -> Response:
        SearchBody.model_validate_json(await request.body())
        return Response(canned, media_type="application/json")

    star = Starlette(routes=[Route("/v1/search", star_search, methods=["POST"])])
    return {"fastapi": fast, "starlette": star}


def asgi_caller(app: Any, body: bytes, loop: asyncio.AbstractEventLoop) -> Callable[[Any], int]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/search", "raw_path": b"/v1/search",
             "root_path": "", "query_string": b"", "server": ("127.0.0.1", 80),
             "client": ("127.0.0.1", 1), "headers": [(b"content-type", b"application/json"),
                                                     (b"content-length", str(len(body)).encode())]}

    async def call() -> int:
        status = [0]

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]

        await app(dict(scope), receive, send)
        return status[0]

    return lambda _: loop.run_until_complete(call())


def framework_overhead(canned: bytes, calls: int) -> dict[str, dict[str, float]]:
    loop = asyncio.new_event_loop()
    body = json.dumps({"query": "statins and heart disease", "k": 10}).encode()
    runners = {name: asgi_caller(app, body, loop)
               for name, app in framework_apps(canned).items()}
    samples = measure_side_by_side(runners, list(range(calls)), warmup=list(range(200)))
    loop.close()
    for name, sample in samples.items():
        assert set(sample.outputs) == {200}, f"{name} answered {set(sample.outputs)}"
    return {name: sample.summary() for name, sample in samples.items()}


# -- servers ----------------------------------------------------------------------------------


@contextmanager
def serving(root: Path, workers: int, retriever: dict[str, Any],
            server: dict[str, Any] | None = None) -> Iterator[tuple[str, int]]:
    """``retrieval serve`` with ``workers`` processes (and ``server`` settings); yields (url,
    server pid)."""
    import httpx

    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        config = Path(tmp) / "serve.json"
        settings = {"workers": workers, "drain_seconds": 0.0, **(server or {})}
        config.write_text(json.dumps({"server": settings, "retriever": retriever}))
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
               "PROMETHEUS_MULTIPROC_DIR": str(Path(tmp) / "metrics")}
        process = subprocess.Popen(
            [sys.executable, "-m", "retrieval", "serve", str(root), "--config", str(config),
             "--port", str(port), "--log-level", "warning"], cwd=REPO, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"server exited with {process.returncode}")
                try:
                    if ready_workers(httpx.get(f"{url}/metrics").text) == workers:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            else:
                raise RuntimeError("server not ready in 300 s")
            yield url, process.pid
        finally:
            process.terminate()
            process.wait(timeout=60)


def ready_workers(metrics_text: str) -> int:
    for line in metrics_text.splitlines():
        if line.startswith("retrieval_ready_workers "):
            return int(float(line.split()[1]))
    return 0


def result_lookups(url: str) -> dict[str, float]:
    import httpx

    found = {"hit": 0.0, "miss": 0.0}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith('retrieval_cache_lookups_total{cache="result"'):
            outcome = line.split('outcome="')[1].split('"')[0]
            found[outcome] = float(line.split()[-1])
    return found


def memory_of(pid: int) -> dict[str, Any]:
    """RSS / PSS / USS (MB) of a server process and of each of its children (the workers)."""
    def one(p: int) -> dict[str, float]:
        fields: dict[str, float] = {}
        for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) / 1024
        return {"rss": fields["Rss"], "pss": fields["Pss"],
                "uss": fields["Private_Clean"] + fields["Private_Dirty"]}

    workers = [one(c) for c in worker_pids(pid)]
    return {"parent": one(pid), "workers": workers or [one(pid)]}


def worker_pids(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if _is_worker(int(c))]


@contextmanager
def pinned(pid: int, cpus: set[int]) -> Iterator[None]:
    """Every thread of the server and of its workers on ``cpus`` (threads started later
    inherit it), restored afterwards."""
    threads = [int(t) for p in [pid, *worker_pids(pid)] for t in os.listdir(f"/proc/{p}/task")]
    before = {t: os.sched_getaffinity(t) for t in threads}
    for thread in threads:
        os.sched_setaffinity(thread, cpus)
    try:
        yield
    finally:
        for thread, cpus_before in before.items():
            with suppress(ProcessLookupError):
                os.sched_setaffinity(thread, cpus_before)


def _is_worker(pid: int) -> bool:
    """Workers are the server's children, forked (or spawned), not a resource tracker."""
    try:
        return b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# -- cells --------------------------------------------------------------------------------------


def in_process_cells(root: Path, queries: dict[str, list[str]], levels: Sequence[int],
                     args: argparse.Namespace) -> dict[str, dict[int, dict[str, Any]]]:
    cells: dict[str, dict[int, dict[str, Any]]] = {}
    for mode, retriever_config in MODES.items():
        retriever = Retriever.load(root, RetrieverConfig(**retriever_config))
        try:
            items = queries[mode]
            for query in items:
                retriever.search(query, k=10)
            search = functools.partial(retriever.search, k=10)
            cells[mode] = {c: closed_loop_threads(search, items, c, args.seconds,
                                                  args.warmup_seconds) for c in levels}
        finally:
            retriever.close()
    return cells


def http_cells(root: Path, queries: dict[str, list[str]], levels: Sequence[int],
               workers: int, generator: str, args: argparse.Namespace
               ) -> tuple[dict[str, dict[int, dict[str, Any]]], dict[str, Any]]:
    cells: dict[str, dict[int, dict[str, Any]]] = {}
    memory: dict[str, Any] = {}
    for mode, retriever_config in MODES.items():
        with serving(root, workers, retriever_config) as (url, pid):
            load = wrk_load if generator == "wrk" else httpx_load
            load(url, queries[mode], 16, args.warmup_seconds * 3)  # fills every worker's cache
            cells[mode] = {}
            for c in levels:
                before = result_lookups(url)
                cell = load(url, queries[mode], c, args.seconds, warmup=args.warmup_seconds)
                after = result_lookups(url)
                cell["result_cache"] = {k: after[k] - before[k] for k in after}
                cells[mode][c] = cell
            if mode == "hits" and workers == 1 and generator == "wrk" and 1 in levels:
                cells.update(one_core_cells(url, pid, queries[mode], args))
            memory[mode] = memory_of(pid)
    return cells, memory


def one_core_cells(url: str, pid: int, hits: list[str], args: argparse.Namespace
                   ) -> dict[str, dict[int, dict[str, Any]]]:
    """Concurrency 1 with the client and the worker on one core, and ``GET /healthz`` (no
    search: the floor of a round trip) both ways. At concurrency 1 the two never run at
    once, so one core takes nothing from either; what it removes is waking the other core
    for every message, which on a virtual machine's idle vCPU can take longer than a hit."""
    timed = functools.partial(wrk_load, seconds=args.seconds, warmup=args.warmup_seconds)
    cells = {"healthz": {1: timed(url, [], 1, path="/healthz")}}
    with pinned(pid, ONE_CORE):
        cells["hits one core"] = {1: timed(url, hits, 1, cpus=ONE_CORE)}
        cells["healthz one core"] = {1: timed(url, [], 1, path="/healthz", cpus=ONE_CORE)}
    return cells


def in_process_one_core(root: Path, hits: list[str], args: argparse.Namespace
                        ) -> dict[int, dict[str, Any]]:
    """The in-process hit at concurrency 1 on the same core, for the one-core comparison."""
    retriever = Retriever.load(root, RetrieverConfig())
    before = os.sched_getaffinity(0)
    try:
        for query in hits:
            retriever.search(query, k=10)
        os.sched_setaffinity(0, ONE_CORE)  # the client thread started below inherits it
        search = functools.partial(retriever.search, k=10)
        return {1: closed_loop_threads(search, hits, 1, args.seconds, args.warmup_seconds)}
    finally:
        os.sched_setaffinity(0, before)
        retriever.close()


# -- report -------------------------------------------------------------------------------------


def report(results: dict[str, Any], levels: Sequence[int], workers: Sequence[int]) -> str:
    frameworks = results["frameworks"]
    lines = ["## Framework overhead (same endpoint, ASGI call in process, ms)", "",
             markdown_table(["framework", "p50 / p95 / p99"],
                            [[name, percentile_cells(s)] for name, s in frameworks.items()]),
             ""]
    columns = ["in-process"] + [f"HTTP {w} worker{'s' if w > 1 else ''}" for w in workers]
    for mode in MODES:
        rows = []
        for c in levels:
            row: list[object] = [c]
            for column in columns:
                cell = results["cells"][column][mode][c]
                row += [percentile_cells(cell["latency"]), throughput_cell(cell)]
            rows.append(row)
        headers = ["concurrency"]
        for column in columns:
            headers += [f"{column} p50 / p95 / p99 ms", f"{column} req/s"]
        lines += [f"## Result-cache {mode}", "", markdown_table(headers, rows), ""]
    lines += one_core_report(results["cells"])
    lines += ["## Memory per worker (MB, hits server after its load)", "",
              markdown_table(["workers", "worker RSS", "worker PSS", "worker USS (private)"],
                             [[w, " + ".join(f"{m['rss']:.0f}" for m in mem["workers"]),
                               " + ".join(f"{m['pss']:.0f}" for m in mem["workers"]),
                               " + ".join(f"{m['uss']:.0f}" for m in mem["workers"])]
                              for w, mem in results["memory"].items()]), ""]
    lines += [f"- {line}" for line in results["verdicts"]]
    return "\n".join(lines)


def throughput_cell(cell: dict[str, Any]) -> str:
    """Answers a second (2xx only); a cell with failed or shed requests says so, since its
    latencies (wrk's histogram) include those quick refusals."""
    errors = cell.get("errors", 0)
    rate = f"{cell['rps']:,.0f}"
    return rate if not errors else (f"{rate} ({errors:,} of {cell['requests']:,} failed or "
                                    "shed; latencies include them)")


def one_core_report(cells: dict[str, Any]) -> list[str]:
    http = cells.get("HTTP 1 worker", {})
    if "hits one core" not in http:
        return []
    rows = [[name, percentile_cells(side[spread][1]["latency"]),
             percentile_cells(side[one][1]["latency"])]
            for name, side, spread, one in (
                ("in-process hit", cells["in-process"], "hits", "hits one core"),
                ("HTTP hit, 1 worker", http, "hits", "hits one core"),
                ("GET /healthz, 1 worker", http, "healthz", "healthz one core"))]
    return ["## Concurrency 1: client and server where the OS puts them, and on one core", "",
            markdown_table(["request", "OS placement p50 / p95 / p99 ms",
                            "one core p50 / p95 / p99 ms"], rows), ""]


def p95_added(cells: dict[str, Any], http_cell: str, in_process_cell: str) -> float:
    return float(cells["HTTP 1 worker"][http_cell][1]["latency"]["p95"]
                 - cells["in-process"][in_process_cell][1]["latency"]["p95"])


def verdicts(results: dict[str, Any], workers: Sequence[int]) -> list[str]:
    found = []
    cells = results["cells"]
    if 1 in workers:
        added = p95_added(cells, "hits", "hits")
        found.append(f"HTTP adds {added:.3f} ms p95 to a cache hit at concurrency 1, client "
                     f"and server where the OS puts them (target <= 0.5): "
                     f"{'PASS' if added <= 0.5 else 'FAIL'}")
    if "hits one core" in cells.get("HTTP 1 worker", {}):
        added = p95_added(cells, "hits one core", "hits one core")
        floor = {name: cells["HTTP 1 worker"][name][1]["latency"]["p95"]
                 for name in ("healthz", "healthz one core")}
        found.append(f"HTTP adds {added:.3f} ms p95 to a cache hit at concurrency 1, client "
                     f"and worker on one core (target <= 0.5): "
                     f"{'PASS' if added <= 0.5 else 'FAIL'}; GET /healthz alone: "
                     f"{floor['healthz']:.3f} ms p95 where the OS puts them, "
                     f"{floor['healthz one core']:.3f} on one core")
    if 2 in workers:
        best = max((cell["rps"] for cell in cells["HTTP 2 workers"]["hits"].values()
                    if not cell.get("errors")), default=0.0)  # shed 503s are no answers
        found.append(f"best hits/s with 2 workers: {best:,.0f} (target >= 1,000): "
                     f"{'PASS' if best >= 1000 else 'FAIL'}")
        memory = results["memory"].get(2)
        if memory is not None:
            second = sorted(memory["workers"], key=lambda m: m["uss"])[-1]
            found.append(f"the second worker's private memory (USS): {second['uss']:.0f} MB, "
                         f"RSS {second['rss']:.0f} MB incl. shared pages (target <= 100 MB): "
                         f"{'PASS' if second['uss'] <= 100 else 'FAIL'} on USS")
    return found


def index_root(args: argparse.Namespace) -> Path:
    """The dataset's index under ``--work``, built once (vectors reused when possible)."""
    root = args.work / args.data.name
    if not (root / "CURRENT").is_file():
        reuse = str(args.reuse_from) if (args.reuse_from / "CURRENT").is_file() else None
        build_index(with_demo_metadata(read_corpus(args.data)), root,
                    encoder=SentenceTransformerEncoder(), config=BuildConfig(reuse_from=reuse))
    return root


def scifact_queries(data: Path) -> dict[str, list[str]]:
    qrels = read_qrels(data / "qrels" / "test.tsv")
    texts = [t for q, t in read_queries(data / "queries.jsonl").items() if q in qrels]
    return {"hits": texts[:HIT_QUERIES], "misses": texts}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    levels = [int(c) for c in args.concurrency.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    generator = args.generator
    if generator == "auto":
        generator = "wrk" if shutil.which("wrk") else "httpx"
    root = index_root(args)
    queries = scifact_queries(args.data)
    probe = Retriever.load(root, RetrieverConfig())
    canned = probe.search(queries["hits"][0], k=10).model_dump_json().encode()
    probe.close()
    results: dict[str, Any] = {"generator": generator,
                               "frameworks": framework_overhead(canned, args.framework_calls),
                               "cells": {}, "memory": {}}
    results["cells"]["in-process"] = in_process_cells(root, queries, levels, args)
    if generator == "wrk" and 1 in levels and 1 in workers:
        results["cells"]["in-process"]["hits one core"] = in_process_one_core(
            root, queries["hits"], args)
    for w in workers:
        cells, memory = http_cells(root, queries, levels, w, generator, args)
        results["cells"][f"HTTP {w} worker{'s' if w > 1 else ''}"] = cells
        results["memory"][w] = memory["hits"]
    results["verdicts"] = verdicts(results, workers)
    note = (f"\nLoad generator: {generator}, closed loop; it shares the machine's cores with "
            "the server, and other work ran on the machine at the same time.")
    publish_report("http", args, results, report(results, levels, workers) + note)
    return 0


if __name__ == "__main__":
    sys.exit(main())

