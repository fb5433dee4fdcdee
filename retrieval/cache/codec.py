"""Value encodings for cached embeddings (binary) and results (JSON). Never pickle.

Embedding layout (little-endian)::

    offset 0  4s  magic b"RQEM"
    offset 4  B   format version (2)
    offset 5  B   dtype code (1 = float32)
    offset 6  H   reserved, 0
    offset 8  I   dim (uint32)
    offset 12 I   crc32 of bytes 0-11 and the vector's bytes
    offset 16     dim * 4 bytes of float32

Decoders treat anything foreign, truncated, corrupt or of the wrong shape as a miss (None):
a shared Redis may hold values written by other versions or other programs. The checksum
catches damaged bytes, which nothing else would: any float32 pattern but NaN and infinity is
a vector, and one flipped bit of version 1 (no checksum) decoded as a hit that re-ranked the
search. Version 1 values read as misses.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from retrieval.cache.base import CacheError

MAGIC = b"RQEM"
VERSION = 2
DTYPE_FLOAT32 = 1
FIELDS = struct.Struct("<4sBBHI")  # what the checksum covers, with the vector
HEADER = struct.Struct("<4sBBHII")  # the fields, then the crc32
_FLOAT32_LE = np.dtype("<f4")


class CacheValueError(CacheError, ValueError):
    """A value cannot be encoded for the cache (wrong shape or non-finite numbers)."""


def encode_embedding(vector: Any) -> bytes:
    """Header + raw little-endian float32 of a finite 1-D vector."""
    array = np.asarray(vector, dtype=_FLOAT32_LE)
    if array.ndim != 1 or array.size == 0:
        raise CacheValueError(f"embedding must be a non-empty 1-D vector, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise CacheValueError("embedding contains NaN or infinity; refusing to cache it")
    fields = FIELDS.pack(MAGIC, VERSION, DTYPE_FLOAT32, 0, array.size)
    body = np.ascontiguousarray(array).tobytes()
    return fields + struct.pack("<I", zlib.crc32(body, zlib.crc32(fields))) + body


def decode_embedding(blob: Any, expected_dim: int) -> np.ndarray | None:
    """A writable float32 vector of ``expected_dim``, or None for anything else; never raises."""
    try:
        return _decode_embedding(blob, expected_dim)
    except Exception:  # foreign bytes must never break a request
        return None


def _decode_embedding(blob: Any, expected_dim: int) -> np.ndarray | None:
    if not isinstance(blob, bytes | bytearray | memoryview):
        return None
    data = bytes(blob)
    if len(data) < HEADER.size:
        return None
    magic, version, dtype, reserved, dim, crc = HEADER.unpack_from(data)
    if (magic, version, dtype, reserved) != (MAGIC, VERSION, DTYPE_FLOAT32, 0):
        return None
    if dim < 1 or dim != expected_dim or len(data) != HEADER.size + 4 * dim:
        return None
    body = data[HEADER.size:]
    if zlib.crc32(body, zlib.crc32(data[:FIELDS.size])) != crc:
        return None
    vector = np.frombuffer(body, dtype=_FLOAT32_LE).astype(np.float32)
    if not np.isfinite(vector).all():
        return None
    return vector


def encode_json(payload: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON for a result object (NaN/infinity rejected: not valid JSON)."""
    if not isinstance(payload, dict):
        raise CacheValueError(f"cached results must be a JSON object, got {type(payload).__name__}")
    try:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CacheValueError(f"result is not JSON-serializable: {exc}") from exc
    return text.encode("utf-8")


def decode_json(blob: Any) -> dict[str, Any] | None:
    """The JSON object in ``blob``, or None for non-UTF-8, non-JSON or non-object; never raises."""
    try:
        if not isinstance(blob, bytes | bytearray | memoryview):
            return None
        value = json.loads(bytes(blob).decode("utf-8"), parse_constant=_reject_constant)
    except Exception:  # includes RecursionError from hostile nesting
        return None
    return value if isinstance(value, dict) else None


def _reject_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; a value holding them was not written by encode_json.
    raise ValueError(f"non-standard JSON constant {name}")
