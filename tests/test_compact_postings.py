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


def test_a_large_query_decodes_its_terms_on_every_core_with_the_same_answers(tmp_path,
                                                                            monkeypatch):
    """Past ``THREADS_FROM_POSTINGS`` a query searched alone decodes its terms in parts at
    once (``term_parts``: longest first, each to the lightest part); the gathered arrays are
    those of one decode after another, bit for bit."""
    from indexes import compact_postings
    from indexes.compact_postings import gather_terms, gathered_indptr, term_parts
    from indexes.fan_out import THREADS_FROM_POSTINGS

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(12)]
    docs = [list(rng.choice(words, size=int(rng.integers(3, 12)), p=np.linspace(2, 0.2, 12)
                            / np.linspace(2, 0.2, 12).sum())) for _ in range(30_000)]
    plain = BM25Index.build(docs)
    compact = compact_copy(plain, tmp_path)
    query = ["w0", "w5", "w1", "w11", "w3", "w0"]
    ids, _ = compact.query_terms(query)
    lengths = compact.indptr[ids + 1] - compact.indptr[ids]
    assert lengths.sum() >= THREADS_FROM_POSTINGS
    parts = term_parts(lengths, 2)
    assert sorted(np.concatenate(parts).tolist()) == list(range(ids.size)) and len(parts) == 2
    loads = [int(lengths[p].sum()) for p in parts]
    assert max(loads) - min(loads) <= lengths.max()
    c = compact.compact
    assert c is not None
    indptr = gathered_indptr(compact.indptr, ids)
    rows = np.empty(indptr[-1], dtype=np.int32)
    impacts = np.empty(indptr[-1], dtype=np.float32)
    gather_terms(c.row_offsets, c.row_bytes, compact.indptr, c.tf, c.tf_exceptions, c.idf,
                 c.norms, c.k1, c.okapi, ids, np.arange(ids.size), indptr, rows, impacts)
    calls = []
    run_parts = compact_postings.each_part

    def counted(parts_calls, parallel):  # the real fan-out, its parts counted
        calls.append((len(parts_calls), parallel))
        return run_parts(parts_calls, parallel)

    monkeypatch.setattr(compact_postings, "each_part", counted)
    got = c.gather(compact.indptr, ids)
    assert calls == [(2, True)] or (calls == [(1, False)] and compact_postings.usable_cores() == 1)
    assert got[0].tolist() == indptr.tolist()
    assert got[1].tobytes() == rows.tobytes() and got[2].tobytes() == impacts.tobytes()
    assert_same_answers(plain, compact, query, None, 300)


def test_a_search_decodes_its_terms_once_for_bm25_and_the_dense_rows(tmp_path, monkeypatch):
    """The dense-only rows' BM25 (``score_rows``) reads the postings the BM25 stage gathered
    on this thread; other terms, or postings past ``KEEP_GATHERED_BYTES``, are decoded anew."""
    from indexes import bm25 as bm25_module
    from indexes.compact_postings import CompactPostings

    docs = [[f"w{(i * 7 + j) % 40}" for j in range(i % 9 + 1)] for i in range(2_000)]
    plain = BM25Index.build(docs)
    compact = compact_copy(plain, tmp_path)
    decoded = []
    decode = CompactPostings.gather

    def counted(self, indptr, term_ids):  # the real decode, its calls counted
        decoded.append(term_ids.tolist())
        return decode(self, indptr, term_ids)

    monkeypatch.setattr(CompactPostings, "gather", counted)
    rows = np.arange(0, 2_000, 11)
    for query in (["w3", "w17", "w3"], ["w3", "w17"], ["w5"]):
        compact.top_candidates(query, 50)
        assert compact.score_rows(query, rows).tobytes() == plain.score_rows(query, rows).tobytes()
    assert len(decoded) == 2  # once for w3 w17 (twice asked), once for w5
    monkeypatch.setattr(bm25_module, "KEEP_GATHERED_BYTES", 16)
    compact.top_candidates(["w3", "w17"], 50)
    compact.score_rows(["w3", "w17"], rows)
    assert len(decoded) == 4

