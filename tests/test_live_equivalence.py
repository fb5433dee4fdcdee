"""Live corpus equals a fresh build of it: base = SciFact minus 1,000 documents (500 withheld,
500 with a different text), then the 1,000 real documents upserted and 500 others deleted.

Before compaction BM25 uses the live statistics (N, df, avgdl of the live corpus), so the
top-10 of every test query equals the fresh build's (ids; scores within 1e-5), with and
without a filter. After compaction the new build is that fresh build, dense leg included.

SciFact is encoded once: every vector here is the session index's (precomputed, by content
hash); a changed base text borrows another document's vector, since what is tested is the
log, the delta and compaction, not the model.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from indexes import Document, build_index, read_corpus
from indexes.demo_metadata import with_demo_metadata
from indexes.manifest import read_manifest, resolve_build_dir
from indexes.storage import load_array
from indexes.vectors import VectorStore, content_hashes
from indexes.writer import IndexWriter
from retrieval import Retriever

FILTERS = [None, {"department": {"in": ["oncology", "cardiology", "neurology"]}},
           'year >= 2005 AND NOT doc_type = "review"']


@pytest.fixture(scope="module")
def live_corpus(beir_index, dataset, encoder, tmp_path_factory):
    source, queries, _ = beir_index("scifact")
    build = resolve_build_dir(source)
    stored = VectorStore.load(build / "vectors")
    row_of = {bytes(h): r for r, h in enumerate(load_array(build / "vectors" /
                                                           "content_hashes.npy"))}
    docs = list(with_demo_metadata(read_corpus(dataset("scifact"))))
    vectors = stored.reconstruct_rows(np.asarray(
        [row_of[bytes(h)] for h in content_hashes([d.content for d in docs])]))
    rng = random.Random(15)
    picked = rng.sample(range(len(docs)), 1500)
    new, changed, deleted = picked[:500], picked[500:1000], picked[1000:]
    withheld = set(new)
    base = [Document(d.id, d.text[: len(d.text) // 3] + " (draft)", d.title, d.metadata)
            if i in set(changed) else d for i, d in enumerate(docs) if i not in withheld]
    base_vectors = np.stack([vectors[(i + 1) % len(docs)] if i in set(changed) else vectors[i]
                             for i in range(len(docs)) if i not in withheld])
    info = read_manifest(build).encoder
    root = tmp_path_factory.mktemp("live") / "index"
    build_index(base, root, vectors=base_vectors, encoder_info=info, progress=False)
    upserts = new + changed
    with IndexWriter(root) as writer:
        for start in range(0, 1000, 250):
            batch = upserts[start:start + 250]
            writer.upsert([docs[i] for i in batch], vectors=vectors[batch])
        writer.delete([docs[i].id for i in deleted])
    gone = {docs[i].id for i in upserts + deleted}
    live = [d for d in base if d.id not in gone] + [docs[i] for i in upserts]
    live_vectors = np.concatenate([np.stack([v for d, v in zip(base, base_vectors, strict=True)
                                             if d.id not in gone]), vectors[upserts]])
    fresh = tmp_path_factory.mktemp("fresh") / "index"
    build_index(live, fresh, vectors=live_vectors, encoder_info=info, progress=False)
    texts = list(queries.values())
    return root, fresh, texts, encoder.encode(texts)


def top10(retriever: Retriever, texts, query_vectors, filters) -> list[list[tuple[str, float]]]:
    results = retriever.search_batch(texts, filters, 10, query_vectors=query_vectors)
    return [[(h.doc_id, h.score) for h in r.hits] for r in results]


def assert_same(live, fresh) -> None:
    for mine, theirs in zip(live, fresh, strict=True):
        assert [i for i, _ in mine] == [i for i, _ in theirs]
        assert np.allclose([s for _, s in mine], [s for _, s in theirs], rtol=0, atol=1e-5)


def test_before_and_after_compaction_equal_a_fresh_build(live_corpus, encoder):
    root, fresh_root, texts, query_vectors = live_corpus
    # The dense leg's IVF lists are trained per build: before compaction candidates come from
    # BM25 alone, whose live statistics are the point; after it, the default policy too.
    keyword = {"cache": {"backend": "none"}, "live_lag_seconds": None,
               "candidate_policy": "keyword"}
    with Retriever.load(root, keyword, encoder=encoder) as live, \
            Retriever.load(fresh_root, keyword, encoder=encoder) as fresh:
        assert live.snapshot.build_id.endswith("+5") and live.snapshot.manifest.n_docs == 4683
        for filters in FILTERS:
            assert_same(top10(live, texts, query_vectors, filters),
                        top10(fresh, texts, query_vectors, filters))
    default = {"cache": {"backend": "none"}, "live_lag_seconds": None}
    with Retriever.load(root, default, encoder=encoder) as live, \
            Retriever.load(fresh_root, default, encoder=encoder) as fresh:
        with IndexWriter(root) as writer:
            report = writer.compact()
        assert live.refresh() and live.build_id == report.build_id
        for filters in FILTERS:
            assert_same(top10(live, texts, query_vectors, filters),
                        top10(fresh, texts, query_vectors, filters))
