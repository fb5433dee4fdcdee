"""The query encoder a retriever uses: the one its build names, checked against the build."""

from __future__ import annotations

from pathlib import Path

from indexes.distilled_encoder import META, SHIPPED, DistilledEncoder
from indexes.encoders import (
    DEFAULT_MODEL,
    Encoder,
    SentenceTransformerEncoder,
    compatible_query_encoder,
)
from indexes.errors import EncoderMismatchError
from retrieval.config import RetrieverConfig
from retrieval.loaded_build import LoadedBuild

DISTILLED_DIR = "distilled"  # ROOT/distilled: what `retrieval distill ROOT` trains


def default_encoder(snapshot: LoadedBuild, config: RetrieverConfig,
                    root: Path | None = None) -> Encoder | None:
    """The encoder the build names; None for builds from precomputed (external) vectors."""
    info = snapshot.manifest.encoder
    if config.encoder_model_path is None and info.model != DEFAULT_MODEL:
        return None
    if config.encoder_backend == "torch":
        return SentenceTransformerEncoder(config.encoder_model_path)
    if config.encoder_backend == "distilled":
        return DistilledEncoder.load(distilled_dir(config, root))
    from indexes.onnx_encoder import make_encoder

    return make_encoder(config.encoder_backend, config.encoder_model_path)


def distilled_dir(config: RetrieverConfig, root: Path | None) -> Path:
    """The configured distilled encoder, else the index root's own, else the shipped one."""
    if config.distilled_encoder_path is not None:
        return Path(config.distilled_encoder_path)
    # ``root`` is an index root, or one of its build directories (ROOT/builds/<id>).
    homes = [] if root is None else [root] + (
        [root.parent.parent] if root.parent.name == "builds" else [])
    for home in homes:
        if (home / DISTILLED_DIR / META).is_file():
            return home / DISTILLED_DIR
    return SHIPPED


def check_encoder(encoder: Encoder, snapshot: LoadedBuild) -> None:
    expected = snapshot.manifest.encoder
    compatible = compatible_query_encoder(encoder.encoder_id, expected.encoder_id)
    if not compatible or encoder.dim != expected.dim:
        raise EncoderMismatchError(
            f"query encoder {encoder.encoder_id!r} does not match the index's "
            f"{expected.encoder_id!r}; load the retriever with the encoder the index was built "
            "with (or a declared compatible backend of the same model), or rebuild the index"
        )
