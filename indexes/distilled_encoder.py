"""A static query encoder distilled from all-MiniLM-L6-v2, landing in MiniLM's own vector space.

A query's vector is the normalized sum of one learned row per WordPiece token, [CLS] and [SEP]
included (their rows play the part of a bias): no attention, no matrix product per layer, so a
query costs its tokenization and a gather. The rows start as the teacher's embedding of each
token alone and are trained (``indexes.distill``) to reproduce the teacher's embeddings of
query-like texts, so documents keep their MiniLM vectors and only the query side changes.

On disk an encoder is a directory: ``table.npy`` (int8 rows), ``scales.npy`` (one float32 scale
per row) and ``encoder.json`` (what it was distilled from, the checksum of the two arrays, how
it was trained, its measured quality). Per-row int8 keeps every row's cosine to its float32
original at 0.9999 or better at a quarter of the size. ``encoder_id`` carries the checksum, so
two tables never share an embedding-cache entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from indexes.encoders import DEFAULT_MODEL, default_model_path, model_name
from indexes.errors import RetrievalError
from indexes.storage import fsync_path

FORMAT = 1
TABLE, SCALES, META = "table.npy", "scales.npy", "encoder.json"
BACKEND = "distilled"
# The generic encoder, trained on the three collections the repository ships (examples/data).
SHIPPED = Path(__file__).parent / "distilled" / DEFAULT_MODEL


class DistilledEncoderError(RetrievalError):
    """A distilled encoder directory is missing, damaged, or of another format."""


class DistilledInfo(BaseModel):
    """``encoder.json``: provenance, checksum, training settings and measured quality."""

    model_config = ConfigDict(extra="forbid")

    format: int = FORMAT
    model: str = Field(description="the teacher whose vector space the rows live in")
    teacher_id: str = Field(description="encoder id of the teacher that made the targets")
    dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    checksum: str = Field(description="sha256 of table.npy then scales.npy")
    trained_on: str = Field(description="what the query-like training texts were cut from")
    training: dict[str, Any] = Field(default_factory=dict, description="seed and settings")
    quality: dict[str, Any] = Field(default_factory=dict, description="measured at training")


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float (V, d) -> symmetric per-row int8 and float32 scales (a zero row keeps scale 1)."""
    peak = np.abs(table).max(axis=1)
    scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
    rows = np.rint(table / scales[:, None]).clip(-127, 127).astype(np.int8)
    return rows, scales


def table_checksum(rows: np.ndarray, scales: np.ndarray) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(rows).tobytes())
    digest.update(np.ascontiguousarray(scales).tobytes())
    return digest.hexdigest()


class DistilledEncoder:
    """Static token-sum query encoder (see the module doc); thread-safe, one core per call."""

    backend = BACKEND
    threads = 1  # a gather and a sum: nothing to spread over cores

    def __init__(self, rows: np.ndarray, scales: np.ndarray, info: DistilledInfo,
                 model_dir: Path | None = None) -> None:
        from indexes.onnx_encoder import load_tokenizer, lowercases

        check_arrays(rows, scales, info)
        path = model_dir or default_model_path()
        check_model(path, info)
        self._tokenizer = load_tokenizer(path)
        if self._tokenizer.get_vocab_size() != info.vocab_size:
            # a token id past the table fails at query time; one within it reads another row
            raise DistilledEncoderError(
                f"the table has {info.vocab_size} rows but {path}'s tokenizer has "
                f"{self._tokenizer.get_vocab_size()} tokens: train the encoder again")
        self.rows, self.scales, self.info = rows, scales.astype(np.float32), info
        self._lowercase = lowercases(path)
        self.model, self.dim = info.model, info.dim
        self.encoder_id = f"{info.model}:{BACKEND}:{info.checksum[:12]}:{info.dim}"

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        texts = [t.lower() for t in texts] if self._lowercase else list(texts)
        if len(texts) == 1:
            return [self._tokenizer.encode(texts[0]).ids]
        return [e.ids for e in self._tokenizer.encode_batch(texts)]

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False,
               single_thread: bool = False) -> np.ndarray:
        """``texts`` -> float32 (n, dim) unit rows; ``batch_size``/``single_thread`` are
        accepted for the encoder protocol and change nothing here."""
        ids = self.token_ids(texts)
        return self.vectors(ids)

    def vectors(self, ids: list[list[int]]) -> np.ndarray:
        if not ids:
            return np.empty((0, self.dim), dtype=np.float32)
        flat = np.fromiter((i for row in ids for i in row), dtype=np.int64)
        starts = np.cumsum([0] + [len(row) for row in ids[:-1]])
        gathered = self.rows[flat].astype(np.float32) * self.scales[flat, None]
        sums = np.add.reduceat(gathered, starts, axis=0)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        return (sums / np.maximum(norms, 1e-12)).astype(np.float32)

    # -- files ---------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write the three files (arrays first, the JSON that vouches for them last)."""
        return save_table(self.rows, self.scales, self.info, directory)

    @classmethod
    def load(cls, directory: str | Path, *, verify: bool = True,
             model_dir: str | Path | None = None) -> DistilledEncoder:
        """Read a saved encoder; the checksum is verified unless ``verify=False``.

        ``model_dir``: the teacher's model directory, whose tokenizer makes the token ids
        (default: the shipped all-MiniLM-L6-v2); it must be the model ``encoder.json`` names.
        """
        folder = Path(directory)
        meta = folder / META
        if not meta.is_file():
            raise DistilledEncoderError(
                f"{folder} holds no distilled encoder ({META} missing); train one with "
                "`retrieval distill ROOT` or pass the directory of a trained one")
        try:
            info = DistilledInfo.model_validate_json(meta.read_text())
        except ValueError as exc:
            raise DistilledEncoderError(f"{meta} is not a distilled encoder's {META}: {exc}"
                                        ) from exc
        if info.format != FORMAT:
            raise DistilledEncoderError(f"{folder} has format {info.format}, this version reads "
                                        f"{FORMAT}: train the encoder again")
        rows, scales = load_array(folder / TABLE), load_array(folder / SCALES)
        if verify and table_checksum(rows, scales) != info.checksum:
            raise DistilledEncoderError(f"{folder}: the table does not match the checksum in "
                                        f"{META}; the files are damaged: train it again")
        return cls(rows, scales, info, Path(model_dir) if model_dir else None)


def load_array(path: Path) -> np.ndarray:
    """One of an encoder's arrays; a missing, truncated or foreign file is refused."""
    try:
        array = np.load(path)
    except FileNotFoundError:
        raise DistilledEncoderError(f"{path} is missing: the directory holds only part of a "
                                    "distilled encoder; train it again") from None
    except (OSError, ValueError, EOFError) as exc:  # np.load's errors for a damaged file
        raise DistilledEncoderError(f"{path} is not a readable numpy array ({exc}); the file "
                                    "is damaged: train the encoder again") from exc
    if not isinstance(array, np.ndarray):  # an .npz archive under the .npy name
        raise DistilledEncoderError(f"{path} is not a single numpy array: train the encoder "
                                    "again")
    return array


def check_arrays(rows: np.ndarray, scales: np.ndarray, info: DistilledInfo) -> None:
    """The table and scales are what ``encoder.json`` describes, and every scale a positive
    number: a NaN or infinite one would turn the vector of any query holding its token into
    NaN, which no search can rank by."""
    if rows.dtype != np.int8 or rows.shape != (info.vocab_size, info.dim):
        raise DistilledEncoderError(
            f"table is {rows.dtype}{rows.shape}, encoder.json says int8"
            f"({info.vocab_size}, {info.dim}); the directory is damaged: train it again")
    if scales.shape != (info.vocab_size,):
        raise DistilledEncoderError(f"scales have shape {scales.shape}, expected "
                                    f"({info.vocab_size},): train the encoder again")
    if scales.dtype.kind != "f" or not (np.isfinite(scales) & (scales > 0)).all():
        raise DistilledEncoderError(f"scales must be positive finite floats ({scales.dtype} "
                                    "given, or some NaN, infinite or not above 0): train the "
                                    "encoder again")


def check_model(model_dir: Path, info: DistilledInfo) -> None:
    """The rows are indexed by the teacher's token ids: another model's tokenizer would give
    each query the wrong rows, and its vectors would still pass for ``info.model``'s."""
    tokenizing = model_name(model_dir)
    if tokenizing != info.model:
        raise DistilledEncoderError(
            f"the encoder was distilled from {info.model!r}, but {model_dir} holds "
            f"{tokenizing!r}, whose token ids would pick the wrong rows: load it with "
            "model_dir= the teacher's model directory")


def save_table(rows: np.ndarray, scales: np.ndarray, info: DistilledInfo,
               directory: str | Path) -> Path:
    """Write the three files over any encoder already in ``directory`` without destroying it
    when the save fails: each file is written whole to a temporary file beside it first, and
    only then are they renamed into place, the JSON that vouches for the arrays last. A save
    that fails while writing leaves the previous files untouched (and no temporary ones); a
    crash or a failure between the renames leaves each file old or new, and the checksum
    refuses the mix (then only a new save or distillation restores an encoder there).
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    writers: list[tuple[str, Callable[[BinaryIO], object]]] = [
        (TABLE, lambda out: np.save(out, rows, allow_pickle=False)),
        (SCALES, lambda out: np.save(out, scales, allow_pickle=False)),
        (META, lambda out: out.write(
            (json.dumps(info.model_dump(), indent=1) + "\n").encode())),
    ]
    staged: list[Path] = []  # the temporary files this save made: renamed, else removed
    try:
        for name, write in writers:
            # A name of its own, created exclusively: two saves into one folder never share
            # one (and unlike mkstemp's, the file gets the umask's mode, as np.save gave it).
            partial = folder / f".{name}.{secrets.token_hex(8)}.tmp"
            with open(partial, "xb") as out:
                staged.append(partial)
                write(out)
                out.flush()
                os.fsync(out.fileno())  # on disk before the rename can make it the file
        for (name, _), partial in zip(writers, staged, strict=True):
            os.replace(partial, folder / name)
    finally:
        for partial in staged:
            partial.unlink(missing_ok=True)
    fsync_path(folder)  # the renames survive a power loss
    return folder

