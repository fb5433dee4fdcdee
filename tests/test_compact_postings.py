"""Compact postings (indexes.compact_postings): the same top C, scores and ties as the plain
format through every kernel, on random corpora and queries and on SciFact; under 3 bytes a
posting; built, sharded, published and searched like the plain format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live_index import INFO, unit_vectors

from indexes import BuildConfig, build_index
from indexes.analysis import analyze
from indexes.analyzer import Analyzer, AnalyzerConfig
from indexes.bm25 import BM25Index, BM25Params
from indexes.corpus import read_corpus
from indexes.docstore import Document
from retrieval import Retriever, RetrieverConfig

SHIPPED = Path(__file__).resolve().parents[1] / "examples" / "data"
FORCED = ("exhaustive", "pruned", "mask_walk", "gallop")


def compact_copy(index: BM25Index, directory: Path) -> BM25Index:
    index.save(directory, "compact")
    return BM25Index.load(directory)


def assert_same_answers(plain: BM25Index, compact: BM25Index, query: list[str],
                        mask: np.ndarray | None, n: int) -> None:
    kernels = [None, *(k for k in FORCED if mask is not None or k in ("exhaustive", "pruned"))]
    for kernel in kernels:
        expected = plain.top_candidates(query, n, mask, kernel=kernel)
        got = compact.top_candidates(query, n, mask, kernel=kernel)
        assert got[0].tolist() == expected[0].tolist(), kernel
        assert got[1].tobytes() == expected[1].tobytes(), kernel
    touched, compact_touched = plain.score_touched(query, mask), compact.score_touched(query, mask)
    order, compact_order = np.argsort(touched[0]), np.argsort(compact_touched[0])
    assert touched[0][order].tolist() == compact_touched[0][compact_order].tolist()
    assert touched[1][order].tobytes() == compact_touched[1][compact_order].tobytes()
    rows = np.arange(0, plain.n_docs, 3)
    assert plain.score_rows(query, rows).tobytes() == compact.score_rows(query, rows).tobytes()


DOCS = st.lists(st.lists(st.sampled_from([f"w{i}" for i in range(40)]), max_size=30),
                min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(DOCS, st.lists(st.sampled_from([f"w{i}" for i in range(45)]), min_size=1, max_size=6),
       st.sampled_from(["okapi", "lucene"]), st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_random_corpora_give_the_same_answers(tmp_path_factory, docs, query, variant, n, seed):
    """Any corpus, any query (repeated and unknown words, okapi's negative-idf floor), with
    and without a filter mask, through every kernel."""
    plain = BM25Index.build(docs, BM25Params(variant=variant))
    compact = compact_copy(plain, tmp_path_factory.mktemp("compact"))
    assert compact.compact is not None and compact.rows is None
    mask = np.random.default_rng(seed).random(plain.n_docs) < 0.4
    for m in (None, mask):
        assert_same_answers(plain, compact, query, m, n)


def test_every_posting_decodes_to_its_plain_row_and_impact(tmp_path):
    """Gaps past one varint byte, and term frequencies past one byte (an escape)."""
    docs = [["rare"] * 300 + ["a"]] + [["a", "b"] * (i % 7 + 1) for i in range(5000)]
    docs += [["rare", "c"]] * 3 + [["a"] * 256]
    plain = BM25Index.build(docs)
    compact = compact_copy(plain, tmp_path)
    everything = np.arange(len(plain.vocab_list), dtype=np.int64)
    (indptr, rows, impacts), _ = compact.postings_of(everything)
    assert indptr.tobytes() == plain.indptr.tobytes()
    assert rows.tobytes() == plain.rows.tobytes()
    assert impacts.tobytes() == plain.impacts.tobytes()
    assert compact.compact.tf_exceptions[:, 1].tolist() == [300, 256]  # "rare", then "a"


@pytest.mark.parametrize("variant", ["okapi", "lucene"])
def test_scifact_gives_the_same_top_300_and_scores_in_under_3_bytes_a_posting(tmp_path,
                                                                             variant):
    corpus = SHIPPED / "scifact"
    texts = [d.content for d in read_corpus(corpus)]
    postings = analyze(texts, AnalyzerConfig())
    plain = BM25Index.from_postings(postings.terms, postings.post_terms, postings.post_rows,
                                    postings.post_tfs, postings.lengths,
                                    BM25Params(variant=variant))
    compact = compact_copy(plain, tmp_path)
    analyzer = Analyzer()
    queries = [json.loads(line)["text"]
               for line in (corpus / "queries.jsonl").read_text().splitlines()[:300]]
    mask = np.random.default_rng(0).random(plain.n_docs) < 0.2
    for query in queries:
        assert_same_answers(plain, compact, analyzer(query), None, 300)
    for query in queries[:50]:
        assert_same_answers(plain, compact, analyzer(query), mask, 300)
    # Per posting: rows, term frequencies and the per-row norms the impacts come from (the
    # plain format's rows.npy and impacts.npy); per term, like indptr: offsets, idf, bounds.
    per_posting = sum((tmp_path / f"{name}.npy").stat().st_size
                      for name in ("row_bytes", "tf", "tf_exceptions", "norms"))
    plain_size = plain.rows.nbytes + plain.impacts.nbytes
    assert per_posting / plain.rows.shape[0] < 3.0 and per_posting < plain_size / 2.5


def test_a_compact_build_searches_like_a_plain_one_whole_and_sharded(tmp_path):
    docs = [Document(id=d.id, text=d.text, title=d.title, metadata={"n": i % 5})
            for i, d in enumerate(read_corpus(SHIPPED / "cranfield"))][:600]
    vectors = unit_vectors(len(docs), 0)
    roots = {}
    for postings in ("plain", "compact"):
        for shards in (None, 2):
            root = tmp_path / f"{postings}-{shards}"
            build_index(docs, root, vectors=vectors, encoder_info=INFO, progress=False,
                        shards=shards, dense="exact",
                        config=BuildConfig(postings=postings))  # type: ignore[arg-type]
            roots[postings, shards] = root
    config = RetrieverConfig(cache={"backend": "none"}, candidate_policy="keyword")
    queries = ["boundary layer flow", "supersonic wing heat transfer", "shock waves"]
    for shards in (None, 2):
        with Retriever.load(roots["plain", shards], config) as plain, \
                Retriever.load(roots["compact", shards], config) as compact:
            for i, query in enumerate(queries):
                for filters in (None, {"n": 2}):
                    mine = plain.search(query, filters, k=10, query_vector=vectors[i])
                    theirs = compact.search(query, filters, k=10, query_vector=vectors[i])
                    assert [(h.doc_id, h.score) for h in mine.hits] == [
                        (h.doc_id, h.score) for h in theirs.hits]
    for shards in (None, 2):
        files = {p.name for p in roots["compact", shards].rglob("bm25/*")}
        assert "row_bytes.npy" in files and "rows.npy" not in files and "impacts.npy" not in files
