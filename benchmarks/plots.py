"""How the suite and the sweep show their results: PNG plots and markdown tables.

The plot functions return the PNG's path, or None without matplotlib (a dev extra), so a run
without it still writes its JSON and markdown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # no display on benchmark machines
    import matplotlib.pyplot as plt

    return plt


def stage_panels(samples: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
    panels: dict[str, dict[str, list[float]]] = {"end to end (wall)": {}}
    for name, s in samples.items():
        panels["end to end (wall)"][name] = s.wall_ms
        for o in s.outputs:
            for stage, ms in (o[0] or {}).items():
                if stage != "total":
                    panels.setdefault(stage, {}).setdefault(name, []).append(ms)
    return panels


def stage_cdfs(panels: Mapping[str, Mapping[str, Sequence[float]]], path: Path,
               columns: int = 3) -> Path | None:
    """One panel per stage, one latency CDF (log x) per system that reports the stage."""
    plt = _pyplot()
    if plt is None or not panels:
        return None
    import numpy as np
    from matplotlib.ticker import NullFormatter

    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    flat = axes.ravel()
    for ax, (stage, series) in zip(flat, panels.items(), strict=False):
        for label, values in series.items():
            # Log axes cannot show 0 ms (a stage that did nothing): floor at 1 µs.
            ordered = np.maximum(np.sort(np.asarray(values, dtype=np.float64)), 1e-3)
            ax.plot(ordered, np.arange(1, ordered.size + 1) / ordered.size, label=label)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on short ranges
        ax.set_title(stage)
        ax.set_xlabel("ms (log scale)")
        ax.set_ylabel("fraction of queries")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="x-small")
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    return _save(fig, plt, path)


def quality_latency(points: Sequence[Mapping[str, Any]], path: Path, title: str,
                    front: Sequence[Mapping[str, Any]] = (), label_points: bool = True
                    ) -> Path | None:
    """nDCG@10 against p95 (log x): one point per system or configuration (``label``,
    ``p95``, ``ndcg@10``, optional ``kind``); ``front`` is drawn as a step line."""
    plt = _pyplot()
    if plt is None or not points:
        return None
    fig, ax = plt.subplots(figsize=(9, 6))
    for kind, marker in (("ours", "o"), ("peer", "s")):
        chosen = [p for p in points if p.get("kind", "ours") == kind]
        if chosen:
            ax.scatter([p["p95"] for p in chosen], [p["ndcg@10"] for p in chosen],
                       marker=marker, label=kind, alpha=0.8)
    if front:
        ax.step([p["p95"] for p in front], [p["ndcg@10"] for p in front], where="post",
                color="black", linewidth=1, label="Pareto front")
    if label_points:
        for p in (p for p in points if p["label"]):
            ax.annotate(p["label"], (p["p95"], p["ndcg@10"]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("p95 latency, ms (log scale)")
    ax.set_ylabel("nDCG@10")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, plt, path)


def throughput(modes: Mapping[str, Mapping[int, Mapping[str, Any]]], path: Path
               ) -> Path | None:
    """Queries/s and p95 against the number of threads sharing one Retriever, per mode."""
    plt = _pyplot()
    if plt is None or not modes:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, levels in modes.items():
        threads = sorted(levels)
        left.plot(threads, [levels[t]["qps"] for t in threads], marker="o", label=mode)
        right.plot(threads, [levels[t]["latency"]["p95"] for t in threads], marker="o",
                   label=mode)
    ticks = sorted({t for by_threads in modes.values() for t in by_threads})
    for ax, ylabel in ((left, "queries / s (log scale)"), (right, "p95 latency, ms (log scale)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_yscale("log")  # cache hits and encoder-bound misses differ by 100x and more
        ax.set_xlabel("threads sharing one Retriever")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    left.legend(fontsize="small")
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- markdown ----------------------------------------------------------------------------------

STAGES = ("validate", "cache", "filter", "bm25", "embed", "embed_wait", "rerank", "fuse",
          "features", "hydrate", "dense", "total")


def _ms(value: float) -> str:
    from benchmarks.common import fmt_ms

    return fmt_ms(value)


def _cells(summary: Mapping[str, float], keys: Sequence[str] = ("p50", "p95", "p99", "max")
           ) -> list[str]:
    return [_ms(summary[k]) for k in keys]


def quality_table(systems: Mapping[str, Any], reference: str) -> str:
    """Quality and search-path latency per system, with p95 as a multiple of ours."""
    from benchmarks.common import markdown_table

    base = systems[reference]["latency"]["e2e"]["p95"]
    rows = []
    for name, s in systems.items():
        q, e = s["quality"] or {}, s["latency"]["e2e"]
        scores = [f"{q[m]:.3f}" if m in q else "—" for m in
                  ("ndcg@10", "recall@10", "recall@100", "recall@1000", "mrr@10")]
        rows.append([name, *scores, *_cells(e), f"{e['p95'] / base:.1f}x", e["n"]])
    return markdown_table(["system", "nDCG@10", "R@10", "R@100", "R@1000", "MRR@10", "p50 ms",
                           "p95 ms", "p99 ms", "max ms", "p95 vs ours", "n"], rows)


def end_to_end_table(e2e: Mapping[str, Any], cold: Sequence[Mapping[str, Any]]) -> str:
    """Warm rows from the side-by-side run; the cold row from fresh processes."""
    from benchmarks.common import markdown_table
    from retrieval.latency import summarize

    rows = [[name, r["e2e"]["n"], *_cells(r["e2e"]),
             f"{r['share_as_expected']:.3f} {'/'.join(r['expected_cache_status'])}"]
            for name, r in e2e.items()]
    if cold:
        first = summarize([c["first_query_ms"] for c in cold])
        encoded = cold[0]["encoder"] is not None
        rows.insert(0, [f"cold: first query of a fresh process after load ("
                        f"{'encoded in the call' if encoded else 'vector given'})",
                        first["n"], *_cells(first), "— (new process)"])
    return markdown_table(["scenario", "n", "p50 ms", "p95 ms", "p99 ms", "max ms",
                           "share with expected cache status"], rows)


def stage_table(systems: Mapping[str, Any]) -> str:
    from benchmarks.common import markdown_table

    present = [s for s in STAGES if any(s in r["stages"] for r in systems.values())]
    rows = [[name] + [" / ".join(_cells(r["stages"][s])) if s in r["stages"] else "—"
                      for s in present]
            for name, r in systems.items() if r["stages"]]
    return markdown_table(["system", *present], rows)


def concurrency_table(modes: Mapping[str, Mapping[Any, Any]]) -> str:
    from benchmarks.common import markdown_table

    rows = [[mode, threads, f"{r['qps']:.0f}", *_cells(r["latency"])]
            for mode, levels in modes.items() for threads, r in levels.items()]
    return markdown_table(["mode", "threads", "queries/s", "p50 ms", "p95 ms", "p99 ms",
                           "max ms"], rows)


def load_lines(load: Mapping[str, Any]) -> list[str]:
    lines = [f"- index snapshot load in this process (checksums verified, mmapped): "
             f"{load['snapshot_load_seconds'] * 1e3:.0f} ms"]
    for n, c in enumerate(load["fresh_process"], start=1):
        lines.append(
            f"- fresh process {n}: `Retriever.load` (index + query encoder) "
            f"{c['load_seconds']:.2f} s; RSS {c['memory_before_load_mb']['rss']:.0f} MB before "
            f"load (interpreter + libraries), {c['memory_after_load_mb']['rss']:.0f} MB after, "
            f"peak {c['memory_after_queries_mb']['peak']:.0f} MB; first query "
            f"{c['first_query_ms']:.2f} ms, next 20 p50 {c['next_queries']['p50']:.2f} ms; "
            f"process start to exit {c['process_seconds']:.1f} s")
    return lines


def build_lines(build: Mapping[str, Any]) -> list[str]:
    sizes = ", ".join(f"{k}/ {v / 2**20:.2f} MB" for k, v in build["sizes"].items()
                      if k != "total")
    head = f"- artifacts: {sizes}; total {build['sizes']['total'] / 2**20:.2f} MB"
    if "seconds" not in build:
        return [head, "- build: not timed (prebuilt or cached index)"]
    vectors = ("vectors given (random)" if build.get("vectors_given") else
               f"{build['vectors_encoded']} vectors encoded, {build['vectors_reused']} reused by "
               "content hash")
    return [head, f"- build seconds per stage: {build['seconds']} ({vectors}; stored as "
            f"{build['vector_dtype']})"]


def suite_markdown(p: Mapping[str, Any]) -> str:
    w, env = p["workload"], p["environment"]
    reference = next(name for name, s in p["systems"].items() if s["kind"] == "ours")
    notes = [f"- {s}: {v['notes']} (setup {v['setup_seconds']} s)"
             for s, v in p["systems"].items() if v["notes"]]
    notes += [f"- {k}: {v}" for k, v in p["notes"].items()]
    return "\n".join([
        f"# Benchmark suite: {w['name']} (git {env['git_sha']}, sources {env['source_digest']})",
        "", f"{w['n_docs']:,} documents; {w['queries']} queries ({w['warmup']} warm-up, "
        f"discarded; {w['measured']} measured), {w['qrels_queries']} with relevance judgments; "
        f"query encoder of the index: `{w['encoder']}`. Latency at k=10; nDCG@10, R@10 and "
        "MRR@10 from k=10 runs (the configuration timed), deeper recall from k=1000 runs (ours "
        "then takes C = 1000). Systems interleaved in chunks of queries, one query at a time, "
        "BLAS pinned to one thread (ours: BM25 spreads a query of 50,000 postings or more over "
        "the cores). Ours returns hydrated hits (text, metadata; pydantic), peers ids and scores. "
        f"Machine: {env['cpu_count']} CPUs, load average {env['load_average']}; run took "
        f"{p['seconds'] / 60:.1f} min.", "",
        "## Quality and search-path latency (same query vectors given to every system)", "",
        quality_table(p["systems"], reference), "",
        "## Ours end to end (the query is encoded inside the call)", "",
        end_to_end_table(p["end_to_end"], p["cold"]), "",
        "## Per stage, ms (p50 / p95 / p99 / max)", "",
        stage_table({**{n: s["latency"] for n, s in p["systems"].items()},
                     **p["end_to_end"]}), "",
        "## Throughput: threads sharing one Retriever", "",
        concurrency_table(p["concurrency"]), "",
        "## Load, memory and build", "", *load_lines(p["load"]), *build_lines(p["build"]), "",
        "## Systems and notes", "", *notes, "",
        "Plots: " + ", ".join(f"`{Path(v).name}`" for v in p.get("plots", {}).values()),
    ])
