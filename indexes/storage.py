"""File helpers for artifacts: numpy arrays and JSON, never pickle; failures name the file."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from indexes.errors import CorruptArtifactError, MissingArtifactError

# numpy parses .npy headers with ast.literal_eval, and CPython 3.11 can fail that with
# "SystemError: AST constructor recursion depth mismatch" when several threads parse at once
# (seen when reader threads opened a new feature snapshot together). Loads are rare: serialize.
_NPY_LOAD_LOCK = threading.Lock()


def np_load(path: Path, mmap: bool = True) -> np.ndarray:
    """``np.load`` without pickle, memory-mapped when ``mmap``, safe to call from threads."""
    with _NPY_LOAD_LOCK:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def save_array(path: Path, array: np.ndarray) -> None:
    np.save(path, np.ascontiguousarray(array), allow_pickle=False)


def load_array(path: Path, mmap: bool = True) -> np.ndarray:
    """Load a ``.npy`` file, memory-mapped when ``mmap``; typed errors name the file."""
    if not path.is_file():
        raise MissingArtifactError(f"missing index file {path}; rebuild the index", path)
    try:
        return np_load(path, mmap)
    except (ValueError, OSError, EOFError) as exc:
        raise CorruptArtifactError(f"cannot read {path}: {exc}; rebuild the index", path) from exc


def write_json(path: Path, payload: Any) -> None:
    path.write_text(json.dumps(payload, ensure_ascii=False, sort_keys=True), encoding="utf-8")


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise MissingArtifactError(f"missing index file {path}; rebuild the index", path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptArtifactError(f"{path} is not valid JSON: {exc}", path) from exc


def fsync_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def mint_id(at: float | None = None) -> str:
    """A sortable, unique id for something published (a build): its UTC time to the
    microsecond, then 24 random bits, e.g. ``20261201T001500123456Z-9f3a1c``."""
    at = time.time() if at is None else at
    seconds = int(at)
    micros = int(round((at - seconds) * 1e6)) % 1_000_000
    return (f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(seconds))}{micros:06d}Z-"
            f"{secrets.token_hex(3)}")


def fsync_path(path: Path) -> None:
    """Make a file's bytes durable, or (of a directory) a rename or a new entry in it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tree_size(directory: Path) -> int:
    """Bytes of every file under ``directory`` (a build's size on disk)."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def sync_tree(directory: Path) -> None:
    """fsync every file and folder under ``directory``, and ``directory``, on every core (each
    fsync waits on the disk). A build renamed into place and published after this survives a
    power loss whole: without it, ``CURRENT`` could name files whose pages never reached disk."""
    paths = [*directory.rglob("*"), directory]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(fsync_path, paths))
