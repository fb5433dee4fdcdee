"""Generated corpora and vectors for latency runs at scale (benchmarks and tests only).

Nothing here is used to measure quality: generated text has no relevance judgments.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from indexes.demo_metadata import demo_metadata
from indexes.docstore import Document

_WORDS = (
    "cell protein gene expression patient risk disease therapy trial cancer tumor immune "
    "response blood pressure heart brain neuron signal pathway receptor drug dose effect "
    "treatment outcome mortality infection virus bacteria vaccine antibody inflammation "
    "metabolism insulin glucose obesity diet exercise sleep memory stress hormone growth "
    "factor mutation sequence genome rna dna enzyme kinase membrane tissue muscle bone liver "
    "kidney lung skin stem differentiation development aging survival incidence cohort "
    "statin cholesterol lipid vascular stroke cardiac rhythm imaging biomarker screening"
).split()


def synthetic_documents(n: int, seed: int = 0, words_per_doc: int = 40) -> Iterator[Document]:
    """``n`` documents of words drawn Zipf-like from a medical vocabulary, with demo metadata."""
    rng = np.random.default_rng(seed)
    vocab = np.array(_WORDS)
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    for i in range(n):
        words = rng.choice(vocab, size=words_per_doc, p=weights)
        doc_id = f"syn-{i}"
        yield Document(doc_id, " ".join(words[4:]), " ".join(words[:4]), demo_metadata(doc_id))


def synthetic_vocabulary_documents(
    n: int, vocab_size: int = 50_000, words_per_doc: int = 60, seed: int = 0
) -> Iterator[Document]:
    """Large corpora for latency runs: Zipf term frequencies over made-up terms (``t123``)."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, 10_000):
        size = min(10_000, n - start)
        ids = rng.zipf(1.2, size=(size, words_per_doc)) % vocab_size
        for offset, row in enumerate(ids):
            doc_id = f"syn-{start + offset}"
            text = " ".join(f"t{t}" for t in row)
            yield Document(doc_id, text, "", demo_metadata(doc_id))


def random_unit_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """float32 (n, dim) rows on the unit sphere (latency runs only)."""
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def clustered_unit_vectors(n: int, dim: int, seed: int = 0, centers_of: int | None = None,
                           spread: float = 1.5) -> np.ndarray:
    """float32 (n, dim) unit rows drawn around ~sqrt(N) random centres (latency runs only).

    Real embeddings sit in topical clusters; uniform random vectors have no neighbours, so on
    them no ANN index beats a full scan. Each row is a centre plus Gaussian noise of norm
    ~``spread``, normalized. At 1.5 the IVF recall@100 ladder at SciFact's size (nlist 132)
    follows SciFact's own embeddings' (.954 / .977 / .989 at nprobe 32 / 48 / 64, against
    .958 / .983 / .994). The centres depend only on N = ``centers_of`` or ``n``: queries drawn
    with ``centers_of`` = the corpus size share the corpus' clusters.
    """
    size = centers_of or n
    centers = random_unit_vectors(max(1, int(np.sqrt(size))), dim, seed=size)
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):  # bounded scratch at 1M+ rows
        stop = min(n, start + 100_000)
        noise = rng.standard_normal((stop - start, dim), dtype=np.float32)
        block = centers[rng.integers(0, len(centers), stop - start)] + noise * (spread / dim ** 0.5)
        out[start:stop] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out
