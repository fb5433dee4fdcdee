"""The dense leg built beside the rest of a build (``indexes.ann_built.dense_beside``): in a
thread of its own on one OpenMP thread, its failures raised to the build, and the files it
writes the same, byte for byte, as a dense leg built alone."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from indexes.ann import ANN_DIR, make_dense
from indexes.ann_built import BuiltDense, Rebalance, dense_beside
from indexes.build import BuildConfig, build_index
from indexes.cpu import usable_cores
from indexes.docstore import Document
from indexes.errors import CorpusError
from indexes.manifest import EncoderInfo


def where_it_ran(matrix: np.ndarray, rebalance: Rebalance) -> BuiltDense:
    """A build that says which thread ran it and with how many OpenMP threads."""
    import faiss

    return BuiltDense({"thread": threading.current_thread().name,
                       "openmp_threads": faiss.omp_get_max_threads()})


def test_it_builds_in_a_thread_of_its_own_with_faiss_on_one_thread():
    import faiss

    callers = faiss.omp_get_max_threads()
    meta = dense_beside(np.zeros((2, 4), np.float32), where_it_ran)().meta
    if usable_cores() >= 2:
        assert meta["thread"].startswith("dense-leg") and meta["openmp_threads"] == 1
    else:  # one core: nothing to run beside, the caller builds when it asks
        assert meta["thread"] == threading.current_thread().name
    assert faiss.omp_get_max_threads() == callers  # the caller's own count is untouched


def test_the_leg_takes_every_core_once_the_build_waits_for_it():
    """One OpenMP thread while the rest of the build works; ``rebalance`` gives the leg every
    usable core once the build asks for it (on one core the caller builds it, as it is)."""
    import faiss

    working = threading.Event()
    counts: list[int] = []

    def build(matrix: np.ndarray, rebalance: Rebalance) -> BuiltDense:
        rebalance()
        counts.append(faiss.omp_get_max_threads())
        working.set()
        for _ in range(1000 if usable_cores() >= 2 else 0):  # until the build waits (<= 10 s)
            rebalance()
            if faiss.omp_get_max_threads() > 1:
                break
            time.sleep(0.01)
        counts.append(faiss.omp_get_max_threads())
        return BuiltDense({})

    wait = dense_beside(np.zeros((2, 4), np.float32), build)
    if usable_cores() < 2:
        wait()
        assert counts == [faiss.omp_get_max_threads()] * 2
        return
    assert working.wait(10)
    assert counts == [1]  # the build has not asked yet
    wait()
    assert counts == [1, usable_cores()]


def test_what_the_thread_raised_reaches_the_caller():
    def failing(matrix: np.ndarray, rebalance: Rebalance) -> BuiltDense:
        raise CorpusError(f"no dense leg for {len(matrix)} rows")

    wait = dense_beside(np.zeros((3, 4), np.float32), failing)
    with pytest.raises(CorpusError, match="no dense leg for 3 rows"):
        wait()


def test_a_build_writes_the_dense_leg_it_built_beside_as_one_built_alone(tmp_path):
    """Vectors given: the build starts the dense leg before its analysis; the lists, their
    codes and the calibration it writes equal those of the same leg built on its own, with
    faiss on every core."""
    from benchmarks.synthetic import clustered_unit_vectors

    matrix = clustered_unit_vectors(6_000, 64, seed=5)
    docs = [Document(id=f"d{i}", text=f"passage {i} about topic {i % 17}")
            for i in range(len(matrix))]
    info = EncoderInfo(encoder_id="given", model="given", dim=64, vector_dtype="float32")
    report = build_index(docs, tmp_path / "index", vectors=matrix, encoder_info=info,
                         progress=False, config=BuildConfig())
    alone = make_dense(matrix).save(tmp_path / "alone")
    assert alone["kind"] == "ivf"
    built = report.path / ANN_DIR
    assert (built / "ann.json").read_bytes() == (tmp_path / "alone" / "ann.json").read_bytes()
    assert (built / "ivf.faiss").read_bytes() == (tmp_path / "alone" / "ivf.faiss").read_bytes()
