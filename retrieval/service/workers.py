"""Worker processes forked from one parent that has already imported the serving stack.

uvicorn's own ``--workers`` spawns fresh interpreters, so every worker re-imports numpy, numba
(with LLVM), faiss, pyarrow and onnxruntime into private memory: about 160 MB each, measured.
Here the parent imports them once, binds the socket, then forks: the workers share those
pages copy-on-write, and each still loads its own retriever (its threads, its encoder session
and its memory map of the build) after the fork, where threads are safe to start.

The parent's objects are frozen out of the garbage collector before the fork (``gc.freeze``,
as Python's documentation advises for fork without exec): a full collection in a worker
otherwise writes to the header of every object it traverses, which copies every page the
parent's imports filled, and each worker's private memory grows by tens of MB under its first
busy minutes (measured in benchmarks/README.md).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from indexes.cpu import share_cores

log = logging.getLogger("retrieval.service")
RESTART_PAUSE_SECONDS = 1.0
# A worker that fails this soon after its start never served: so many in a row (a TLS file
# or a build every worker fails on) stop the service instead of restarting them forever.
FAILED_START_SECONDS = 10.0
FAILED_STARTS = 3


def preload(index_root: Path) -> None:
    """Import what every worker needs and load the BM25 kernels' code, so the workers share
    it (no threads may be running when the parent forks).

    onnxruntime and tokenizers are imported lazily by the encoder; imported here, their ~27 MB
    are shared by the workers instead of being private to each; the kernels' ~55 MB likewise.
    """
    import onnxruntime  # noqa: F401
    import tokenizers  # noqa: F401

    import indexes.onnx_encoder  # noqa: F401
    import retrieval.service.app  # noqa: F401
    from retrieval.request_path.fusion import warm_fusion
    from retrieval.sharding.whole import open_build, warm_up_build

    # The workers verify the build when they load it; here only its arrays' types matter.
    warm_up_build(open_build(index_root, verify=False))
    warm_fusion()

    if threading.active_count() > 1:
        log.warning("threads running before fork: %s", threading.enumerate())


def run_forked_workers(config: Any, workers: int, index_root: Path) -> int:
    """Serve ``config`` (a ``uvicorn.Config``) with ``workers`` forked processes; the exit
    code (0, or 3 when workers kept failing as they started).

    SIGTERM / SIGINT are forwarded to every worker (each drains, see ``state``); the parent
    returns once all have exited. A worker that dies unexpectedly is replaced, unless
    ``FAILED_STARTS`` in a row died within ``FAILED_START_SECONDS`` of their start.
    """
    import uvicorn

    gc.disable()  # no collections while importing: freed holes would sit in shared pages
    preload(index_root)
    sock = config.bind_socket()
    children: dict[int, float] = {}  # pid -> when it started
    stopping = threading.Event()
    failed_starts = 0

    def spawn() -> None:
        gc.freeze()
        pid = os.fork()
        if pid == 0:  # the worker
            gc.enable()
            # uvicorn re-raises the signal after its graceful shutdown: make that a no-op
            # here, not the parent's forwarding handler (which would signal the siblings).
            signal.signal(signal.SIGTERM, lambda signum, frame: None)
            signal.signal(signal.SIGINT, lambda signum, frame: None)
            share_cores(workers)  # before the app loads its retriever and sizes its threads
            code = 0
            try:
                uvicorn.Server(config).run(sockets=[sock])
            except BaseException:  # noqa: BLE001 (logged; the parent sees the exit code)
                log.exception("worker failed")
                code = 3
            os._exit(code)
        children[pid] = time.monotonic()

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        for pid in list(children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    for _ in range(workers):
        spawn()
    log.info("serving with %d forked workers: %s", workers, sorted(children))
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        started = children.pop(pid, 0.0)
        if stopping.is_set():
            continue
        early = status != 0 and time.monotonic() - started < FAILED_START_SECONDS
        failed_starts = failed_starts + 1 if early else 0
        if failed_starts >= FAILED_STARTS:
            log.error("%d workers in a row failed as they started (see their errors above): "
                      "stopping the service", failed_starts)
            forward(signal.SIGTERM, None)
            code = 3
            continue
        log.error("worker %d exited (status %d); starting a replacement", pid, status)
        # A stop during the pause: no replacement (the stop was sent to the others only).
        if not stopping.wait(RESTART_PAUSE_SECONDS):
            spawn()
    sock.close()
    return code
