"""A dense leg built and calibrated in memory (``indexes.ann.make_dense``), written when the
build's other files are, and the thread that builds one beside the rest of a build.

faiss releases the GIL, so the dense leg (IVF lists trained, filled and calibrated: a matrix
product of every vector against every list) runs on one core while the analysis, BM25 and the
writers run in Python on the other. In its thread faiss keeps to one OpenMP thread
(``omp_set_num_threads`` sets the calling thread's own count) until the build waits for the
leg, so the two sides do not fight over the cores: with faiss on both, an earlier try gained
nothing. At 1M passages, vectors
given, one analysis worker on two cores, the whole build took 39.5 s beside against 55.2 s one
after the other, with 645 MiB more at its peak (benchmarks/README.md, "The dense leg built
beside the keyword side").
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexes.cpu import usable_cores
from indexes.storage import write_json

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class BuiltDense:
    """``ann.json``'s content and the faiss index it names (``file`` under ``ann/``; no index
    when the dense leg is exact search)."""

    meta: dict[str, Any]
    index: Any = None
    file: str = ""

    def save(self, directory: Path) -> dict[str, Any]:
        """Write the index, then ``ann.json``, under ``directory``; returns the meta."""
        import faiss

        directory.mkdir(parents=True, exist_ok=True)
        if self.index is not None:
            faiss.write_index(self.index, str(directory / self.file))
        write_json(directory / "ann.json", self.meta)
        return self.meta


def exact_fallback_of(n: int, reason: str, calibration: Any) -> BuiltDense:
    """The exact scan as the dense leg, ``ann.json`` saying why the index built for it was
    not kept (its calibration ladder beside the reason)."""
    log.info("dense leg of %d vectors: %s", n, reason)
    return BuiltDense({"kind": "exact", "n_docs": n, "fallback": reason,
                       "calibration": calibration})


DenseBuild = Callable[[], BuiltDense]
# Called by a dense leg's build between its stages and its chunks of rows: sets the calling
# thread's faiss thread count to what the leg may use now.
Rebalance = Callable[[], None]


def stay() -> None:
    """The ``Rebalance`` of a leg built alone: its thread count is the caller's."""


def dense_beside(matrix: np.ndarray, build: Callable[[np.ndarray, Rebalance], BuiltDense]
                 ) -> DenseBuild:
    """``build(matrix, rebalance)`` started now in a thread of its own when this process has
    two cores or more; the function returned waits for it and gives the built leg, raising
    what it raised. faiss keeps to one OpenMP thread there while the rest of the build works,
    and ``rebalance`` gives it every usable core once the build waits for the leg: at 1M
    passages on a CPU without VNNI, where faiss fills the lists and the leg outlasts the
    rest, the builds took 50.7 and 44.2 s against 52.6 and 55.4 (paired). (An HNSW leg keeps
    to one thread.) On one core it builds when asked, in the caller's thread. A build that
    fails before asking leaves the thread to finish on its own (with ``finer_switching``)."""
    if usable_cores() < 2:
        return lambda: build(matrix, stay)
    waited = threading.Event()
    pool = ThreadPoolExecutor(1, thread_name_prefix="dense-leg")
    future = pool.submit(_on_one_thread, build, matrix, waited)
    pool.shutdown(wait=False)

    def wait() -> BuiltDense:
        waited.set()
        return future.result()

    return wait


def _on_one_thread(build: Callable[[np.ndarray, Rebalance], BuiltDense], matrix: np.ndarray,
                   waited: threading.Event) -> BuiltDense:
    import faiss

    def rebalance() -> None:
        # This thread's own count: the build's other side keeps a core until it waits.
        faiss.omp_set_num_threads(usable_cores() if waited.is_set() else 1)

    rebalance()
    with finer_switching():
        return build(matrix, rebalance)


# The interpreter's switch interval while a dense leg is built beside the rest of a build.
SWITCH_INTERVAL_S = 0.0005
_switching = threading.Lock()
_legs_switching = 0
_interval_before = 0.0


@contextmanager
def finer_switching() -> Iterator[None]:
    """The interpreter's switch interval at ``SWITCH_INTERVAL_S`` for the block (the last of
    overlapping blocks puts the one before back).

    faiss' long loops (k-means rounds, blocks of a flat search) ask Python whether Ctrl-C was
    pressed, taking the GIL for each ask, and the leg's own Python between faiss calls needs
    it too. Beside a thread running Python each of those waited out that thread's switch
    interval (5 ms by default): training 1,334 lists on 53,360 vectors took 2.9-3.4 s beside
    a Python loop at 5 ms against 2.0 s at 0.5 ms (the host loaded; 1.0 s alone). Turning
    the asks off (faiss' ``InterruptCallback.clear_instance``) was faster still, but faiss
    deletes its one callback without its lock: a search in another thread, serving while a
    compaction builds, could call the deleted callback."""
    global _legs_switching, _interval_before
    with _switching:
        if _legs_switching == 0:
            _interval_before = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        _legs_switching += 1
    try:
        yield
    finally:
        with _switching:
            _legs_switching -= 1
            if _legs_switching == 0:
                sys.setswitchinterval(_interval_before)
