"""A distilled query encoder for one index: trained on its live build's passages, stored beside
its builds (``ROOT/distilled``), where ``encoder_backend="distilled"`` finds it.

``indexes.distill`` does the training; this module picks the texts and, given judged queries,
measures what the encoder costs in ranking quality against the INT8 MiniLM encoder, over the
same index and document vectors, and stores those figures with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from indexes.distill import DistillSettings, distill
from indexes.distilled_encoder import DistilledEncoder
from indexes.encoders import DEFAULT_MODEL, Encoder
from indexes.errors import EncoderMismatchError
from indexes.manifest import read_manifest, resolve_build_dir
from retrieval.query_encoder import DISTILLED_DIR
from retrieval.sharding.whole import open_build

Qrels = Mapping[str, Mapping[str, int]]


def corpus_texts(root: str | Path) -> tuple[list[str], str]:
    """The live build's passage texts (every shard's) and a line saying what they are."""
    snapshot = open_build(root)
    texts = [doc.content for part in snapshot.local_builds()
             for doc in part.docs.get_many(range(len(part.docs)))]
    return texts, f"{Path(root).name}: build {snapshot.build_id}, {len(texts):,} passages"


def check_teacher(root: str | Path) -> None:
    """The distilled encoder learns the shipped model's query vectors: a build whose vectors
    are another model's could not be searched with them, so it is refused before training."""
    model = read_manifest(resolve_build_dir(Path(root))).encoder.model
    if model != DEFAULT_MODEL:
        raise EncoderMismatchError(
            f"the live build under {root} holds {model!r} vectors; a distilled query encoder "
            f"learns {DEFAULT_MODEL}'s, so it could not search this build: distill an index "
            f"built with {DEFAULT_MODEL}")


def distill_index(root: str | Path, settings: DistillSettings | None = None, *,
                  judged: tuple[str, Mapping[str, str], Qrels] | None = None,
                  log: Callable[[str], None] = print) -> tuple[DistilledEncoder, Path]:
    """Train on ``root``'s passages, measure on ``judged`` (name, queries, qrels) when given,
    and save to ``ROOT/distilled``."""
    check_teacher(root)
    texts, trained_on = corpus_texts(root)
    log(f"distilling a query encoder from {trained_on}")
    encoder = distill(texts, trained_on, settings, log=log)
    if judged is not None:
        name, queries, qrels = judged
        encoder.info.quality["judged"] = {name: judged_quality(root, encoder, queries, qrels)}
    return encoder, encoder.save(Path(root) / DISTILLED_DIR)


def judged_quality(root: str | Path, distilled: Encoder, queries: Mapping[str, str],
                   qrels: Qrels, reference: Encoder | None = None) -> dict[str, Any]:
    """nDCG@10 and recall@100 of the default retriever on the judged queries with each
    encoder's query vectors (needs ranx, the ``dev`` extra)."""
    from indexes.onnx_encoder import OnnxEncoder
    from retrieval.retriever import Retriever

    reference = reference or OnnxEncoder(quantized=True)
    judged = {q: text for q, text in queries.items() if q in qrels}
    qrels = {q: qrels[q] for q in judged}
    figures: dict[str, Any] = {"queries": len(judged)}
    with Retriever.load(root, {"cache": {"backend": "none"}}, encoder=reference) as retriever:
        for name, encoder in (("reference", reference), ("distilled", distilled)):
            vectors = encoder.encode(list(judged.values()))
            results = retriever.search_batch(list(judged.values()), k=100, query_vectors=vectors)
            run = {q: {h.doc_id: h.score for h in r.hits}
                   for q, r in zip(judged, results, strict=True)}
            figures[name] = {"encoder": encoder.encoder_id, **ranked_quality(qrels, run)}
    return figures


def ranked_quality(qrels: Qrels, run: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    from ranx import Qrels as RanxQrels
    from ranx import Run, evaluate

    full = {q: dict(run.get(q, {})) for q in qrels}
    scores = evaluate(RanxQrels({q: dict(v) for q, v in qrels.items()}), Run(full),
                      ["ndcg@10", "recall@100"], make_comparable=True)
    return {name: round(float(value), 4) for name, value in scores.items()}
