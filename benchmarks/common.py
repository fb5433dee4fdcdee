"""Shared benchmark plumbing: environment capture, timing loops, tables, JSON and plots.

Every benchmark writes ``benchmarks/results/<name>-<timestamp>.{json,md}`` with the config, the
environment and the git sha, so a number can always be traced back to what produced it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import redis

from indexes.cpu import cpu_model, usable_cores, vector_extensions
from retrieval.latency import summarize

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "scifact"  # the BEIR folder most runs use
RESULTS_DIR = REPO / "benchmarks" / "results"
PACKAGES = ("numpy", "faiss-cpu", "numba", "bm25s", "rank-bm25", "PyStemmer",
            "sentence-transformers", "torch", "pydantic")


# -- provenance ------------------------------------------------------------------------------


def git_sha() -> str:
    """HEAD's sha (``-dirty`` when the tree has changes), or "uncommitted" without a commit."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    try:
        sha = git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        return "uncommitted"
    return sha + ("-dirty" if git("status", "--porcelain") else "")


def source_digest(packages: Sequence[str] = ("indexes", "retrieval", "benchmarks")) -> str:
    """sha256 prefix of the library's and the benchmarks' Python sources: without a commit (or
    with a dirty tree) it still tells two runs on different code apart."""
    digest = hashlib.sha256()
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What the numbers depend on: interpreter, libraries, CPU, and how busy the machine was."""
    return {
        "python": sys.version.split()[0],
        "packages": {name: package_version(name) for name in PACKAGES},
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        # Figures move with the CPU's kind (the 8-bit IVF fill runs only with AVX-512 VNNI).
        "cpu_model": cpu_model(),
        "vector_extensions": vector_extensions(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable_cores(),  # what the retriever sizes its threads for
        # Shared machines: the load average says how much the absolute figures can be trusted.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "blas_env": {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_"))},
        "git_sha": git_sha(),
        "source_digest": source_digest(),
    }


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


# -- timing ----------------------------------------------------------------------------------


@dataclass
class Samples:
    """Wall-clock milliseconds of each measured call, what each call returned, and the
    process's CPU milliseconds over all the measured calls together (every thread: a call
    that fans out over the cores counts them all).

    CPU is kept as a total, not per call: Linux brings the CPU time of the process's other
    threads up to date only at their scheduler ticks and switches (``thread_group_cputime``
    reads the calling thread's exact runtime, the others' as of their last update), so one
    call's reading can be off by a tick (1-4 ms) for each other thread running at either end.
    Over a window of many calls those errors stay at its two ends, and the mean holds."""

    wall_ms: list[float] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    cpu_total_ms: float = 0.0

    def summary(self) -> dict[str, float]:
        return summarize(self.wall_ms)

    def cpu_ms_mean(self) -> float:
        """The process's CPU milliseconds per measured call (all threads), a mean."""
        return self.cpu_total_ms / len(self.wall_ms) if self.wall_ms else 0.0


def measure_side_by_side(
    runners: Mapping[str, Callable[[Any], Any]],
    items: Sequence[Any],
    warmup: Sequence[Any] = (),
    chunk: int = 100,
    rewarm: int = 0,
) -> dict[str, Samples]:
    """Time every runner on every item, after running each on ``warmup`` (discarded).

    Runners take turns in chunks of ``chunk`` items: a burst of load from a neighbour on a shared
    machine then lands on every configuration instead of on one, so the ratios hold. Before each
    timed chunk a runner re-runs ``rewarm`` warmup items untimed, so its data (a model's weights,
    an index's postings) is back in cache after the other runners' turns: a process serving one
    configuration never pays that switch. The turn order rotates from chunk to chunk, so no
    runner is always the first after another's turn.
    """
    for run in runners.values():
        for item in warmup:
            run(item)
    samples = {name: Samples() for name in runners}
    names = list(runners)
    clock = time.perf_counter
    for turn, start in enumerate(range(0, len(items), chunk)):
        block = items[start:start + chunk]
        first = turn % len(names)
        for name in names[first:] + names[:first]:
            run = runners[name]
            for i in range(min(rewarm, len(warmup))):
                run(warmup[(turn * rewarm + i) % len(warmup)])
            wall, outputs = samples[name].wall_ms, samples[name].outputs
            # One CPU reading a chunk, not a call: see ``Samples``.
            began_cpu = time.process_time()
            for item in block:
                began = clock()
                output = run(item)
                wall.append((clock() - began) * 1e3)
                outputs.append(output)
            samples[name].cpu_total_ms += (time.process_time() - began_cpu) * 1e3
    return samples


def single_thread() -> Any:
    """Pin BLAS (e.g. a re-rank matmul) to one thread, as a one-query-per-core server would."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=1)


def measure(run: Callable[[Any], Any], items: Sequence[Any], warmup: Sequence[Any] = ()
            ) -> Samples:
    """``measure_side_by_side`` for a single runner."""
    return measure_side_by_side({"run": run}, items, warmup)["run"]


# -- reporting -------------------------------------------------------------------------------


def fmt_ms(value: float) -> str:
    """Milliseconds with three significant-ish digits from microseconds to seconds."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"


def percentile_cells(summary: Mapping[str, float], keys: Sequence[str] = ("p50", "p95", "p99")
                     ) -> str:
    """``p50 / p95 / p99`` in one table cell."""
    return " / ".join(fmt_ms(summary[k]) for k in keys)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def write_results(name: str, payload: Mapping[str, Any], markdown: str,
                  directory: Path = RESULTS_DIR) -> tuple[Path, Path]:
    """``<name>-<timestamp>.json`` and ``.md`` side by side; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = directory / f"{name}-{timestamp()}"
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    json_path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    md_path.write_text(markdown + "\n")
    return json_path, md_path


def publish_report(name: str, args: Any, results: Any, markdown: str, key: str = "results"
                   ) -> Path:
    """Print a benchmark's markdown and write it with its JSON (config from the CLI ``args``,
    the environment and the results); returns the JSON path."""
    print(markdown)
    payload = {"config": {k: str(v) for k, v in vars(args).items()},
               "environment": environment(), key: results}
    json_path, _ = write_results(name, payload, markdown, args.out)
    print(f"\nwrote {json_path}")
    return json_path


def plot_cdfs(panels: Mapping[str, Mapping[str, Sequence[float]]], path: Path,
              xlabel: str = "end-to-end latency (ms, log scale)") -> Path | None:
    """One panel per dataset, one latency CDF per configuration; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on benchmark machines
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels.items(), strict=True):
        for label, values in series.items():
            ordered = np.sort(np.asarray(values, dtype=np.float64))
            ax.plot(ordered, np.arange(1, ordered.size + 1) / ordered.size, label=label)
        ax.set_xscale("log")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("fraction of queries")
    axes[0][0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- services ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A throwaway redis-server (no persistence) on a fixed loopback port, with fault controls."""

    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            raise SystemExit("redis-server not found: install it (apt-get install redis-server)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = tempfile.mkdtemp(prefix="bench-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise SystemExit(f"redis-server on {self.port} did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process ignores SIGTERM
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def pause(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextmanager
def private_redis() -> Iterator[str]:
    """A throwaway redis-server on a free loopback port for the block; yields its URL."""
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.cleanup()


# -- suite helpers -----------------------------------------------------------------------------


def memory_mb() -> dict[str, float]:
    """Resident and peak resident memory of this process in MB (Linux /proc, else getrusage)."""
    status = Path("/proc/self/status")
    if status.is_file():
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        return {"rss": int(fields["VmRSS"].split()[0]) / 1024,
                "peak": int(fields["VmHWM"].split()[0]) / 1024}
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    return {"rss": peak, "peak": peak}


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def artifact_sizes(build_dir: Path) -> dict[str, int]:
    """Bytes per component directory of a build (bm25/, vectors/, ...) plus ``total``."""
    sizes = {p.name: tree_bytes(p) for p in sorted(build_dir.iterdir()) if p.is_dir()}
    sizes["total"] = tree_bytes(build_dir)
    return sizes


def measure_concurrency(run: Callable[[Any], Any], items: Sequence[Any], threads: int,
                        warmup: Sequence[Any] = ()) -> dict[str, Any]:
    """``threads`` workers share ``run`` (closed loop: each starts its next item when one
    finishes); returns throughput and the per-call latency distribution."""
    from concurrent.futures import ThreadPoolExecutor

    clock = time.perf_counter

    def timed(item: Any) -> float:
        began = clock()
        run(item)
        return (clock() - began) * 1e3

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(timed, warmup))
        began = clock()
        wall = list(pool.map(timed, items))
        seconds = clock() - began
    return {"threads": threads, "queries": len(items), "seconds": seconds,
            "qps": len(items) / seconds if seconds > 0 else 0.0, "latency": summarize(wall)}


def pareto_front(points: Sequence[Mapping[str, Any]], maximize: str, minimize: str
                 ) -> list[Mapping[str, Any]]:
    """Points no other point beats on both ``maximize`` and ``minimize``, by ``minimize``."""
    def dominated(p: Mapping[str, Any]) -> bool:
        return any(q[maximize] >= p[maximize] and q[minimize] <= p[minimize]
                   and (q[maximize] > p[maximize] or q[minimize] < p[minimize]) for q in points)
    return sorted((p for p in points if not dominated(p)), key=lambda p: p[minimize])


def measure_in_chunks(runners: Mapping[str, Callable[[Any], Any]], items: Sequence[Any],
                      warmup: Sequence[Any], chunk: int,
                      after: Mapping[str, Callable[[Any], Any]] | None = None,
                      flush: Callable[[], object] = lambda: None, desc: str | None = None
                      ) -> dict[str, Samples]:
    """``measure_side_by_side`` one chunk at a time, with a progress bar; ``after`` runs on
    each chunk once ``runners`` did and ``flush`` ran (cache hits need the writes landed)."""
    from tqdm.auto import tqdm

    after = after or {}
    samples: dict[str, Samples] = {name: Samples() for name in [*runners, *after]}
    blocks = [items[s:s + chunk] for s in range(0, len(items), chunk)]
    for n, block in enumerate(tqdm(blocks, desc=desc, disable=desc is None)):
        first = warmup if n == 0 else ()
        parts = measure_side_by_side(runners, block, first, chunk)
        flush()
        parts.update(measure_side_by_side(after, block, first, chunk) if after else {})
        for name, part in parts.items():
            samples[name].wall_ms += part.wall_ms
            samples[name].outputs += part.outputs
            samples[name].cpu_total_ms += part.cpu_total_ms
    return samples
