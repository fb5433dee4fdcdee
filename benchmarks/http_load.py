"""Closed-loop load generators for ``benchmarks.http``: threads in process, wrk, httpx async.

Each of ``concurrency`` clients sends its next request when the previous one returns. Every
generator runs ``warmup`` seconds (discarded), then ``seconds`` measured, and returns
``{"latency": p50/p95/p99 ms summary, "rps", "requests", "errors"}``: "requests" and "errors"
count the measured window's requests only, and "rps" its answers (failed or shed requests are
no answers).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from retrieval.latency import summarize

WRK_POST = """
local bodies = {%s}
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  i = i + 1
  return wrk.format(nil, nil, nil, bodies[(i %% #bodies) + 1])
end
"""
WRK_REPORT = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests": %d, "duration_us": %d, "errors": %d, '
    .. '"non2xx": %d, "p50": %f, "p95": %f, "p99": %f, "max": %f}\\n', summary.requests,
    summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max))
end
"""


def closed_loop_threads(call: Callable[[str], Any], items: Sequence[str], concurrency: int,
                        seconds: float, warmup: float) -> dict[str, Any]:
    """``concurrency`` threads calling ``call`` in process; a call that raises in the measured
    window is counted as an error (its time is not a latency), and calls that all fail are
    refused as a figure."""
    clock = time.perf_counter
    start = clock()
    measure_from, stop_at = start + warmup, start + warmup + seconds
    latencies: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def client(offset: int) -> None:
        mine, failed, i = [], [], offset
        while True:
            began = clock()
            if began >= stop_at:
                break
            try:
                call(items[i % len(items)])
            except Exception as exc:  # noqa: BLE001 - counted, and reported below
                if began >= measure_from:  # a warm-up failure is discarded as its time is
                    failed.append(exc)
            else:
                if began >= measure_from:
                    mine.append((clock() - began) * 1e3)
            i += concurrency
        with lock:
            latencies.extend(mine)
            failures.extend(failed)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if not latencies:
        raise RuntimeError(f"every call failed ({len(failures)}), e.g. {failures[0]!r}"
                           if failures else "no call finished in the measured time")
    return {"latency": summarize(latencies), "rps": len(latencies) / seconds,
            "requests": len(latencies) + len(failures), "errors": len(failures)}


def wrk_load(url: str, items: Sequence[str], concurrency: int, seconds: float,
             warmup: float = 0.0, *, path: str = "/v1/search", cpus: set[int] | None = None
             ) -> dict[str, Any]:
    """``wrk`` (C, event loop): POST /v1/search cycling through ``items`` (no items: GET
    ``path``), on ``cpus`` only when given."""
    bodies = ",".join("[==[" + json.dumps({"query": q, "k": 10}) + "]==]" for q in items)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write((WRK_POST % bodies if items else "") + WRK_REPORT)
    try:
        if warmup > 0:
            _wrk(url + path, script.name, concurrency, warmup, cpus)
        found = _wrk(url + path, script.name, concurrency, seconds, cpus)
    finally:
        Path(script.name).unlink()
    elapsed = found["duration_us"] / 1e6
    errors = found["errors"] + found["non2xx"]  # shed searches (503) are fast: not answers
    return {"latency": {"p50": found["p50"] / 1e3, "p95": found["p95"] / 1e3,
                        "p99": found["p99"] / 1e3, "max": found["max"] / 1e3},
            "rps": (found["requests"] - errors) / elapsed, "requests": found["requests"],
            "errors": errors}


def _wrk(url: str, script: str, concurrency: int, seconds: float, cpus: set[int] | None
         ) -> dict[str, Any]:
    threads = min(concurrency, 2)
    command = ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
               "--timeout", "30s", "-s", script, url]
    if cpus is not None:
        command = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("WRKJSON "))
    return dict(json.loads(line[len("WRKJSON "):]))


def httpx_load(url: str, items: Sequence[str], concurrency: int, seconds: float,
               warmup: float = 0.0) -> dict[str, Any]:
    """httpx async clients in this process (when wrk is not installed)."""
    import httpx

    async def run() -> tuple[list[float], int]:
        clock = time.perf_counter
        start = clock()
        measure_from, stop_at = start + warmup, start + warmup + seconds
        latencies: list[float] = []
        errors = 0

        async def client(http: httpx.AsyncClient, offset: int) -> None:
            nonlocal errors
            i = offset
            while (began := clock()) < stop_at:
                response = await http.post("/v1/search",
                                           json={"query": items[i % len(items)], "k": 10})
                if began >= measure_from:  # as wrk's: failed answers' times are latencies too
                    latencies.append((clock() - began) * 1e3)
                    errors += response.status_code != 200
                i += concurrency

        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as http:
            await asyncio.gather(*(client(http, n) for n in range(concurrency)))
        return latencies, errors

    latencies, errors = asyncio.run(run())
    return {"latency": summarize(latencies), "rps": (len(latencies) - errors) / seconds,
            "requests": len(latencies), "errors": errors}
