"""Typo tolerance in the keyword leg, in one run: ``python -m benchmarks.typos``.

1. **Quality**: SciFact's test queries (qrels/test.tsv), clean and with typos of our own
   model (``misspell``: each word of 5+ letters, with probability ``--rate``, gets one of an
   adjacent swap, a dropped letter, a doubled letter or a neighbouring key on a QWERTY
   keyboard), nDCG@10 with typo tolerance against without, for the hybrid retriever (the
   defaults) and BM25 alone (``candidate_policy="keyword"``, ``vector_weight=0``). Every
   correction is checked: the corrected word's own term is in no document.
2. **Keyword-leg latency**: the query's terms (analysis, corrections) plus BM25's top
   candidates, per query, tolerance on and off, on clean and typo queries, p50/p95/p99;
   each query's words looked up cold (the dictionary remembers 65,536 looked-up words).
3. **The structure at scale**: ``TypoIndex.build`` time and size over the words of synthetic
   corpora of 100k and 1M passages (``benchmarks.synthetic_corpus``: a Zipfian vocabulary of
   made-up words), and per-word lookup time there.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import DEFAULT_DATA, REPO, RESULTS_DIR, markdown_table, publish_report
from benchmarks.live import scifact
from benchmarks.quality import evaluate_run, retriever_run
from benchmarks.synthetic_corpus import CorpusSpec, bm25_index, generate
from indexes import build_index
from indexes.analyzer import Analyzer
from indexes.corpus import read_qrels, read_queries
from indexes.typos import TypoIndex, max_edits
from retrieval import Retriever, RetrieverConfig
from retrieval.latency import summarize
from retrieval.request_path.pipeline import keyword_terms

KEYBOARD = ("qwertyuiop", "asdfghjkl", "zxcvbnm")


def neighbours(letter: str) -> str:
    """Keys next to ``letter`` on its row and the rows above and below."""
    for r, row in enumerate(KEYBOARD):
        if letter in row:
            c = row.index(letter)
            near = [row[i] for i in (c - 1, c + 1) if 0 <= i < len(row)]
            for other in (r - 1, r + 1):
                if 0 <= other < len(KEYBOARD):
                    near += [KEYBOARD[other][i] for i in (c - 1, c, c + 1)
                             if 0 <= i < len(KEYBOARD[other])]
            return "".join(near)
    return ""


def misspell(word: str, rng: random.Random) -> str:
    """One typo: an adjacent swap, a dropped letter, a doubled letter or a neighbouring key."""
    i = rng.randrange(1, len(word) - 1)  # first and last letters stay (people see those)
    kind = rng.choice(("swap", "drop", "double", "key"))
    if kind == "swap":
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if kind == "drop":
        return word[:i] + word[i + 1:]
    if kind == "double":
        return word[:i] + word[i] + word[i:]
    near = neighbours(word[i]) or word[i]
    return word[:i] + rng.choice(near) + word[i + 1:]


def with_typos(query: str, rate: float, rng: random.Random) -> str:
    """``query`` with each word of 5+ letters misspelt with probability ``rate``."""
    return re.sub(r"[A-Za-z]{5,}",
                  lambda m: misspell(m[0], rng) if rng.random() < rate else m[0], query)


def quality(retriever: Retriever, queries: dict[str, str], typo_queries: dict[str, str],
            qrels: dict[str, dict[str, int]]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    legs: tuple[tuple[str, dict[str, Any]], ...] = (
        ("hybrid", {}), ("BM25 alone", {"candidate_policy": "keyword", "vector_weight": 0.0}))
    for leg, ranking in legs:
        for tolerance in (False, True):
            with retriever.with_ranking(typo_tolerance=tolerance, **ranking) as variant:
                for name, texts in (("clean", queries), ("typos", typo_queries)):
                    run = retriever_run(variant, texts, k=10)
                    label = f"{leg}, {name}, tolerance {'on' if tolerance else 'off'}"
                    figures[label] = evaluate_run(qrels, run, ("ndcg@10",))["ndcg@10"]
    return figures


def corrections(retriever: Retriever, texts: list[str]) -> dict[str, Any]:
    """How many words were corrected, and that none had a term of its own."""
    snapshot, vocab = retriever.snapshot, retriever.snapshot.bm25.vocab
    fixed, rewritten_known = 0, 0
    for text in texts:
        found = keyword_terms(snapshot, text, retriever.config).corrections
        fixed += len(found)
        rewritten_known += sum(snapshot.analyzer.stem([w])[0] in vocab for w in found)
    return {"queries": len(texts), "words corrected": fixed,
            "known terms rewritten": rewritten_known}


def keyword_latency(retriever: Retriever, texts: list[str], candidates: int) -> dict[str, Any]:
    snapshot = retriever.snapshot
    out: dict[str, Any] = {}
    for tolerance in (False, True):
        config = retriever.config.model_copy(update={"typo_tolerance": tolerance})
        if snapshot.bm25.typos is not None:
            snapshot.bm25.typos.forget()  # cold: the quality runs looked these words up
        samples = []
        for text in texts:
            started = time.perf_counter()
            terms = keyword_terms(snapshot, text, config)
            snapshot.bm25.top_candidates(terms.tokens, candidates)
            samples.append((time.perf_counter() - started) * 1e3)
        out[f"tolerance {'on' if tolerance else 'off'}"] = summarize(samples)
    return out


def structure_at(n_passages: int, probes: int) -> dict[str, Any]:
    corpus = generate(CorpusSpec(n_docs=n_passages))
    bm25 = bm25_index(corpus)
    analyzer = Analyzer()
    started = time.perf_counter()
    typos = TypoIndex.build(bm25.vocab_list, analyzer.stem, bm25.doc_freqs)
    seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        typos.save(Path(tmp))
        size = sum(p.stat().st_size for p in Path(tmp).iterdir())
    rng = random.Random(3)
    words = [w for w in rng.sample(typos.words, min(probes, len(typos.words)))
             if max_edits(w)]
    samples = []
    for word in words:
        probe = misspell(word, rng)
        typos.forget()  # each lookup cold, as a new query's word is
        started = time.perf_counter()
        typos.closest(probe, bm25.doc_freq)
        samples.append((time.perf_counter() - started) * 1e3)
    return {"passages": n_passages, "corpus words": len(bm25.vocab_list),
            "words entered": len(typos.words), "deletions": int(typos.keys.size),
            "build seconds": seconds, "bytes on disk": size, "lookup ms": summarize(samples)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    docs, vectors, info = scifact(args.data, args.vectors_from)
    qrels = read_qrels(args.data / "qrels" / "test.tsv")
    every = read_queries(args.data / "queries.jsonl")
    queries = {q: every[q] for q in qrels}
    rng = random.Random(args.seed)
    typo_queries = {q: with_typos(text, args.rate, rng) for q, text in queries.items()}
    results: dict[str, Any] = {"queries": len(queries), "rate": args.rate,
                               "changed queries": sum(typo_queries[q] != queries[q]
                                                      for q in queries)}
    with tempfile.TemporaryDirectory(prefix="bench-typos-") as tmp:
        root = Path(tmp) / "index"
        started = time.perf_counter()
        report = build_index(docs, root, vectors=vectors, encoder_info=info, progress=False)
        results["build seconds"] = {"total": time.perf_counter() - started, **report.seconds}
        with Retriever.load(root, RetrieverConfig(cache={"backend": "none"})) as retriever:
            results["typos size bytes"] = retriever.snapshot.bm25.typos.nbytes  # type: ignore[union-attr]
            results["ndcg@10"] = quality(retriever, queries, typo_queries, qrels)
            results["corrections"] = corrections(retriever, list(typo_queries.values()))
            results["clean corrections"] = corrections(retriever, list(queries.values()))
            results["keyword leg ms"] = {
                name: keyword_latency(retriever, list(texts.values()), args.candidates)
                for name, texts in (("clean", queries), ("typos", typo_queries))}
    results["structure"] = [structure_at(n, args.probes) for n in args.scales]
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [f"# Typo tolerance: SciFact test queries ({results['queries']}, "
             f"{results['changed queries']} with typos at rate {results['rate']})", "",
             markdown_table(["nDCG@10", "value"],
                            [[k, f"{v:.4f}"] for k, v in results["ndcg@10"].items()]), "",
             f"Corrections on typo queries: {results['corrections']}; on clean queries: "
             f"{results['clean corrections']}", "",
             "Keyword leg (terms + BM25 top candidates), ms:", ""]
    rows = [[f"{name}, {mode}", f"{s['p50']:.3f}", f"{s['p95']:.3f}", f"{s['p99']:.3f}"]
            for name, modes in results["keyword leg ms"].items() for mode, s in modes.items()]
    lines += [markdown_table(["queries", "p50", "p95", "p99"], rows), "",
              "The structure over synthetic corpora:", ""]
    rows = [[s["passages"], s["corpus words"], s["words entered"], s["deletions"],
             f"{s['build seconds']:.1f}", f"{s['bytes on disk'] / 2**20:.1f}",
             f"{s['lookup ms']['p50']:.3f}", f"{s['lookup ms']['p95']:.3f}"]
            for s in results["structure"]]
    lines.append(markdown_table(["passages", "words", "entered", "deletions", "build s", "MiB",
                                 "lookup p50 ms", "p95"], rows))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--vectors-from", type=Path,
                        default=REPO / "build" / "test-indexes" / "scifact")
    parser.add_argument("--rate", type=float, default=0.5, help="share of 5+ letter words")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--candidates", type=int, default=300)
    parser.add_argument("--probes", type=int, default=300, help="lookups timed per scale")
    parser.add_argument("--scales", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    results = run(args)
    publish_report("typos", args, results, markdown(results))


if __name__ == "__main__":
    main()
