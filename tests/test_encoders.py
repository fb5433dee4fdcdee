"""ONNX encoders against the sentence-transformers reference, on the real model and SciFact.

The graphs are exported and quantized once per session into a temporary cache directory, so the
export path itself is exercised on every run (~15 s on two cores).
"""

from __future__ import annotations

import itertools
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from benchmarks.quality import evaluate_run, retriever_run
from indexes.corpus import read_corpus, read_qrels, read_queries
from indexes.encoders import (
    Encoder,
    SentenceTransformerEncoder,
    compatible_query_encoder,
    model_name,
    weights_digest,
)
from indexes.errors import EncoderMismatchError
from indexes.onnx_encoder import BACKENDS, OnnxEncoder, make_encoder
from retrieval import Retriever

NO_CACHE = {"cache": {"backend": "none"}}


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="session")
def onnx_fp32(onnx_cache: Path) -> OnnxEncoder:
    return OnnxEncoder(cache_dir=onnx_cache)


@pytest.fixture(scope="session")
def onnx_int8(onnx_cache: Path, onnx_fp32: OnnxEncoder) -> OnnxEncoder:
    return OnnxEncoder(cache_dir=onnx_cache, quantized=True)  # quantizes onnx_fp32's export


@pytest.fixture(scope="session")
def scifact_queries(dataset) -> list[str]:
    """The 300 SciFact test queries."""
    path = dataset("scifact")
    qrels = read_qrels(path / "qrels" / "test.tsv")
    return [text for q, text in read_queries(path / "queries.jsonl").items() if q in qrels]


@pytest.fixture(scope="session")
def scifact_docs(dataset) -> list[str]:
    """100 SciFact documents (title + text); most are longer than the 256-token cut."""
    return [doc.content for doc in itertools.islice(read_corpus(dataset("scifact")), 100)]


@pytest.fixture(scope="session")
def reference_queries(encoder: SentenceTransformerEncoder, scifact_queries) -> np.ndarray:
    return encoder.encode(scifact_queries)


def one_by_one(encoder: Encoder, texts: list[str]) -> np.ndarray:
    """float32 (n, dim): each text encoded alone, as the retriever encodes a query."""
    return np.vstack([encoder.encode([text]) for text in texts])


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row pair of two (n, d) arrays of unit vectors."""
    return np.einsum("nd,nd->n", a.astype(np.float64), b.astype(np.float64))


def test_encoder_ids_and_protocol(onnx_fp32, onnx_int8):
    assert onnx_fp32.encoder_id == "all-MiniLM-L6-v2:onnx:fp32:384"
    assert onnx_int8.encoder_id == "all-MiniLM-L6-v2:onnx-int8:int8:384"
    for enc in (onnx_fp32, onnx_int8):
        assert isinstance(enc, Encoder)
        vectors = enc.encode(["protein folding", "", "a b c"])
        assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert enc.encode([]).shape == (0, 384)


def test_fp32_queries_match_reference(onnx_fp32, scifact_queries, reference_queries):
    cosines = row_cosines(one_by_one(onnx_fp32, scifact_queries), reference_queries)
    print(f"fp32 query cosine to torch: mean {cosines.mean():.6f} min {cosines.min():.6f}")
    assert len(cosines) == 300
    assert cosines.min() >= 0.999


def test_fp32_document_batches_match_reference(onnx_fp32, encoder, scifact_docs):
    reference = encoder.encode(scifact_docs)
    # A batch size that does not divide 100, so the last batch is short and padding varies.
    cosines = row_cosines(onnx_fp32.encode(scifact_docs, batch_size=16), reference)
    print(f"fp32 document cosine to torch: mean {cosines.mean():.6f} min {cosines.min():.6f}")
    assert cosines.min() >= 0.999


def test_int8_close_to_reference(onnx_int8, encoder, scifact_queries, reference_queries,
                                 scifact_docs):
    queries = row_cosines(one_by_one(onnx_int8, scifact_queries), reference_queries)
    docs = row_cosines(onnx_int8.encode(scifact_docs, batch_size=16),
                       encoder.encode(scifact_docs))
    print(f"int8 query cosine to torch: mean {queries.mean():.4f} min {queries.min():.4f}; "
          f"documents: mean {docs.mean():.4f} min {docs.min():.4f}")
    assert queries.mean() >= 0.98 and queries.min() >= 0.95
    assert docs.mean() >= 0.98 and docs.min() >= 0.95


def test_int8_graph_has_fused_attention(onnx_int8):
    """Attention fused before quantizing (one QAttention per layer), and no SkipLayerNorm."""
    import onnx

    ops = [node.op_type for node in onnx.load(str(onnx_int8.onnx_path)).graph.node]
    assert ops.count("QAttention") == 6  # all-MiniLM-L6-v2 has 6 layers
    assert "SkipLayerNormalization" not in ops and "Transpose" not in ops


def test_fp32_graph_has_fused_attention(onnx_fp32):
    import onnx

    ops = [node.op_type for node in onnx.load(str(onnx_fp32.onnx_path)).graph.node]
    assert ops.count("Attention") == 6 and "Softmax" not in ops


def test_single_text_unpadded_equals_batched(onnx_fp32, scifact_queries):
    texts = scifact_queries[:40]  # lengths differ: the batch pads most of them
    single, batched = one_by_one(onnx_fp32, texts), onnx_fp32.encode(texts, batch_size=8)
    assert row_cosines(single, batched).min() >= 0.9999


def test_int8_vectors_do_not_depend_on_the_batch(onnx_int8, scifact_queries):
    """Dynamic quantization scales activations per batch: batched, a query's INT8 vector
    differed from its own (cosine down to 0.986), so search_batch ranked otherwise than
    search, and its vectors went into the embedding cache single searches read."""
    texts = scifact_queries[:24]
    np.testing.assert_array_equal(onnx_int8.encode(texts, batch_size=8),
                                  one_by_one(onnx_int8, texts))


def test_batches_come_back_in_input_order(onnx_fp32, scifact_queries):
    texts = scifact_queries[:30]
    shuffled = [texts[i] for i in np.random.default_rng(0).permutation(len(texts))]
    by_text = dict(zip(shuffled, onnx_fp32.encode(shuffled, batch_size=7), strict=True))
    expected = np.vstack([by_text[t] for t in texts])
    assert row_cosines(onnx_fp32.encode(texts, batch_size=7), expected).min() >= 0.9999


def test_concurrent_encodes_match_sequential(onnx_int8, scifact_queries):
    """The retriever encodes from worker threads: one session and tokenizer serve them all."""
    texts = scifact_queries[:40]
    sequential = one_by_one(onnx_int8, texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = np.vstack(list(pool.map(lambda t: onnx_int8.encode([t]), texts)))
    np.testing.assert_array_equal(concurrent, sequential)


def test_export_is_cached(onnx_cache, onnx_fp32, onnx_int8):
    files = sorted(p.name for p in onnx_cache.iterdir())
    # The export, its attention-fused fp32 graph, the INT8 graph; no temporary leftovers.
    assert files == ["model-fp32-attention-v1.onnx", "model-fp32-v1.onnx", "model-int8-v2.onnx"]
    before = onnx_fp32.onnx_path.stat().st_mtime_ns
    again = make_encoder("onnx", cache_dir=onnx_cache)
    assert again.encoder_id == onnx_fp32.encoder_id
    assert onnx_fp32.onnx_path.stat().st_mtime_ns == before


def test_invalid_backend_names_the_valid_ones():
    with pytest.raises(ValueError) as error:
        make_encoder("onnx-fp16")
    assert "onnx-fp16" in str(error.value)
    for backend in BACKENDS:
        assert backend in str(error.value)


def test_scifact_ndcg_per_backend(beir_index, encoder, onnx_fp32, onnx_int8):
    """The torch-built index searched with each backend: queries encoded by the retriever in
    one batch, and (ONNX) one at a time, as a single search encodes them."""
    root, queries, qrels = beir_index("scifact")
    ndcg = {}
    for enc in (encoder, onnx_fp32, onnx_int8):
        retriever = Retriever.load(root, NO_CACHE, encoder=enc)
        try:
            ndcg[enc.encoder_id] = evaluate_run(qrels, retriever_run(retriever, queries))["ndcg@10"]
            if enc is not encoder:
                vectors = one_by_one(enc, list(queries.values()))
                run = retriever_run(retriever, queries, query_vectors=vectors)
                ndcg[enc.encoder_id + " single"] = evaluate_run(qrels, run)["ndcg@10"]
        finally:
            retriever.close()
    print("SciFact nDCG@10:", {k: round(v, 4) for k, v in ndcg.items()})
    torch_ndcg = ndcg.pop(encoder.encoder_id)
    for encoder_id, value in ndcg.items():
        tolerance = 0.001 if ":fp32:" in encoder_id else 0.005
        assert abs(value - torch_ndcg) <= tolerance, encoder_id


def test_overlapping_calls_share_the_cores(onnx_int8, scifact_queries):
    """Alone, a call gets every intra-op thread; overlapping calls, and calls asking for
    ``single_thread``, run on one thread each; either way the vectors are the same."""
    texts = scifact_queries[:60]
    before = dict(onnx_int8.calls)
    sequential = one_by_one(onnx_int8, texts)
    assert onnx_int8.calls["every_core"] - before["every_core"] == len(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        concurrent = np.vstack(list(pool.map(lambda t: onnx_int8.encode([t]), texts)))
    assert onnx_int8.calls["one_thread"] > before["one_thread"]
    np.testing.assert_allclose(concurrent, sequential, atol=1e-5)
    middle = dict(onnx_int8.calls)
    narrow = np.vstack([onnx_int8.encode([t], single_thread=True) for t in texts])
    assert onnx_int8.calls["one_thread"] - middle["one_thread"] == len(texts)
    np.testing.assert_allclose(narrow, sequential, atol=1e-5)


def test_batches_bound_their_padding():
    from indexes.onnx_encoder import MAX_PADDING, _chunks

    lengths = np.random.default_rng(3).integers(5, 80, size=500)
    order = np.argsort(lengths, kind="stable")
    chunks = list(_chunks(order, lengths, 16, progress=False))
    np.testing.assert_array_equal(np.concatenate(chunks), order)
    for chunk in chunks:
        assert 1 <= chunk.size <= 16
        assert lengths[chunk].max() <= MAX_PADDING * lengths[chunk].min()


def test_batching_gives_an_onnx_encoder_one_single_thread_worker_per_core(onnx_int8):
    from retrieval.request_path.batching import BatchingConfig, EncodeBatcher

    batcher = EncodeBatcher(onnx_int8, BatchingConfig(enabled=True))
    try:
        cores = len(os.sched_getaffinity(0))
        assert batcher.stats()["workers"] == min(64, cores)
        before = onnx_int8.calls["one_thread"]
        vector, _ = batcher.submit("stem cells").result(timeout=60)
        # With one worker per core, a batch must not spread over every core.
        assert onnx_int8.calls["one_thread"] == before + (1 if cores > 1 else 0)
        np.testing.assert_allclose(vector, onnx_int8.encode(["stem cells"])[0], atol=1e-5)
    finally:
        batcher.close()


def retrained_copy(source: Path, target: Path) -> Path:
    """The model's files in ``target``, its weights file changed in its last byte (a model
    retrained and saved in place looks the same from outside: same name, same config)."""
    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    return target


def test_the_packaged_weights_keep_their_name_wherever_they_lie(encoder, tmp_path):
    copy = shutil.copytree(encoder.model_path, tmp_path / "my-model")
    assert model_name(Path(copy)) == "all-MiniLM-L6-v2"


def test_retrained_weights_get_another_encoder_id(encoder, build_subset, dataset, tmp_path):
    retrained = retrained_copy(encoder.model_path, tmp_path / "all-MiniLM-L6-v2")
    name = model_name(retrained)
    assert name == f"all-MiniLM-L6-v2@{weights_digest(retrained)}"
    other = SentenceTransformerEncoder(retrained)
    assert other.encoder_id == f"{name}:torch:fp32:384" != encoder.encoder_id
    assert not compatible_query_encoder(other.encoder_id, encoder.encoder_id)
    build_subset(list(itertools.islice(read_corpus(dataset("scifact")), 20)), tmp_path / "root")
    with pytest.raises(EncoderMismatchError, match="does not match the index"):
        Retriever.load(tmp_path / "root", NO_CACHE, encoder=other)


def test_an_index_named_before_weight_digests_still_loads_and_subfolder_weights_count(
        tmp_path):
    """An index written before model names carried their weights' digest names its model by
    directory alone: the same model's queries may still search it. A model whose weights sit
    in a module's folder (``0_Transformer/``) or in shards has a digest too (it was refused)."""
    assert compatible_query_encoder("my-model@0123456789ab:onnx-int8:int8:384",
                                    "my-model:torch:fp32:384")
    assert not compatible_query_encoder("my-model@0123456789ab:torch:fp32:384",
                                        "my-model@ba9876543210:torch:fp32:384")
    assert not compatible_query_encoder("other@0123456789ab:torch:fp32:384",
                                        "my-model:torch:fp32:384")
    # the packaged model's name never had a digest: other weights under it are other weights
    assert not compatible_query_encoder("all-MiniLM-L6-v2@0123456789ab:torch:fp32:384",
                                        "all-MiniLM-L6-v2:torch:fp32:384")
    model = tmp_path / "nested-model"
    (model / "0_Transformer").mkdir(parents=True)
    (model / "0_Transformer" / "model-00001-of-00002.safetensors").write_bytes(b"one")
    (model / "0_Transformer" / "model-00002-of-00002.safetensors").write_bytes(b"two")
    first = model_name(model)
    assert first.startswith("nested-model@")
    (model / "0_Transformer" / "model-00002-of-00002.safetensors").write_bytes(b"second")
    assert model_name(model) != first
