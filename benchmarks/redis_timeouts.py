"""Redis round trips against host load, and what each socket timeout would make of them:
``python -m benchmarks.redis_timeouts``.

A private redis-server on loopback, a client built the way the library builds its own
(``retrieval.resilience.make_client``: no retries, RESP2) but with a 2 s timeout so every call
completes and its true latency is recorded. For each load level (0, 2, 4, 6 processes spinning
pure Python, as many as the other work of a busy 2-core host), the cache's real calls
alternate, paced like requests (``--pause-ms`` between them, so the client wakes up as a
server thread does): one ``MGET`` of ``--read-keys`` keys (a result and an embedding among
them) and one writer pipeline (``SET key value PX ttl`` for a result and an embedding). Every
tenth round also opens a fresh connection (what ``connect_timeout_ms`` bounds).

For each candidate socket timeout, the recorded sequence is replayed through the library's own
``CircuitBreaker`` (the default threshold and cool-down of ``CacheConfig``) on a clock made of
the recorded call times: a call slower than the timeout counts as a failure; calls arriving
while the breaker is open are skipped (what a cache serves as misses and drops as writes).
Replaying ignores that a real timeout also closes the connection (the next call reconnects),
so at tight timeouts it slightly understates the damage.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import redis

from benchmarks.common import RESULTS_DIR, fmt_ms, markdown_table, private_redis, publish_report
from retrieval.cache import CacheConfig, CircuitBreaker
from retrieval.resilience import make_client

LOADS = (0, 2, 4, 6)
TIMEOUTS_MS = (5.0, 10.0, 25.0, 50.0, 100.0)
CONNECT_TIMEOUTS_MS = (10.0, 25.0, 50.0, 100.0, 200.0)
PERCENTILES = (50.0, 95.0, 99.0, 99.9)
MEASURED_TIMEOUT_S = 2.0  # long enough that no call times out while being measured


class Call(NamedTuple):
    op: str  # "read" or "write"
    start: float  # perf_counter seconds
    ms: float


def spin(stop: Any) -> None:
    """A busy process: pure-Python arithmetic, checking the stop flag now and then."""
    count = 0
    while not stop.is_set():
        for _ in range(100_000):
            count += 1


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` spinning processes for the block (and a second for them to start)."""
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=spin, args=(stop,), daemon=True)
                for _ in range(processes)]
    for proc in spinners:
        proc.start()
    time.sleep(1.0 if processes else 0.0)
    try:
        yield
    finally:
        stop.set()
        for proc in spinners:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()


class CacheCalls:
    """The cache's two request-path calls against one client, with realistic payloads."""

    def __init__(self, url: str, read_keys: int, result_bytes: int) -> None:
        client = make_client(url, False, MEASURED_TIMEOUT_S, MEASURED_TIMEOUT_S)
        assert isinstance(client, redis.Redis)  # standalone: cluster=False
        self.client = client
        self.values = {"bench:result": os.urandom(result_bytes),
                       "bench:embedding": os.urandom(12 + 384 * 4)}  # a MiniLM vector
        self.keys = [*self.values, *(f"bench:absent:{i}" for i in range(read_keys - 2))]
        self.write()  # the read finds both values

    def read(self) -> None:
        self.client.mget(self.keys)

    def write(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key, value in self.values.items():
            pipe.set(key, value, px=300_000)
        pipe.execute(raise_on_error=False)

    def connect(self) -> float:
        """Milliseconds to open (and handshake) one new connection."""
        pool = self.client.connection_pool  # the pool's options, outside its connection cap
        connection = pool.connection_class(**pool.connection_kwargs)
        began = time.perf_counter()
        connection.connect()
        took = (time.perf_counter() - began) * 1e3
        connection.disconnect()
        return took


def record(calls: CacheCalls, rounds: int, warmup: int, pause_s: float
           ) -> tuple[list[Call], list[float]]:
    """Alternate read and write ``rounds`` times (after ``warmup`` untimed rounds)."""
    timed: list[Call] = []
    connects: list[float] = []
    for index in range(warmup + rounds):
        for op, run in (("read", calls.read), ("write", calls.write)):
            began = time.perf_counter()
            run()
            if index >= warmup:
                timed.append(Call(op, began, (time.perf_counter() - began) * 1e3))
            time.sleep(pause_s)
        if index >= warmup and index % 10 == 0:
            connects.append(calls.connect())
    return timed, connects


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    values = np.asarray(samples, dtype=np.float64)
    cells = {f"p{p:g}": float(np.percentile(values, p)) for p in PERCENTILES}
    return {**cells, "max": float(values.max()), "n": int(values.size)}


def replay_breaker(timed: Sequence[Call], timeout_ms: float) -> dict[str, int]:
    """Opens and skipped calls had ``timeout_ms`` been the socket timeout (see module doc)."""
    defaults = CacheConfig()
    now = [0.0]
    breaker = CircuitBreaker(defaults.breaker_failures, defaults.breaker_cooldown_seconds,
                             clock=lambda: now[0])
    for call in timed:
        now[0] = call.start
        if not breaker.allow():
            continue
        now[0] = call.start + min(call.ms, timeout_ms) / 1e3
        if call.ms > timeout_ms:
            breaker.record_failure()
        else:
            breaker.record_success()
    return {"opens": breaker.opens, "skipped": breaker.short_circuits}


def analyse(timed: list[Call], connects: list[float]) -> dict[str, Any]:
    everything = [call.ms for call in timed]
    return {
        "read": percentiles([c.ms for c in timed if c.op == "read"]),
        "write": percentiles([c.ms for c in timed if c.op == "write"]),
        "connect": percentiles(connects),
        "timed_out": {f"{t:g}": float(np.mean(np.asarray(everything) > t)) for t in TIMEOUTS_MS},
        "breaker": {f"{t:g}": replay_breaker(timed, t) for t in TIMEOUTS_MS},
        "connect_timed_out": {f"{t:g}": float(np.mean(np.asarray(connects) > t))
                              for t in CONNECT_TIMEOUTS_MS},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with private_redis() as url:
        calls = CacheCalls(url, args.read_keys, args.result_bytes)
        for load in args.loads:
            with busy(load):
                timed, connects = record(calls, args.rounds, args.warmup, args.pause_ms / 1e3)
                load_average = os.getloadavg()[0]
            results[str(load)] = {**analyse(timed, connects), "load_average_1m": load_average}
            print(f"load {load}: done (1-min load average {load_average:.1f})", flush=True)
        calls.client.close()
    return results


def latency_rows(results: dict[str, Any]) -> list[list[object]]:
    rows: list[list[object]] = []
    for load, result in results.items():
        for op in ("read", "write", "connect"):
            s = result[op]
            rows.append([load, op, s["n"], *(fmt_ms(s[f"p{p:g}"]) for p in PERCENTILES),
                         fmt_ms(s["max"])])
    return rows


def timeout_rows(results: dict[str, Any]) -> list[list[object]]:
    rows: list[list[object]] = []
    for load, result in results.items():
        cells = []
        for t in TIMEOUTS_MS:
            share, breaker = result["timed_out"][f"{t:g}"], result["breaker"][f"{t:g}"]
            cells.append(f"{share:.2%} / {breaker['opens']} / {breaker['skipped']}")
        rows.append([load, *cells])
    return rows


def connect_rows(results: dict[str, Any]) -> list[list[object]]:
    return [[load, *(f"{result['connect_timed_out'][f'{t:g}']:.1%}" for t in CONNECT_TIMEOUTS_MS)]
            for load, result in results.items()]


def render(results: dict[str, Any], args: argparse.Namespace) -> str:
    defaults = CacheConfig()
    return "\n".join([
        f"# Redis round trips vs host load ({os.cpu_count()} cores, {args.rounds} reads and "
        f"{args.rounds} writes per level, MGET of {args.read_keys} keys, SET pipeline of a "
        f"{args.result_bytes:,}-byte result + an embedding, {args.pause_ms:g} ms between calls)",
        "",
        markdown_table(["busy processes", "call", "n", "p50 ms", "p95 ms", "p99 ms",
                        "p99.9 ms", "max ms"], latency_rows(results)),
        "",
        f"Per socket timeout: share of calls slower than it / breaker opens / calls skipped "
        f"while open (breaker: {defaults.breaker_failures} failures in a row, "
        f"{defaults.breaker_cooldown_seconds:g} s cool-down):",
        "",
        markdown_table(["busy processes", *(f"{t:g} ms" for t in TIMEOUTS_MS)],
                       timeout_rows(results)),
        "",
        "New connections slower than each connect timeout:",
        "",
        markdown_table(["busy processes", *(f"{t:g} ms" for t in CONNECT_TIMEOUTS_MS)],
                       connect_rows(results)),
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.redis_timeouts",
                                     description=__doc__)
    parser.add_argument("--loads", type=int, nargs="+", default=list(LOADS))
    parser.add_argument("--rounds", type=int, default=3000, help="reads (and writes) per level")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--pause-ms", type=float, default=1.0)
    parser.add_argument("--read-keys", type=int, default=20)
    parser.add_argument("--result-bytes", type=int, default=6000)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.read_keys < 2:
        raise SystemExit("--read-keys must be >= 2 (a result and an embedding)")
    results = run(args)
    publish_report("redis_timeouts", args, results, render(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
