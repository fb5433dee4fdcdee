"""Overload: ``retrieval serve`` (2 workers) at 64, 256 and 1,024 connections, admission off
and at its defaults, side by side in one run: ``python -m benchmarks.overload``.

``wrk`` keeps every connection busy in a closed loop of full misses (distinct query texts:
the result cache never answers) and counts the answers by status. Beside it, one probe client
sends a search at a time (its own distinct texts) and one a ``/healthz`` every 50 ms: their
latencies are what an admitted request and a health check see under that load (wrk's own
percentiles mix admitted answers with immediate 503s). "Admission off" sets
``server.max_in_flight`` beyond any queue, the service as it was before admission control;
the defaults admit 16 searches per usable core and worker. The load generator shares the
machine's cores with the server.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS_DIR, markdown_table, publish_report
from benchmarks.http import index_root, scifact_queries, serving
from benchmarks.http import parse_args as http_args

WRK_STATUSES = """
local bodies = {%s}
local threads = {}
local i = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
%s
function setup(thread)
  table.insert(threads, thread)
  thread:set("offset", #threads * 100003)
end
function init(args) i = offset or 0; ok = 0; shed = 0; other = 0 end
function request()
  i = i + 1
  return wrk.format(nil, nil, nil, string.format(bodies[(i %% #bodies) + 1], i))
end
function response(status, headers, body)
  if status == 200 then ok = ok + 1
  elseif status == 503 and (headers["retry-after"] or headers["Retry-After"])
      and body:find("OverloadedError", 1, true) then shed = shed + 1
  else other = other + 1 end
end
function done(summary, latency, requests)
  local ok, shed, other = 0, 0, 0
  for _, t in ipairs(threads) do
    ok = ok + t:get("ok"); shed = shed + t:get("shed"); other = other + t:get("other")
  end
  local e = summary.errors
  io.write(string.format('WRKJSON {"ok": %%d, "shed": %%d, "other": %%d, "errors": %%d, '
    .. '"duration_us": %%d, "p50": %%f, "p99": %%f}\\n', ok, shed, other,
    e.connect + e.read + e.write + e.timeout, summary.duration,
    latency:percentile(50), latency:percentile(99)))
end
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = http_args([])  # the same index and data as benchmarks.http
    parser.add_argument("--data", type=Path, default=defaults.data)
    parser.add_argument("--work", type=Path, default=defaults.work)
    parser.add_argument("--reuse-from", type=Path, default=defaults.reuse_from)
    parser.add_argument("--connections", default="64,256,1024")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    return parser.parse_args(argv)


def wrk_statuses(url: str, texts: Sequence[str], connections: int, seconds: float,
                 key: str | None = None) -> dict[str, Any]:
    """wrk's closed loop of distinct searches (``key``: an API key to send); answers counted
    as ok (200), shed (503 with Retry-After and OverloadedError) and other."""
    bodies = ",".join("[==[" + json.dumps({"query": t.replace("%", "%%") + " v%d", "k": 10})
                      + "]==]" for t in texts)
    auth = f'wrk.headers["Authorization"] = "Bearer {key}"' if key else ""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_STATUSES % (bodies, auth))
    try:
        out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{round(seconds)}s",
                              "--timeout", "30s", "-s", script.name, url + "/v1/search"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        Path(script.name).unlink()
    line = next(line for line in out.splitlines() if line.startswith("WRKJSON "))
    return dict(json.loads(line[len("WRKJSON "):]))


def probes(url: str, texts: Sequence[str], stop: threading.Event, key: str | None = None
           ) -> dict[str, list[float]]:
    """One search at a time and a /healthz every 50 ms until ``stop``: their latencies (ms)."""
    import httpx

    headers = {"authorization": f"Bearer {key}"} if key else {}

    found: dict[str, list[float]] = {"admitted": [], "probe shed": [], "healthz": []}

    def search() -> None:
        with httpx.Client(base_url=url, timeout=60, headers=headers) as client:
            i = 0
            while not stop.is_set():
                began = time.perf_counter()
                status = client.post("/v1/search", json={
                    "query": f"{texts[i % len(texts)]} probe {i}", "k": 10}).status_code
                key = "admitted" if status == 200 else "probe shed"
                found[key].append((time.perf_counter() - began) * 1e3)
                i += 1

    def health() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                began = time.perf_counter()
                client.get("/healthz").raise_for_status()
                found["healthz"].append((time.perf_counter() - began) * 1e3)
                stop.wait(0.05)

    threads = [threading.Thread(target=search), threading.Thread(target=health)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join()
    return found


def one_cell(url: str, texts: Sequence[str], connections: int, seconds: float
             ) -> dict[str, Any]:
    stop = threading.Event()
    box: dict[str, Any] = {}
    prober = threading.Thread(target=lambda: box.update(probes(url, texts, stop)))
    prober.start()
    try:
        load = wrk_statuses(url, texts, connections, seconds)
    finally:
        stop.set()
        prober.join()
    answers = load["ok"] + load["shed"] + load["other"]

    def cells(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p99": None, "n": 0}
        return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
                "n": len(values)}

    return {"rps": answers / (load["duration_us"] / 1e6), "ok": load["ok"],
            "shed": load["shed"], "other": load["other"], "errors": load["errors"],
            "shed_rate": load["shed"] / max(answers, 1),
            "wrk_p50": load["p50"] / 1e3, "wrk_p99": load["p99"] / 1e3,
            **{name: cells(values) for name, values in box.items()}}


def report(results: dict[str, dict[str, Any]]) -> str:
    def ms(cell: dict[str, Any]) -> str:
        return "-" if cell["p50"] is None else f"{cell['p50']:.1f} / {cell['p99']:.1f}"

    rows = []
    for mode, by_level in results.items():
        for level, cell in by_level.items():
            rows.append([mode, level, f"{cell['rps']:.0f}", f"{cell['shed_rate']:.1%}",
                         f"{cell['other']} / {cell['errors']}", ms(cell["admitted"]),
                         str(cell["admitted"]["n"]), ms(cell["healthz"]),
                         f"{cell['wrk_p50']:.1f} / {cell['wrk_p99']:.1f}"])
    return "\n".join([
        "## Overload: 2 workers, full misses, wrk closed loop", "",
        markdown_table(["admission", "connections", "answers/s", "shed (503)",
                        "other status / socket errors", "admitted probe p50 / p99 ms",
                        "probe searches", "/healthz p50 / p99 ms", "wrk all answers p50 / p99 ms"],
                       rows)])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    root = index_root(args)
    texts = scifact_queries(args.data)["misses"]
    levels = [int(c) for c in args.connections.split(",")]
    modes = {"off (max_in_flight 1,000,000)": {"max_in_flight": 1_000_000}, "default": {}}
    results: dict[str, dict[str, Any]] = {}
    for mode, server in modes.items():
        with serving(root, 2, {"cache": {"backend": "memory"}}, server) as (url, _):
            results[mode] = {str(level): one_cell(url, texts, level, args.seconds)
                             for level in levels}
    markdown = report(results)
    publish_report("overload", args, results, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
